// Greedy selection on the device, so that decoding need not copy the logits back.
#pragma once

#include <cstdint>

#include "cuda_types.cuh"

namespace barata::cuda {

// out[i] = the index of the largest of logits[i * n_vocab .. + n_vocab); on a
// tie the lowest index (what std::max_element gives on the host). NaN never wins.
void launch_argmax(const float* logits, int64_t n_rows, int64_t n_vocab, int32_t* out,
                   cudaStream_t stream);

}  // namespace barata::cuda
