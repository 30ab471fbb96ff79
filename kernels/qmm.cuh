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
// ep: a bias per row and/or the residual add (cuda_types.cuh), fused.
void launch_qmm(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows, float scale,
                const float* x, int64_t n_tok, float* y, int64_t ldy, cudaStream_t stream,
                const Epilogue& ep = {});

// The 8-bit-activation form: every type but the floats and NF4 (whose code
// book is not integers), for rows of whole 32-element blocks.
bool qmm_q8_supported(DType type);
std::string qmm_q8_variant(DType type, int64_t n_tok);

// n_tok rows of k (multiple of 32) floats to int8 xq (n_tok * k bytes, 4-byte
// aligned) and one fp32 scale per 32 (xd, n_tok * k / 32): the bits of the
// CPU's quantize_row_q8_act (src/cpu/matmul.cpp).
void launch_quantize_q8(const float* x, int64_t n_tok, int64_t k, void* xq, float* xd,
                        cudaStream_t stream);

// As launch_qmm on activations quantized by launch_quantize_q8: per 32-element
// block the exact integer dot of the weights' int8 codes with the
// activations' (__dp4a), times the weight's and the activation's scales.
void launch_qmm_q8(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows,
                   float scale, const void* xq, const float* xd, int64_t n_tok, float* y,
                   int64_t ldy, cudaStream_t stream, const Epilogue& ep = {});

// n_rows rows of W to fp16, row-major with k halves per row (dst 2-byte
// aligned): each value the reference dequantization (unit scale for kTensor
// types) rounded once to nearest even, bit-equal to fp32_to_fp16 of the CPU's.
void launch_dequant_rows_f16(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows,
                             uint16_t* dst, cudaStream_t stream);

}  // namespace barata::cuda
