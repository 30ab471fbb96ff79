// Decode matmul: y = W x for a few activation rows, reading the weights in
// their stored type (no fp16 copy of the matrix).
#pragma once

#include <cstddef>
#include <cstdint>

#include "barata/dtype.h"
#include "cuda_types.cuh"

namespace barata::cuda {

inline constexpr int64_t kGemvMaxTokens = 8;  // wider batches go to dequant + cuBLAS

// F32, F16, BF16, Q8_0, Q4_0 and Q4_1 (this issue); the others take the GEMM path.
bool gemv_supported(DType type);

// y[t * ldy + r] = scale * dot(W row r, x row t) for r < n_rows, t < n_tok
// (1 <= n_tok <= kGemvMaxTokens). W row r at w + r * row_bytes; x rows of k
// floats, contiguous. Accumulates in fp32.
void launch_gemv(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows,
                 float scale, const float* x, int64_t n_tok, float* y, int64_t ldy,
                 cudaStream_t stream, const Epilogue& ep = {});  // ep: as launch_qmm's

// One matrix of a grouped GEMV (a mixture of experts' expert): its weights
// (device), and its rows of x and y: rows [x_row, x_row + n_tok) of x give
// rows [y_row, y_row + n_tok) of y.
struct GemvGroup {
  const void* w;
  int32_t x_row, n_tok, y_row;
};

// launch_gemv for n_groups matrices of one type and shape in one launch
// (groups: a device array; each group at most max_tok <= kGemvMaxTokens
// rows): each group's outputs are those launch_gemv gives it alone.
void launch_gemv_grouped(DType type, const GemvGroup* groups, int n_groups, int64_t max_tok,
                         size_t row_bytes, int64_t k, int64_t n_rows, float scale, const float* x,
                         float* y, int64_t ldy, cudaStream_t stream);

}  // namespace barata::cuda
