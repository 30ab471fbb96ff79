// RMSNorm on the device: y[i] = x[src_row(i)] / sqrt(mean(x^2) + eps) * w.
#pragma once

#include <cstdint>

#include "cuda_types.cuh"

namespace barata::cuda {

// n_rows rows of d floats. row_index (device, nullable) picks the source row
// of each output row (the rows that want logits); null means row i -> row i.
// y and x may be the same buffer only when row_index is null. With q8.xq
// set (d a multiple of 32) y's 8-bit copy is written too, the bits of
// launch_quantize_q8 on y (kernels/q8_act.cuh), in the same launch.
void launch_rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t d, float eps,
                    const int32_t* row_index, cudaStream_t stream, const Q8Out& q8 = {});

}  // namespace barata::cuda
