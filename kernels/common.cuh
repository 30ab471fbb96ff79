// Device helpers shared by every kernel file. Host code that calls the CUDA
// runtime wraps it in BARATA_CUDA_CHECK, so a failure reaches the CLI as one
// barata::Error line instead of a silent sticky error later on.
//
// Kernels are launched with BARATA_LAUNCH and take dynamic shared memory with
// BARATA_DYNAMIC_SMEM, so that the same source also runs under the host
// emulation (BARATA_CUDA_EMU, kernels/emu/cuda_emu.h) in CI.
#pragma once

#include <cstdint>
#include <string>

#ifdef BARATA_CUDA_EMU
#include "emu/cuda_emu.h"  // the host emulation (docs/cuda-emulation.md)
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include "barata/error.h"
#include "cuda_types.cuh"

namespace barata::cuda {

// One output of a matmul through its epilogue (cuda_types.cuh). __fadd_rn
// keeps the additions apart from the product: no FMA contraction, so the
// bits are those of the separate kernels.
__device__ __forceinline__ void store_out(float* y, int64_t at, int row, float v,
                                          const Epilogue& ep) {
  if (ep.bias) v = __fadd_rn(v, ep.bias[row]);
  if (ep.accumulate) v = __fadd_rn(y[at], v);
  y[at] = v;
}

// Plain string building rather than barata::fail: fmt's compile-time format
// checks are fragile under nvcc (fmt 9 turns its constexpr off for __NVCC__).
[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* expr, const char* file,
                                          int line) {
  throw Error(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " +
              cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + " from " + expr + ")");
}

// GGUF blocks keep fp16 scales as raw bits; widening them is one cvt
// instruction, exact, like barata::fp16_to_fp32 on the host.
__host__ __device__ __forceinline__ float fp16_bits_to_float(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

// One rounding, to nearest even: what barata::fp32_to_fp16 does on the host,
// so device and reference results compare bit for bit.
__host__ __device__ __forceinline__ __half float_to_half_rn(float x) {
  return __float2half_rn(x);
}

// Sum over the 32 lanes of a warp (every lane active), every lane gets it.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets it. scratch: 32 floats of shared memory, free again on return.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? scratch[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
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

#ifndef BARATA_CUDA_EMU
// kernel<<<grid, block, smem_bytes, stream>>>(args...). A template kernel
// whose name holds a comma goes in parentheses: BARATA_LAUNCH((k<A, B>), ...).
#define BARATA_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  kernel<<<grid, block, smem_bytes, stream>>>(__VA_ARGS__)
// The launch's dynamic shared memory as a T* named `name` (16-byte aligned).
#define BARATA_DYNAMIC_SMEM(T, name)                                    \
  extern __shared__ __align__(16) unsigned char barata_dynamic_smem_[]; \
  T* const name = reinterpret_cast<T*>(barata_dynamic_smem_)
#endif
