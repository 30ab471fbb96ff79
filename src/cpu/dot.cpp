// Dot products of one weight row with activation rows. AVX2 (+FMA, F16C)
// when the build targets it, plain C++ otherwise. The quantized kernels use
// 8-bit activations and integer multiply-adds: maddubs multiplies 32 u8 x s8
// pairs per instruction, several times the rate of converting weights to
// float first.
#include "dot.h"

#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "barata/matmul.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace barata {
namespace {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 bytes of packed nibbles -> 32 bytes in element order: the low nibbles are
// elements 0..15 and the high nibbles 16..31 (llama.cpp's Q4 layout).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// Sum of u8 x s8 products, as 8 float lanes.
inline __m256 dot_u8_s8(__m256i u, __m256i s) {
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}
#endif

inline const BlockQ8Act* act_row(const uint8_t* acts, size_t stride, int64_t t) {
  return reinterpret_cast<const BlockQ8Act*>(acts + t * stride);
}

// Q4_0 and Q4_1 share one loop: a Q4_0 block is a Q4_1 block with min = -8d.
// dot = sum_b (d_w d_x sum(q_w q_x) + m_w s_x), with s_x = d_x sum(q_x).
template <typename Block, bool kHasMin>
float dot_q4_q8(const Block* w, const BlockQ8Act* x, int64_t nb) {
  float offset = 0.0f;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const float dw = fp16_to_fp32(w[b].d);
    const __m256i qw = unpack_nibbles(w[b].qs);
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dw * x[b].d), dot_u8_s8(qw, qx), acc);
    if constexpr (kHasMin) {
      offset += fp16_to_fp32(w[b].m) * x[b].s;
    } else {
      offset -= 8.0f * dw * x[b].s;
    }
  }
  return hsum(acc) + offset;
#else
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const float dw = fp16_to_fp32(w[b].d);
    int isum = 0;
    for (int j = 0; j < 16; ++j)
      isum += (w[b].qs[j] & 0x0f) * x[b].q[j] + (w[b].qs[j] >> 4) * x[b].q[j + 16];
    sum += dw * x[b].d * static_cast<float>(isum);
    if constexpr (kHasMin) {
      offset += fp16_to_fp32(w[b].m) * x[b].s;
    } else {
      offset -= 8.0f * dw * x[b].s;
    }
  }
  return sum + offset;
#endif
}

float dot_q8_q8(const BlockQ8_0* w, const BlockQ8Act* x, int64_t nb) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q));
    // maddubs wants one unsigned operand: |w| times x with w's sign.
    const __m256 p = dot_u8_s8(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16_to_fp32(w[b].d) * x[b].d), p, acc);
  }
  return hsum(acc);
#else
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int isum = 0;
    for (int j = 0; j < 32; ++j) isum += w[b].qs[j] * x[b].q[j];
    sum += fp16_to_fp32(w[b].d) * x[b].d * static_cast<float>(isum);
  }
  return sum;
#endif
}

}  // namespace

float dot_f16_f32(const uint16_t* w, const float* x, int64_t k) {
  int64_t i = 0;
  float tail = 0.0f;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; i + 16 <= k; i += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    const __m256 w1 =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i + 8)));
    a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
  }
  tail = hsum(_mm256_add_ps(a0, a1));
#endif
  for (; i < k; ++i) tail += fp16_to_fp32(w[i]) * x[i];
  return tail;
}

void axpy_f16(float a, const uint16_t* x, float* y, int64_t k) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= k; i += 8) {
    const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, xv, _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < k; ++i) y[i] += a * fp16_to_fp32(x[i]);
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

BARATA_DOT_ROWS(dot_rows_f32) {
  const auto* w = reinterpret_cast<const float*>(w_row);
  for (int64_t t = 0; t < n_tokens; ++t)
    out[t * out_stride] = dot_f32(w, reinterpret_cast<const float*>(acts + t * act_stride), k);
}

BARATA_DOT_ROWS(dot_rows_f16) {
  const auto* w = reinterpret_cast<const uint16_t*>(w_row);
  for (int64_t t = 0; t < n_tokens; ++t)
    out[t * out_stride] = dot_f16_f32(w, reinterpret_cast<const float*>(acts + t * act_stride), k);
}

BARATA_DOT_ROWS(dot_rows_q4_0_q8) {
  const auto* w = reinterpret_cast<const BlockQ4_0*>(w_row);
  for (int64_t t = 0; t < n_tokens; ++t)
    out[t * out_stride] = dot_q4_q8<BlockQ4_0, false>(w, act_row(acts, act_stride, t), k / 32);
}

BARATA_DOT_ROWS(dot_rows_q4_1_q8) {
  const auto* w = reinterpret_cast<const BlockQ4_1*>(w_row);
  for (int64_t t = 0; t < n_tokens; ++t)
    out[t * out_stride] = dot_q4_q8<BlockQ4_1, true>(w, act_row(acts, act_stride, t), k / 32);
}

BARATA_DOT_ROWS(dot_rows_q8_0_q8) {
  const auto* w = reinterpret_cast<const BlockQ8_0*>(w_row);
  for (int64_t t = 0; t < n_tokens; ++t)
    out[t * out_stride] = dot_q8_q8(w, act_row(acts, act_stride, t), k / 32);
}

}  // namespace barata
