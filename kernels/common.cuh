// Device helpers shared by every kernel file. Host code that calls the CUDA
// runtime wraps it in BARATA_CUDA_CHECK, so a failure reaches the CLI as one
// barata::Error line instead of a silent sticky error later on.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "barata/error.h"

namespace barata::cuda {

// Plain string building rather than barata::fail: fmt's compile-time format
// checks are fragile under nvcc (fmt 9 turns its constexpr off for __NVCC__).
[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file,
                                          int line) {
  throw Error(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " +
              cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + " from " + expr + ")");
}

// GGUF blocks keep fp16 scales as raw bits; widening them is one cvt
// instruction, exact, like barata::fp16_to_fp32 on the host.
__device__ __forceinline__ float fp16_bits_to_float(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

// One rounding, to nearest even: what barata::fp32_to_fp16 does on the host,
// so device and reference results compare bit for bit.
__device__ __forceinline__ __half float_to_half_rn(float x) {
  return __float2half_rn(x);
}

inline unsigned ceil_div(int64_t a, int64_t b) {
  return static_cast<unsigned>((a + b - 1) / b);
}

}  // namespace barata::cuda

#define BARATA_CUDA_CHECK(expr)                                                      \
  do {                                                                               \
    const cudaError_t barata_cuda_err_ = (expr);                                     \
    if (barata_cuda_err_ != cudaSuccess)                                             \
      ::barata::cuda::throw_cuda_error(barata_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a launch: catches bad launch configurations at once (asynchronous
// faults inside the kernel surface at the next synchronising call instead).
#define BARATA_CUDA_CHECK_LAUNCH() BARATA_CUDA_CHECK(cudaGetLastError())
