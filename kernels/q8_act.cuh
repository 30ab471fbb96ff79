// Activations to 8 bits on the device, one 32-element block per warp: the
// bits of the CPU's quantize_row_q8_act (src/cpu/matmul.cpp). Shared by the
// quantizer of qmm.cu and the kernels that write a matmul's input and its
// 8-bit copy in one launch (rms_norm, swiglu).
#pragma once

#include "common.cuh"

namespace barata::cuda {

// Lane i of a whole warp holds element i of the block: amax across the warp
// (a NaN counts as 0), d = amax / 127, q = nearest-even of v / d clamped to
// +-127 (a NaN or Inf gives +-127). q[lane] and, from lane 0, *d_out.
__device__ __forceinline__ void quantize_block_q8(float v, unsigned lane, signed char* q,
                                                  float* d_out) {
  float amax = fmaxf(0.0f, fabsf(v));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = __fdiv_rn(amax, 127.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  const float qf = rintf(fmaxf(-127.0f, fminf(127.0f, __fmul_rn(v, id))));
  q[lane] = static_cast<signed char>(static_cast<int>(qf));
  if (lane == 0) *d_out = d;
}

}  // namespace barata::cuda
