// Tiled attention over the paged fp16 KV cache, and the gated activations,
// compiled once per instruction set (see dot.h). The contract of attend():
//
// A work item is a run of tokens of one sequence (one block table) and one KV
// head: its queries are the `group` query heads of each token, up to
// kAttnMaxQueries of them. The keys are walked one cache block (16 positions)
// at a time, each block's K and V converted from fp16 once for all the
// item's queries. Scores are computed with the queries in the vector lanes
// (Q transposed once per item), so the softmax over a block's keys is a
// vertical max and sum, with no horizontal reduction; the softmax is online
// (a running max and sum per query, the output rescaled when the max grows).
//
// Every query's arithmetic is fixed by the query and the key positions alone:
// its score with key j is one FMA chain over the head dimension in order, its
// block max, exponentials and block sum are per lane in key order, and its
// output accumulates the block's values in key order. So a query gives the
// same bits whichever item, lane and batch it is computed in: decode, prefill
// and any batch width agree (tests: CpuAttention.*).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "barata/batch.h"
#include "barata/half.h"
#include "barata/kv_types.h"
#include "dot.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace barata::BARATA_ISA_NS {
namespace {

constexpr int64_t kTile = 16;         // keys per tile: one KV cache block
constexpr int kIntKeys = 8;           // int-key scores: keys per pass (accumulators in registers)
constexpr int64_t kMaxIntHead = 512;  // the largest head that takes int keys

#if defined(__AVX512F__)
constexpr int W = 16;
using V = __m512;
using Mask = __mmask16;
inline V vzero() {
  return _mm512_setzero_ps();
}
inline V vset1(float x) {
  return _mm512_set1_ps(x);
}
inline V vload(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void vstore(float* p, V v) {
  _mm512_storeu_ps(p, v);
}
inline V vfma(V a, V b, V c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline V vmul(V a, V b) {
  return _mm512_mul_ps(a, b);
}
inline V vadd(V a, V b) {
  return _mm512_add_ps(a, b);
}
inline V vsub(V a, V b) {
  return _mm512_sub_ps(a, b);
}
inline V vmax(V a, V b) {
  return _mm512_max_ps(a, b);
}
inline V vmin(V a, V b) {
  return _mm512_min_ps(a, b);
}
inline V vdiv(V a, V b) {
  return _mm512_div_ps(a, b);
}
inline Mask vle(V a, V b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ);
}
inline Mask vlt(V a, V b) {
  return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ);
}
inline Mask vand(Mask a, Mask b) {
  return static_cast<Mask>(a & b);
}
inline V vsel(Mask m, V a, V b) {
  return _mm512_mask_blend_ps(m, b, a);
}  // m ? a : b
inline V vround(V x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline V vexp2i(V n) {  // 2^n for integral n in [-125, 127]
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_castsi512_ps(e);
}
inline V vload_f16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr int W = 8;
using V = __m256;
using Mask = __m256;
inline V vzero() {
  return _mm256_setzero_ps();
}
inline V vset1(float x) {
  return _mm256_set1_ps(x);
}
inline V vload(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void vstore(float* p, V v) {
  _mm256_storeu_ps(p, v);
}
inline V vfma(V a, V b, V c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline V vmul(V a, V b) {
  return _mm256_mul_ps(a, b);
}
inline V vadd(V a, V b) {
  return _mm256_add_ps(a, b);
}
inline V vsub(V a, V b) {
  return _mm256_sub_ps(a, b);
}
inline V vmax(V a, V b) {
  return _mm256_max_ps(a, b);
}
inline V vmin(V a, V b) {
  return _mm256_min_ps(a, b);
}
inline V vdiv(V a, V b) {
  return _mm256_div_ps(a, b);
}
inline Mask vle(V a, V b) {
  return _mm256_cmp_ps(a, b, _CMP_LE_OQ);
}
inline Mask vlt(V a, V b) {
  return _mm256_cmp_ps(a, b, _CMP_LT_OQ);
}
inline Mask vand(Mask a, Mask b) {
  return _mm256_and_ps(a, b);
}
inline V vsel(Mask m, V a, V b) {
  return _mm256_blendv_ps(b, a, m);
}
inline V vround(V x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline V vexp2i(V n) {
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(e);
}
inline V vload_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#else
constexpr int W = 1;
using V = float;
using Mask = bool;
inline V vzero() {
  return 0.0f;
}
inline V vset1(float x) {
  return x;
}
inline V vload(const float* p) {
  return *p;
}
inline void vstore(float* p, V v) {
  *p = v;
}
inline V vfma(V a, V b, V c) {
  return a * b + c;
}  // -ffp-contract=off: two roundings
inline V vmul(V a, V b) {
  return a * b;
}
inline V vadd(V a, V b) {
  return a + b;
}
inline V vsub(V a, V b) {
  return a - b;
}
inline V vmax(V a, V b) {
  return a > b ? a : b;
}
inline V vmin(V a, V b) {
  return a < b ? a : b;
}
inline V vdiv(V a, V b) {
  return a / b;
}
inline Mask vle(V a, V b) {
  return a <= b;
}
inline Mask vlt(V a, V b) {
  return a < b;
}
inline Mask vand(Mask a, Mask b) {
  return a && b;
}
inline V vsel(Mask m, V a, V b) {
  return m ? a : b;
}
inline V vload_f16(const uint16_t* p) {
  return fp16_to_fp32(*p);
}
#endif

// e^x. The vector copies: Cephes' expf (range reduction by ln 2 in two parts,
// a degree-7 polynomial), within 2 ulp; below -86.5 the result is 0 (true
// values there are under 3e-38). The scalar copy calls std::exp.
inline V vexp(V x) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  const V lo = vset1(-86.5f);
  const V xc = vmin(vmax(x, lo), vset1(88.0f));
  const V n = vround(vmul(xc, vset1(1.44269504088896341f)));
  V r = vfma(n, vset1(-0.693359375f), xc);
  r = vfma(n, vset1(2.12194440e-4f), r);
  V p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
  return vsel(vlt(x, lo), vzero(), vmul(p, vexp2i(n)));
#else
  return std::exp(x);
#endif
}

// One head's row of the cache (hd values of type t) to floats: the values
// kv_dequantize_row gives (kv_types.cpp), one exact int-to-float conversion
// (or E4M3 table entry) and one multiply per value, so the vector copies give
// the scalar bits.
inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
// E4M3 code -> float, all 256 codes (e4m3_to_fp32), for the scalar copy. (The
// vector copies build the values from the bits; the one code they differ on,
// 0x7f, NaN, is never written: fp32_to_e4m3 gives it only for a NaN.)
struct E4m3Table {
  float v[256];
  E4m3Table() {
    for (int c = 0; c < 256; ++c) v[c] = e4m3_to_fp32(static_cast<uint8_t>(c));
  }
};
#endif

// 16 codes (int32 lanes or, on AVX2, two halves of 8) times d, stored.
#if defined(__AVX512F__)
inline void store16(float* o, __m512i q, float d) {
  _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(q)));
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
inline void store8(float* o, __m256i q, float d) {
  _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(q)));
}
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// IQ4_NL's grid as 16 bytes: pshufb looks 16 codes up at once.
inline __m128i iq4nl_grid() {
  return _mm_setr_epi8(static_cast<char>(iq4nl_value(0)), static_cast<char>(iq4nl_value(1)),
                       static_cast<char>(iq4nl_value(2)), static_cast<char>(iq4nl_value(3)),
                       static_cast<char>(iq4nl_value(4)), static_cast<char>(iq4nl_value(5)),
                       static_cast<char>(iq4nl_value(6)), static_cast<char>(iq4nl_value(7)),
                       static_cast<char>(iq4nl_value(8)), static_cast<char>(iq4nl_value(9)),
                       static_cast<char>(iq4nl_value(10)), static_cast<char>(iq4nl_value(11)),
                       static_cast<char>(iq4nl_value(12)), static_cast<char>(iq4nl_value(13)),
                       static_cast<char>(iq4nl_value(14)), static_cast<char>(iq4nl_value(15)));
}
#endif

inline void load_row(KvType t, const uint8_t* src, float* out, int64_t hd) {
  switch (t) {
    case KvType::kQ8_0:
      for (int64_t b = 0; b < hd / 32; ++b) {
        const uint8_t* blk = src + 34 * b;
        const float d = load_half(blk);
        const uint8_t* q = blk + 2;
        float* o = out + 32 * b;
#if defined(__AVX512F__)
        for (int h = 0; h < 2; ++h)
          store16(
              o + 16 * h,
              _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * h))),
              d);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
        for (int h = 0; h < 4; ++h)
          store8(o + 8 * h,
                 _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * h))),
                 d);
#else
        for (int j = 0; j < 32; ++j) o[j] = d * static_cast<float>(static_cast<int8_t>(q[j]));
#endif
      }
      return;
    case KvType::kQ4_0:
      for (int64_t b = 0; b < hd / 32; ++b) {
        const uint8_t* blk = src + 18 * b;
        const float d = load_half(blk);
        const uint8_t* q = blk + 2;
        float* o = out + 32 * b;
#if defined(__AVX512F__)
        const __m512i c =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
        const __m512i m = _mm512_set1_epi32(15), eight = _mm512_set1_epi32(8);
        store16(o, _mm512_sub_epi32(_mm512_and_si512(c, m), eight), d);
        store16(o + 16, _mm512_sub_epi32(_mm512_srli_epi32(c, 4), eight), d);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
        const __m256i m = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
        for (int h = 0; h < 2; ++h) {
          const __m256i c =
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * h)));
          store8(o + 8 * h, _mm256_sub_epi32(_mm256_and_si256(c, m), eight), d);
          store8(o + 16 + 8 * h, _mm256_sub_epi32(_mm256_srli_epi32(c, 4), eight), d);
        }
#else
        for (int j = 0; j < 16; ++j) {
          o[j] = d * static_cast<float>((q[j] & 15) - 8);
          o[j + 16] = d * static_cast<float>((q[j] >> 4) - 8);
        }
#endif
      }
      return;
    case KvType::kIq4Nl:
      for (int64_t b = 0; b < hd / 32; ++b) {
        const uint8_t* blk = src + 18 * b;
        const float d = load_half(blk);
        const uint8_t* q = blk + 2;
        float* o = out + 32 * b;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
        const __m128i grid = iq4nl_grid();
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
        const __m128i m = _mm_set1_epi8(15);
        const __m128i lo = _mm_shuffle_epi8(grid, _mm_and_si128(c, m));
        const __m128i hi = _mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(c, 4), m));
#if defined(__AVX512F__)
        store16(o, _mm512_cvtepi8_epi32(lo), d);
        store16(o + 16, _mm512_cvtepi8_epi32(hi), d);
#else
        store8(o, _mm256_cvtepi8_epi32(lo), d);
        store8(o + 8, _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)), d);
        store8(o + 16, _mm256_cvtepi8_epi32(hi), d);
        store8(o + 24, _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)), d);
#endif
#else
        for (int j = 0; j < 16; ++j) {
          o[j] = d * static_cast<float>(iq4nl_value(q[j] & 15));
          o[j + 16] = d * static_cast<float>(iq4nl_value(q[j] >> 4));
        }
#endif
      }
      return;
    case KvType::kFp8: {
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
      static const E4m3Table table;
#endif
      for (int64_t b = 0; b < hd / 32; ++b) {
        const uint8_t* blk = src + 34 * b;
        const float s = load_half(blk);
        const uint8_t* q = blk + 2;
        float* o = out + 32 * b;
        // A code's value, exactly: e = 0: m 2^-9, else (8 + m) 2^(e - 10):
        // the integer (8 [e > 0] + m) times the power of two built from
        // max(e, 1) (both exact), its sign then set.
#if defined(__AVX512F__)
        for (int h = 0; h < 2; ++h) {
          const __m512i c =
              _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * h)));
          const __m512i e = _mm512_and_si512(_mm512_srli_epi32(c, 3), _mm512_set1_epi32(15));
          const __m512i m = _mm512_and_si512(c, _mm512_set1_epi32(7));
          const __m512i lead = _mm512_min_epi32(e, _mm512_set1_epi32(1));  // 1 when normal
          const __m512i mant = _mm512_add_epi32(m, _mm512_slli_epi32(lead, 3));
          const __m512i pw = _mm512_slli_epi32(
              _mm512_add_epi32(_mm512_max_epi32(e, _mm512_set1_epi32(1)), _mm512_set1_epi32(117)),
              23);
          __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(mant), _mm512_castsi512_ps(pw));
          v = _mm512_castsi512_ps(
              _mm512_or_si512(_mm512_castps_si512(v),
                              _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24)));
          _mm512_storeu_ps(o + 16 * h, _mm512_mul_ps(_mm512_set1_ps(s), v));
        }
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
        for (int h = 0; h < 4; ++h) {
          const __m256i c =
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * h)));
          const __m256i e = _mm256_and_si256(_mm256_srli_epi32(c, 3), _mm256_set1_epi32(15));
          const __m256i m = _mm256_and_si256(c, _mm256_set1_epi32(7));
          const __m256i lead = _mm256_min_epi32(e, _mm256_set1_epi32(1));
          const __m256i mant = _mm256_add_epi32(m, _mm256_slli_epi32(lead, 3));
          const __m256i pw = _mm256_slli_epi32(
              _mm256_add_epi32(_mm256_max_epi32(e, _mm256_set1_epi32(1)), _mm256_set1_epi32(117)),
              23);
          __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(mant), _mm256_castsi256_ps(pw));
          v = _mm256_castsi256_ps(
              _mm256_or_si256(_mm256_castps_si256(v),
                              _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24)));
          _mm256_storeu_ps(o + 8 * h, _mm256_mul_ps(_mm256_set1_ps(s), v));
        }
#else
        for (int j = 0; j < 32; ++j) o[j] = s * table.v[q[j]];
#endif
      }
      return;
    }
    default: {  // f16
      const uint16_t* h = reinterpret_cast<const uint16_t*>(src);
      int64_t d = 0;
      for (; d + W <= hd; d += W) vstore(out + d, vload_f16(h + d));
      for (; d < hd; ++d) out[d] = fp16_to_fp32(h[d]);
      return;
    }
  }
}

// The scores of 4 keys against every query vector: s[j][lane] = sum over d of
// k_j[d] * q_lane[d], one FMA chain per (key, query) in d order.
inline void scores4(const float* qt, int64_t qs, int64_t nqv, const float* kf, int64_t hd, float* s,
                    float scale) {
  for (int64_t v = 0; v < nqv; v += 2) {
    const bool two = v + 1 < nqv;
    V a00 = vzero(), a01 = vzero(), a10 = vzero(), a11 = vzero();
    V a20 = vzero(), a21 = vzero(), a30 = vzero(), a31 = vzero();
    const float* q0 = qt + v * W;
    const float* q1 = qt + (two ? v + 1 : v) * W;
    for (int64_t d = 0; d < hd; ++d) {
      const V x0 = vload(q0 + d * qs), x1 = vload(q1 + d * qs);
      const V k0 = vset1(kf[d]), k1 = vset1(kf[hd + d]);
      const V k2 = vset1(kf[2 * hd + d]), k3 = vset1(kf[3 * hd + d]);
      a00 = vfma(k0, x0, a00);
      a01 = vfma(k0, x1, a01);
      a10 = vfma(k1, x0, a10);
      a11 = vfma(k1, x1, a11);
      a20 = vfma(k2, x0, a20);
      a21 = vfma(k2, x1, a21);
      a30 = vfma(k3, x0, a30);
      a31 = vfma(k3, x1, a31);
    }
    const V sc = vset1(scale);
    vstore(s + 0 * qs + v * W, vmul(a00, sc));
    vstore(s + 1 * qs + v * W, vmul(a10, sc));
    vstore(s + 2 * qs + v * W, vmul(a20, sc));
    vstore(s + 3 * qs + v * W, vmul(a30, sc));
    if (two) {
      vstore(s + 0 * qs + (v + 1) * W, vmul(a01, sc));
      vstore(s + 1 * qs + (v + 1) * W, vmul(a11, sc));
      vstore(s + 2 * qs + (v + 1) * W, vmul(a21, sc));
      vstore(s + 3 * qs + (v + 1) * W, vmul(a31, sc));
    }
  }
}

// Keys as int8 codes (kv_int_keys): the AVX-512 and avxvnni copies multiply
// with vpdpbusd, unsigned keys times signed queries, so it stores a code c as the
// byte c + 128 (c ^ 0x80) and starts each block's sum at -128 * (the query's
// code sum); the AVX2 copy multiplies |k| by sign(k) q with pmaddubsw (pairs
// of |127 * 127| fit its int16 sums) and the scalar one in int32: the same
// exact sums.
#if defined(__AVX512F__) || defined(__AVXVNNI__)
constexpr uint8_t kKeyBias = 0x80;
#else
constexpr uint8_t kKeyBias = 0;
#endif

// One head's key row (hd values of int-key type t) to its codes, biased, and
// its block scales.
inline void load_codes(KvType t, const uint8_t* src, uint8_t* kc, float* kd, int64_t hd) {
  const int64_t bb = t == KvType::kQ8_0 ? 34 : 18;
  for (int64_t b = 0; b < hd / 32; ++b) {
    const uint8_t* blk = src + bb * b;
    kd[b] = load_half(blk);
    const uint8_t* q = blk + 2;
    uint8_t* o = kc + 32 * b;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    const __m128i bias = _mm_set1_epi8(static_cast<char>(kKeyBias));
    if (t == KvType::kQ8_0) {
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o),
                          _mm256_xor_si256(c, _mm256_set1_epi8(static_cast<char>(kKeyBias))));
      continue;
    }
    const __m128i grid = t == KvType::kQ4_0
                             ? _mm_setr_epi8(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                             : iq4nl_grid();
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i m = _mm_set1_epi8(15);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o),
                     _mm_xor_si128(_mm_shuffle_epi8(grid, _mm_and_si128(c, m)), bias));
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(o + 16),
        _mm_xor_si128(_mm_shuffle_epi8(grid, _mm_and_si128(_mm_srli_epi16(c, 4), m)), bias));
#else
    for (int j = 0; j < 32; ++j) {
      int v;
      if (t == KvType::kQ8_0)
        v = static_cast<int8_t>(q[j]);
      else {
        const int n = j < 16 ? q[j] & 15 : q[j - 16] >> 4;
        v = t == KvType::kQ4_0 ? n - 8 : iq4nl_value(n);
      }
      o[j] = static_cast<uint8_t>(static_cast<uint8_t>(v) ^ kKeyBias);
    }
#endif
  }
}

inline int32_t load4(const uint8_t* p) {
  int32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// The scores of kK keys (codes kc, scales kd) against the queries of vector
// v: qi[hd / 4][qs][4] codes, qd[nb][qs] scales, qc[nb][qs] the sums' start.
// Per key and lane: f = 0; per block b, f = fma(float(isum_b) * d_q, d_k, f);
// then s = f * scale.
template <int kK>
inline void scores_int(const int8_t* qi, const float* qd, const int32_t* qc, int64_t qs, int64_t v,
                       const uint8_t* kc, const float* kd, int64_t hd, float* s, float scale) {
  const int64_t nb = hd / 32;
  V f[kK];
  for (int j = 0; j < kK; ++j) f[j] = vzero();
  for (int64_t b = 0; b < nb; ++b) {
#if defined(__AVX512F__)
    __m512i acc[kK];
    const __m512i start = _mm512_loadu_si512(qc + b * qs + v * W);
    for (int j = 0; j < kK; ++j) acc[j] = start;
    for (int64_t g = 0; g < 8; ++g) {
      const __m512i x = _mm512_loadu_si512(qi + ((b * 8 + g) * qs + v * W) * 4);
      for (int j = 0; j < kK; ++j)
        acc[j] =
            _mm512_dpbusd_epi32(acc[j], _mm512_set1_epi32(load4(kc + j * hd + b * 32 + 4 * g)), x);
    }
    const V dq = vload(qd + b * qs + v * W);
    for (int j = 0; j < kK; ++j)
      f[j] = vfma(vmul(_mm512_cvtepi32_ps(acc[j]), dq), vset1(kd[j * nb + b]), f[j]);
#elif defined(__AVXVNNI__)
    __m256i acc[kK];
    const __m256i start = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc + b * qs + v * W));
    for (int j = 0; j < kK; ++j) acc[j] = start;
    for (int64_t g = 0; g < 8; ++g) {
      const __m256i x =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qi + ((b * 8 + g) * qs + v * W) * 4));
      for (int j = 0; j < kK; ++j)
        acc[j] = _mm256_dpbusd_avx_epi32(acc[j],
                                         _mm256_set1_epi32(load4(kc + j * hd + b * 32 + 4 * g)), x);
    }
    const V dq = vload(qd + b * qs + v * W);
    for (int j = 0; j < kK; ++j)
      f[j] = vfma(vmul(_mm256_cvtepi32_ps(acc[j]), dq), vset1(kd[j * nb + b]), f[j]);
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    __m256i acc[kK];
    const __m256i start = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc + b * qs + v * W));
    const __m256i ones = _mm256_set1_epi16(1);
    for (int j = 0; j < kK; ++j) acc[j] = start;
    for (int64_t g = 0; g < 8; ++g) {
      const __m256i x =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qi + ((b * 8 + g) * qs + v * W) * 4));
      for (int j = 0; j < kK; ++j) {
        const __m256i k = _mm256_set1_epi32(load4(kc + j * hd + b * 32 + 4 * g));
        const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(k), _mm256_sign_epi8(x, k));
        acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(p, ones));
      }
    }
    const V dq = vload(qd + b * qs + v * W);
    for (int j = 0; j < kK; ++j)
      f[j] = vfma(vmul(_mm256_cvtepi32_ps(acc[j]), dq), vset1(kd[j * nb + b]), f[j]);
#else
    for (int j = 0; j < kK; ++j) {
      int32_t acc = qc[b * qs + v];
      for (int64_t e = 0; e < 32; ++e)
        acc += static_cast<int32_t>(qi[((b * 8 + e / 4) * qs + v) * 4 + e % 4]) *
               static_cast<int8_t>(kc[j * hd + b * 32 + e] ^ kKeyBias);
      f[j] = vfma(vmul(static_cast<float>(acc), qd[b * qs + v]), kd[j * nb + b], f[j]);
    }
#endif
  }
  const V sc = vset1(scale);
  for (int j = 0; j < kK; ++j) vstore(s + j * qs + v * W, vmul(f[j], sc));
}

// The block's values into the transposed output, queries in the lanes of
// query vector v: ot[d] = ot[d] * alpha + sum over keys j < jn of p_j * v_j[d],
// per lane in key order. A key outside a lane's range has p_j = 0 there and
// leaves its sum as it was (v_j is finite: rows past the keys are zeroed).
template <int64_t kD>
inline void accumulate_pv_rows(float* ot, int64_t qs, V al, const float* p, const float* vf,
                               int64_t hd, int64_t jn, int64_t d) {
  V acc[kD];
  for (int64_t i = 0; i < kD; ++i) acc[i] = vmul(vload(ot + (d + i) * qs), al);
  for (int64_t j = 0; j < jn; ++j) {
    const V pj = vload(p + j * qs);
    const float* vr = vf + j * hd + d;
    for (int64_t i = 0; i < kD; ++i) acc[i] = vfma(pj, vset1(vr[i]), acc[i]);
  }
  for (int64_t i = 0; i < kD; ++i) vstore(ot + (d + i) * qs, acc[i]);
}

inline void accumulate_pv(float* ot, int64_t qs, const float* al_p, const float* p, const float* vf,
                          int64_t hd, int64_t jn) {
  constexpr int64_t kD = W == 16 ? 8 : 4;  // output rows held in registers
  const V al = vload(al_p);
  int64_t d = 0;
  for (; d + kD <= hd; d += kD) accumulate_pv_rows<kD>(ot, qs, al, p, vf, hd, jn, d);
  for (; d < hd; ++d) accumulate_pv_rows<1>(ot, qs, al, p, vf, hd, jn, d);
}

void attend(const AttnArgs& a, const int32_t* table, int64_t t0, int64_t t1, int64_t kvh) {
  const int64_t hd = a.hd, G = a.group, nq = (t1 - t0) * G;
  const int64_t nqv = (nq + W - 1) / W, qs = nqv * W;  // query lanes, padded
  thread_local Scratch<float> scratch;                 // not std::vector: see dot.h
  // Sized for the largest item (kAttnMaxQueries queries, or one row's
  // group): a thread allocates on its first item only, whatever comes after.
  const int64_t qs_max = (std::max(kAttnMaxQueries, G) + W - 1) / W * W;
  // qt[hd][qs] | s[kTile][qs] | kf[kTile][hd] | vf[kTile][hd] | ot[hd][qs]
  // | m, l, alpha, first, n [qs] each
  float* buf = scratch.get(
      static_cast<size_t>(std::max(qs, qs_max) * (2 * hd + kTile + 5) + 2 * kTile * hd));
  float* qt = buf;
  float* s = qt + hd * qs;
  float* kf = s + kTile * qs;
  float* vf = kf + kTile * hd;
  float* ot = vf + kTile * hd;  // the output, transposed: queries in the lanes
  float* m = ot + hd * qs;
  float* l = m + qs;
  float* alpha = l + qs;
  float* first = alpha + qs;  // per-lane first key and key count, as floats
  float* count = first + qs;

  // Int keys: qi[hd / 4][qs][4] query codes | qc[nb][qs] sum starts (int32)
  // | kc[kTile][hd] key codes (bytes), and qd[nb][qs] | kd[kTile][nb] (floats).
  const bool ik = kv_int_keys(a.k_type) && hd <= kMaxIntHead;
  const int64_t nb = hd / 32;
  thread_local Scratch<int32_t> iscratch;
  thread_local Scratch<float> fscratch;
  int8_t* qi = nullptr;
  int32_t* qc = nullptr;
  uint8_t* kc = nullptr;
  float* qd = nullptr;
  float* kd = nullptr;
  int8_t qcodes[kMaxIntHead];
  float qdb[kMaxIntHead / 32];
  if (ik) {
    const int64_t qm = std::max(qs, qs_max);
    int32_t* ib = iscratch.get(static_cast<size_t>(hd * qm / 4 + nb * qm + kTile * hd / 4));
    qi = reinterpret_cast<int8_t*>(ib);
    qc = ib + hd * qs / 4;
    kc = reinterpret_cast<uint8_t*>(qc + nb * qs);
    qd = fscratch.get(static_cast<size_t>(nb * qm + kTile * nb));
    kd = qd + nb * qs;
  }

  int64_t kmin = std::numeric_limits<int64_t>::max(), kmax = 0;
  for (int64_t i = 0; i < qs; ++i) {
    if (ik) {
      if (i < nq) {
        const int64_t t = t0 + i / G, h = kvh * G + i % G;
        kv_quantize_query(a.q + t * a.q_dim + h * hd, qcodes, qdb, hd);
      } else {
        std::fill(qcodes, qcodes + hd, int8_t{0});
        std::fill(qdb, qdb + nb, 0.0f);
      }
      for (int64_t b = 0; b < nb; ++b) {
        int32_t sum = 0;
        for (int64_t e = 0; e < 32; ++e) {
          const int64_t d = 32 * b + e;
          qi[((d / 4) * qs + i) * 4 + d % 4] = qcodes[d];
          sum += qcodes[d];
        }
        qc[b * qs + i] = -static_cast<int32_t>(kKeyBias) * sum;
        qd[b * qs + i] = qdb[b];
      }
    }
    if (i < nq) {
      const int64_t t = t0 + i / G, h = kvh * G + i % G;
      const float* q = a.q + t * a.q_dim + h * hd;
      if (!ik)  // int keys read the codes in qi instead
        for (int64_t d = 0; d < hd; ++d) qt[d * qs + i] = q[d];
      const int64_t n = static_cast<int64_t>(a.rows[t].pos) + 1;
      const int64_t f = a.window > 0 ? std::max<int64_t>(0, n - a.window) : 0;
      first[i] = static_cast<float>(f);
      count[i] = static_cast<float>(n);
      kmin = std::min(kmin, f);
      kmax = std::max(kmax, n);
    } else {
      if (!ik)
        for (int64_t d = 0; d < hd; ++d) qt[d * qs + i] = 0.0f;
      first[i] = 0.0f;
      count[i] = 0.0f;  // no key is ever valid for a padding lane
    }
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  std::fill(ot, ot + hd * qs, 0.0f);

  const int64_t k_head = kv_row_bytes(a.k_type, hd), v_head = kv_row_bytes(a.v_type, hd);
  for (int64_t b0 = kmin / kTile * kTile; b0 < kmax; b0 += kTile) {
    const uint8_t* blk = a.kv_base + static_cast<int64_t>(table[b0 / kTile]) * a.block_bytes;
    const uint8_t* kb = blk + a.k_off + kvh * k_head;
    const uint8_t* vb = blk + a.v_off + kvh * v_head;
    const int64_t jn = std::min(kTile, kmax - b0);  // rows of this block that hold keys
    if (ik) {
      for (int64_t j = 0; j < jn; ++j) {
        load_codes(a.k_type, kb + j * a.k_row, kc + j * hd, kd + j * nb, hd);
        load_row(a.v_type, vb + j * a.v_row, vf + j * hd, hd);
      }
      for (int64_t j = jn; j < kTile; ++j) {
        std::fill(kc + j * hd, kc + (j + 1) * hd, kKeyBias);  // code 0
        std::fill(kd + j * nb, kd + (j + 1) * nb, 0.0f);
        std::fill(vf + j * hd, vf + (j + 1) * hd, 0.0f);
      }
      for (int64_t v = 0; v < nqv; ++v)
        for (int64_t j = 0; j < kTile; j += kIntKeys)
          scores_int<kIntKeys>(qi, qd, qc, qs, v, kc + j * hd, kd + j * nb, hd, s + j * qs,
                               a.scale);
    } else {
      for (int64_t j = 0; j < jn; ++j) {
        load_row(a.k_type, kb + j * a.k_row, kf + j * hd, hd);
        load_row(a.v_type, vb + j * a.v_row, vf + j * hd, hd);
      }
      for (int64_t j = jn; j < kTile; ++j)
        for (int64_t d = 0; d < hd; ++d) kf[j * hd + d] = vf[j * hd + d] = 0.0f;
      for (int64_t j = 0; j < kTile; j += 4)
        scores4(qt, qs, nqv, kf + j * hd, hd, s + j * qs, a.scale);
    }

    // The online softmax, per lane: keys j of this tile are valid for a lane
    // when first <= b0 + j < count.
    const V base = vset1(static_cast<float>(b0));
    for (int64_t v = 0; v < nqv; ++v) {
      const V fv = vsub(vload(first + v * W), base), cv = vsub(vload(count + v * W), base);
      const V neg = vset1(-INFINITY);
      V tmax = neg;
      for (int64_t j = 0; j < kTile; ++j) {
        const V jv = vset1(static_cast<float>(j));
        const V sj = vsel(vand(vle(fv, jv), vlt(jv, cv)), vload(s + j * qs + v * W), neg);
        vstore(s + j * qs + v * W, sj);
        tmax = vmax(tmax, sj);
      }
      const V m_old = vload(m + v * W);
      const V m_new = vmax(m_old, tmax);
      // A lane with no key yet keeps alpha 1 (its o and l are 0).
      const Mask live = vlt(neg, m_new);
      const V al = vsel(live, vexp(vsub(m_old, m_new)), vset1(1.0f));
      V sum = vzero();
      for (int64_t j = 0; j < kTile; ++j) {
        const V sj = vload(s + j * qs + v * W);
        const V pj = vsel(vlt(neg, sj), vexp(vsub(sj, m_new)), vzero());
        vstore(s + j * qs + v * W, pj);
        sum = vadd(sum, pj);
      }
      vstore(l + v * W, vadd(vmul(vload(l + v * W), al), sum));
      vstore(m + v * W, m_new);
      vstore(alpha + v * W, al);
    }
    for (int64_t v = 0; v < nqv; ++v)
      accumulate_pv(ot + v * W, qs, alpha + v * W, s + v * W, vf, hd, jn);
  }

  for (int64_t i = 0; i < nq; ++i) {
    const int64_t t = t0 + i / G, h = kvh * G + i % G;
    float* out = a.out + t * a.q_dim + h * hd;
    const float inv = 1.0f / l[i];
    for (int64_t d = 0; d < hd; ++d) out[d] = ot[d * qs + i] * inv;
  }
}

// The gated activations, the same arithmetic for every element: a tail
// shorter than a vector goes through the vector code on a padded copy, so an
// element's bits do not depend on where it sits in the array (batch width).
template <typename F>
void gated(float* gate, const float* up, int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + W <= n; i += W) vstore(gate + i, f(vload(gate + i), vload(up + i)));
  if (i < n) {
    float g[W] = {}, u[W] = {};
    std::memcpy(g, gate + i, static_cast<size_t>(n - i) * sizeof(float));
    std::memcpy(u, up + i, static_cast<size_t>(n - i) * sizeof(float));
    vstore(g, f(vload(g), vload(u)));
    std::memcpy(gate + i, g, static_cast<size_t>(n - i) * sizeof(float));
  }
}

}  // namespace

bool attend_supported(int64_t hd) {
  return hd % W == 0;
}

void attend_tile(const AttnArgs& a, const int32_t* table, int64_t t0, int64_t t1, int64_t kvh) {
  attend(a, table, t0, t1, kvh);
}

// gate = silu(gate) * up, silu(g) = g / (1 + e^-g).
void swiglu(float* gate, const float* up, int64_t n) {
  gated(gate, up, n,
        [](V g, V u) { return vmul(vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g)))), u); });
}

// gate = gelu(gate) * up, GELU's tanh form written as x * sigmoid(2z):
// 0.5 x (1 + tanh z) = x / (1 + e^-2z), z = sqrt(2/pi) (x + 0.044715 x^3).
void geglu(float* gate, const float* up, int64_t n) {
  gated(gate, up, n, [](V x, V u) {
    const V one = vset1(1.0f);
    const V z =
        vmul(vmul(vset1(-2.0f * 0.7978845608028654f), x), vfma(vset1(0.044715f), vmul(x, x), one));
    return vmul(vdiv(x, vadd(one, vexp(z))), u);
  });
}

}  // namespace barata::BARATA_ISA_NS
