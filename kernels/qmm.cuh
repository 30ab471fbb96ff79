// Batched decode matmul: y = scale * W x for 1..64 activation rows, reading W
// in its stored type, every type barata has (kernels/qdecode.cuh), each weight
// block once for all rows. Also the row dequantizer to fp16 that feeds cuBLAS
// for the types that cuda_dequantize_to_f16 (dequant.cuh) does not read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "barata/dtype.h"
#include "cuda_types.cuh"

namespace barata::cuda {

inline constexpr int64_t kQmmMaxTokens = 64;

// Every type of the type table.
bool qmm_supported(DType type);

// The kernel a width (1..kQmmMaxTokens) runs: "qmm<Q4_K, 4 rows x 8 tokens>"
// (widths are padded up to 1, 2, 4, 8, 16, 32 or 64 tokens), for bench -v.
std::string qmm_variant(DType type, int64_t n_tok);

// y[t * ldy + r] = scale * dot(W row r, x row t) for r < n_rows, t < n_tok.
// W row r at w + r * row_bytes (its row header included; a kTensor type's
// rows past the tensor header, decoded at unit scale); x rows of k floats,
// contiguous. fp32 activations, exact weights, fp32 accumulation.
void launch_qmm(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows, float scale,
                const float* x, int64_t n_tok, float* y, int64_t ldy, cudaStream_t stream);

// n_rows rows of W to fp16, row-major with k halves per row (dst 2-byte
// aligned): each value the reference dequantization (unit scale for kTensor
// types) rounded once to nearest even, bit-equal to fp32_to_fp16 of the CPU's.
void launch_dequant_rows_f16(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows,
                             uint16_t* dst, cudaStream_t stream);

}  // namespace barata::cuda
