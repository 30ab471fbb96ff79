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

}  // namespace barata::cuda
