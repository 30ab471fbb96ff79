// Element-wise ops of the forward pass on fp32 activations.
#pragma once

#include <cstdint>

#include "cuda_types.cuh"

namespace barata::cuda {

void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream);  // x += y
// y[r][c] += b[c] for r < n_rows, c < width.
void launch_add_bias(float* y, const float* b, int64_t n_rows, int64_t width, cudaStream_t stream);
// gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); with gelu:
// GeGLU, gate[i] = gelu(gate[i]) * up[i], GELU's tanh form.
void launch_swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream, bool gelu = false);
// The same, and gate's 8-bit copy (n a multiple of 32; rows of k values with
// k % 32 == 0 lie in whole blocks), the bits of launch_quantize_q8 on it.
void launch_swiglu_q8(float* gate, const float* up, int64_t n, const Q8Out& q8, cudaStream_t stream,
                      bool gelu = false);
// y[i] = fp16 bits of x[i], rounded to nearest even (activations for cuBLAS).
void launch_f32_to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);

}  // namespace barata::cuda
