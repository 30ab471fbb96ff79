// A mixture of experts' data movement on the GPU (the experts' matmuls are
// the backend's matmuls on rows grouped by expert; the routing is
// include/barata/moe.h's, on the host).
#pragma once

#include <cstdint>

#include "cuda_types.cuh"

namespace barata::cuda {

// out[g * d + i] = x[token[g] * d + i] for g < n: the rows of a batch in the
// order grouped by expert.
void launch_moe_gather(const float* x, int64_t d, const int32_t* token, int64_t n, float* out,
                       cudaStream_t stream);

// acc[t * d + i] += y[s_0] w_0 + y[s_1] w_1 + ... + y[s_(k-1)] w_(k-1), for
// t < n_tokens, s_j = slot_at[t * k + j] (the row of y, grouped by expert,
// holding token t's j-th expert's output), w_j = weights[t * k + j]: summed
// in the order chosen, then added, as the CPU backend (and llama.cpp) do,
// each operation rounded on its own (no fused multiply-add).
void launch_moe_combine(float* acc, const float* y, const int32_t* slot_at, const float* weights,
                        int64_t n_tokens, int64_t k, int64_t d, cudaStream_t stream);

}  // namespace barata::cuda
