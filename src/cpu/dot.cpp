// Dot products of one weight row with activation rows. AVX2 (+FMA, F16C)
// when the build targets it, plain C++ otherwise. The quantized kernels use
// 8-bit activations and integer multiply-adds: maddubs multiplies 32 u8 x s8
// pairs per instruction, several times the rate of converting weights to
// float first.
#include "dot.h"
#include "simd.h"

#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "cpu/matmul.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace barata::BARATA_ISA_NS {
namespace {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
using simd::hsum;
#endif

inline const BlockQ8Act* act_row(const uint8_t* acts, size_t stride, int64_t t) {
  return reinterpret_cast<const BlockQ8Act*>(acts + t * stride);
}

// Q4_0 and Q4_1 share one loop: a Q4_0 block is a Q4_1 block with min = -8d.
// Plain C++ only (Q8_0 too): the AVX2 copy runs these types on the 8-row kernels
// (dot_r8.cpp), the AVX-512 copy on its 16-row ones.
// dot = sum_b (d_w d_x sum(q_w q_x) + m_w s_x), with s_x = d_x sum(q_x).
// R rows against one activation row at a time: the activation block is loaded
// once for R weight blocks, and the R accumulators are independent FMA chains
// (one chain alone would wait on the 4-cycle FMA latency). Each row's
// arithmetic is the same for every R.
template <typename Block, bool kHasMin, int R>
void dot_q4_q8(const uint8_t* w, size_t row_bytes, const BlockQ8Act* x, int64_t nb, float* out,
               size_t out_stride) {
  const Block* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const Block*>(w + r * row_bytes);
  float off[R];
  for (int r = 0; r < R; ++r) off[r] = 0.0f;
  for (int r = 0; r < R; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const Block& blk = rows[r][b];
      const float dw = fp16_to_fp32(blk.d);
      int isum = 0;
      for (int j = 0; j < 16; ++j)
        isum += (blk.qs[j] & 0x0f) * x[b].q[j] + (blk.qs[j] >> 4) * x[b].q[j + 16];
      sum += dw * x[b].d * static_cast<float>(isum);
      if constexpr (kHasMin) {
        off[r] += fp16_to_fp32(blk.m) * x[b].s;
      } else {
        off[r] -= 8.0f * dw * x[b].s;
      }
    }
    out[r * out_stride] = sum + off[r];
  }
}

template <int R>
void dot_q8_q8(const uint8_t* w, size_t row_bytes, const BlockQ8Act* x, int64_t nb, float* out,
               size_t out_stride) {
  const BlockQ8_0* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = reinterpret_cast<const BlockQ8_0*>(w + r * row_bytes);
  for (int r = 0; r < R; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      int isum = 0;
      for (int j = 0; j < 32; ++j) isum += rows[r][b].qs[j] * x[b].q[j];
      sum += fp16_to_fp32(rows[r][b].d) * x[b].d * static_cast<float>(isum);
    }
    out[r * out_stride] = sum;
  }
}

// Runs a row kernel over a tile: rows in groups of 4, then one at a time.
template <void (*K4)(const uint8_t*, size_t, const BlockQ8Act*, int64_t, float*, size_t),
          void (*K1)(const uint8_t*, size_t, const BlockQ8Act*, int64_t, float*, size_t)>
void q8_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k, const uint8_t* acts,
             size_t act_stride, int64_t n_tokens, float* out, size_t ldy) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const BlockQ8Act* x = act_row(acts, act_stride, t);
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4)
      K4(w + r * row_bytes, row_bytes, x, k / 32, out + t * ldy + r, 1);
    for (; r < n_rows; ++r) K1(w + r * row_bytes, row_bytes, x, k / 32, out + t * ldy + r, 1);
  }
}

}  // namespace

float dot_f16_f32(const uint16_t* w, const float* x, int64_t k) {
  int64_t i = 0;
  float tail = 0.0f;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; i + 16 <= k; i += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8)));
    a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
  }
  tail = hsum(_mm256_add_ps(a0, a1));
#endif
  for (; i < k; ++i) tail += fp16_to_fp32(w[i]) * x[i];
  return tail;
}

float dot_f32(const float* a, const float* b, int64_t k) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; i + 16 <= k; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
  }
  sum = hsum(_mm256_add_ps(a0, a1));
#endif
  for (; i < k; ++i) sum += a[i] * b[i];
  return sum;
}

BARATA_DOT_TILE(dot_tile_f32) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < n_rows; ++r)
      out[t * ldy + r] = dot_f32(reinterpret_cast<const float*>(w + r * row_bytes),
                                 reinterpret_cast<const float*>(acts + t * act_stride), k);
}

BARATA_DOT_TILE(dot_tile_f16) {
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < n_rows; ++r)
      out[t * ldy + r] = dot_f16_f32(reinterpret_cast<const uint16_t*>(w + r * row_bytes),
                                     reinterpret_cast<const float*>(acts + t * act_stride), k);
}

BARATA_DOT_TILE(dot_tile_q4_0_q8) {
  q8_tile<dot_q4_q8<BlockQ4_0, false, 4>, dot_q4_q8<BlockQ4_0, false, 1>>(
      w, row_bytes, n_rows, k, acts, act_stride, n_tokens, out, ldy);
}

BARATA_DOT_TILE(dot_tile_q4_1_q8) {
  q8_tile<dot_q4_q8<BlockQ4_1, true, 4>, dot_q4_q8<BlockQ4_1, true, 1>>(
      w, row_bytes, n_rows, k, acts, act_stride, n_tokens, out, ldy);
}

BARATA_DOT_TILE(dot_tile_q8_0_q8) {
  q8_tile<dot_q8_q8<4>, dot_q8_q8<1>>(w, row_bytes, n_rows, k, acts, act_stride, n_tokens, out,
                                      ldy);
}

}  // namespace barata::BARATA_ISA_NS
