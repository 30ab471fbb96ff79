// Dot-product tile kernels (see matmul.h for the DotTileFn contract).
#pragma once

#include <cstddef>
#include <cstdint>

namespace barata {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define BARATA_DOT_ISA ".avx2"
#else
#define BARATA_DOT_ISA ".scalar"
#endif

float dot_f32(const float* a, const float* b, int64_t k);
float dot_f16_f32(const uint16_t* w, const float* x, int64_t k);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t k);  // y += a * x

#define BARATA_DOT_TILE(name)                                                                   \
  void name(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k, const uint8_t* acts, \
            size_t act_stride, int64_t n_tokens, float* out, size_t ldy)
BARATA_DOT_TILE(dot_tile_f32);
BARATA_DOT_TILE(dot_tile_f16);
BARATA_DOT_TILE(dot_tile_q4_0_q8);
BARATA_DOT_TILE(dot_tile_q4_1_q8);
BARATA_DOT_TILE(dot_tile_q8_0_q8);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define BARATA_HAVE_BARATA_QUANT_KERNELS 1
BARATA_DOT_TILE(dot_tile_i8_tensor_q8);  // dot_barata.cpp
BARATA_DOT_TILE(dot_tile_i8_row_q8);
BARATA_DOT_TILE(dot_tile_i4_tensor_q8);
BARATA_DOT_TILE(dot_tile_i4_row_q8);
BARATA_DOT_TILE(dot_tile_i4_g128_q8);
BARATA_DOT_TILE(dot_tile_nf4_f32);
BARATA_DOT_TILE(dot_tile_q5_0_q8);  // dot_kquants.cpp
BARATA_DOT_TILE(dot_tile_q5_1_q8);
BARATA_DOT_TILE(dot_tile_iq4_nl_q8);
BARATA_DOT_TILE(dot_tile_q4_k_q8);
BARATA_DOT_TILE(dot_tile_q5_k_q8);
BARATA_DOT_TILE(dot_tile_q6_k_q8);
#endif

}  // namespace barata
