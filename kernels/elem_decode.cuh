// One element of a row in its stored type, as fp32, from bytes of any
// alignment: the arithmetic of the embedding lookup (embed.cu), __host__
// __device__ so that tests compare it on the host, bit for bit, with the CPU
// reference dequantizers (tests/test_emu_kernels.cpp). The reference's
// operations in its order, never fused: Q8_0 q * d, Q4_0 d * (q - 8),
// Q4_1 d * q + m.
#pragma once

#include <cstdint>
#include <cstring>

#include "barata/dtype.h"
#include "barata/quant_blocks.h"
#include "common.cuh"

namespace barata::cuda {

__host__ __device__ __forceinline__ uint16_t load_u16(const unsigned char* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}

// IEEE operations without contraction on both sides (nvcc's host pass has no
// __fmul_rn; the host compiler runs with -ffp-contract=off in ISO mode).
__host__ __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
__host__ __device__ __forceinline__ float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
__host__ __device__ __forceinline__ float u32_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

template <DType T>
__host__ __device__ __forceinline__ float decode_element(const unsigned char* row, int64_t j) {
  if constexpr (T == DType::F32) {
    float v;
    memcpy(&v, row + 4 * j, 4);
    return v;
  } else if constexpr (T == DType::F16) {
    return fp16_bits_to_float(load_u16(row + 2 * j));
  } else if constexpr (T == DType::BF16) {
    return u32_as_float(static_cast<uint32_t>(load_u16(row + 2 * j)) << 16);
  } else if constexpr (T == DType::Q8_0) {
    const unsigned char* b = row + (j / kQK8_0) * sizeof(BlockQ8_0);
    const float d = fp16_bits_to_float(load_u16(b));
    const int8_t q = static_cast<int8_t>(b[2 + j % kQK8_0]);
    return mul_rn(static_cast<float>(q), d);
  } else if constexpr (T == DType::Q4_0) {
    const unsigned char* b = row + (j / kQK4_0) * sizeof(BlockQ4_0);
    const int e = static_cast<int>(j % kQK4_0);
    const float d = fp16_bits_to_float(load_u16(b));
    const int q = (b[2 + (e & 15)] >> (e >= 16 ? 4 : 0)) & 0xf;
    return mul_rn(d, static_cast<float>(q - 8));
  } else {
    static_assert(T == DType::Q4_1, "decode_element: F32, F16, BF16, Q8_0, Q4_0, Q4_1");
    const unsigned char* b = row + (j / kQK4_1) * sizeof(BlockQ4_1);
    const int e = static_cast<int>(j % kQK4_1);
    const float d = fp16_bits_to_float(load_u16(b));
    const float m = fp16_bits_to_float(load_u16(b + 2));
    const int q = (b[4 + (e & 15)] >> (e >= 16 ? 4 : 0)) & 0xf;
    return add_rn(mul_rn(d, static_cast<float>(q)), m);
  }
}

}  // namespace barata::cuda
