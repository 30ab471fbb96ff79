// Dequant-dot kernels for barata's own types (int8 / int4 per tensor and per
// row, int4 group-128, NF4 block-64). AVX2 only: without it these types run
// on the reference kernel.
//
// Matrix-vector (decode): each weight row is decoded 32 weights at a time in
// registers and multiplied with the activation block right away; four rows
// share each activation load. Matrix-matrix (prefill, several tokens in a
// tile): the 4-bit rows of the tile are first widened into a small per-thread
// buffer (int8 levels, or fp32 for NF4), which every token of the tile then
// reads; the whole matrix is never expanded. Both paths do the same float
// operations in the same order for each output, so prefill and decode agree
// bit for bit.
#include <cstring>

#include "barata/half.h"
#include "cpu/matmul.h"
#include "barata/quant_blocks.h"
#include "dot.h"
#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

namespace barata::BARATA_ISA_NS {
namespace {

using simd::dot_u8_s8;
using simd::hsum;
using simd::unpack_nibbles;

enum class Scale { kNone, kRowHeader };

inline float read_f32(const uint8_t* p) {
  float d;
  std::memcpy(&d, p, sizeof d);
  return d;
}

// One integer row type: where its levels and scales are.
template <bool kNibbles, Scale kScale>
struct IntRow {
  const uint8_t* q = nullptr;  // levels (after the row header)
  float row_scale = 1.0f;      // applied once at the end (1 unless kRowHeader)

  IntRow() = default;
  IntRow(const uint8_t* row, int64_t)
      : q(kScale == Scale::kRowHeader ? row + 4 : row),
        row_scale(kScale == Scale::kRowHeader ? read_f32(row) : 1.0f) {}

  // Signed levels of chunk b (32 weights).
  __m256i levels(int64_t b) const {
    if constexpr (kNibbles) {
      return _mm256_sub_epi8(unpack_nibbles(q + 16 * b), _mm256_set1_epi8(8));
    } else {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * b));
    }
  }
  float chunk_scale(int64_t) const { return 1.0f; }
};

// s8 weights x s8 activations, exact in 32-bit lanes (|w| <= 127).
inline __m256 dot_s8_s8(__m256i w, __m256i x) {
  return dot_u8_s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// The per-output arithmetic shared by both paths:
//   out = row_scale * hsum(sum_b fma(chunk_scale_b * d_x_b, isum_b))
template <typename Row, int R>
void dot_int_rows(const uint8_t* w, size_t row_bytes, const BlockQ8Act* x, int64_t nb, float* out,
                  bool prefetch) {
  __m256 acc[R];
  Row rows[R];
  for (int r = 0; r < R; ++r) {
    rows[r] = Row(w + r * row_bytes, nb);
    acc[r] = _mm256_setzero_ps();
  }
  simd::AheadPrefetch ahead(w);  // the R rows, back to back: one stream
  for (int64_t b = 0; b < nb; ++b) {
    if (prefetch) ahead.upto(static_cast<size_t>(b + 1) * R * row_bytes / static_cast<size_t>(nb));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q));
    for (int r = 0; r < R; ++r) {
      const Row& row = rows[r];
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(row.chunk_scale(b) * x[b].d),
                               dot_s8_s8(row.levels(b), qx), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = rows[r].row_scale * hsum(acc[r]);
}

// The same arithmetic from a widened tile: levels[k] and chunk scales[nb] per row.
template <int R>
void dot_widened(const int8_t* const* lv, const float* const* cs, const float* rs,
                 const BlockQ8Act* x, int64_t nb, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q));
    for (int r = 0; r < R; ++r) {
      const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lv[r] + 32 * b));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(cs[r][b] * x[b].d), dot_s8_s8(qw, qx), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = rs[r] * hsum(acc[r]);
}

inline const BlockQ8Act* act_row(const uint8_t* acts, size_t stride, int64_t t) {
  return reinterpret_cast<const BlockQ8Act*>(acts + t * stride);
}

template <typename Row>
void int_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k, const uint8_t* acts,
              size_t act_stride, int64_t n_tokens, float* out, size_t ldy, bool widen) {
  const int64_t nb = k / 32;
  float res[4];
  if (!widen || n_tokens == 1) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      const BlockQ8Act* x = act_row(acts, act_stride, t);
      int64_t r = 0;
      for (; r + 4 <= n_rows; r += 4) {
        dot_int_rows<Row, 4>(w + r * row_bytes, row_bytes, x, nb, res, n_tokens == 1);
        for (int i = 0; i < 4; ++i) out[t * ldy + r + i] = res[i];
      }
      for (; r < n_rows; ++r) {
        dot_int_rows<Row, 1>(w + r * row_bytes, row_bytes, x, nb, res, false);
        out[t * ldy + r] = res[0];
      }
    }
    return;
  }
  // Widen the tile's rows once, then every token reads the int8 copy.
  thread_local Scratch<int8_t> lv_scratch;
  thread_local Scratch<float> cs_scratch, rs_scratch;  // reused: no allocation per tile
  int8_t* const lv_buf = lv_scratch.get(static_cast<size_t>(n_rows * k));
  float* const cs_buf = cs_scratch.get(static_cast<size_t>(n_rows * nb));
  float* const rs = rs_scratch.get(static_cast<size_t>(n_rows));
  for (int64_t r = 0; r < n_rows; ++r) {
    const Row row(w + r * row_bytes, nb);
    rs[static_cast<size_t>(r)] = row.row_scale;
    for (int64_t b = 0; b < nb; ++b) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lv_buf + r * k + 32 * b), row.levels(b));
      cs_buf[static_cast<size_t>(r * nb + b)] = row.chunk_scale(b);
    }
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    const BlockQ8Act* x = act_row(acts, act_stride, t);
    int64_t r = 0;
    for (; r < n_rows; r += 4) {
      const int R = r + 4 <= n_rows ? 4 : 1;
      const int8_t* lv[4];
      const float* cs[4];
      for (int i = 0; i < R; ++i) {
        lv[i] = lv_buf + (r + i) * k;
        cs[i] = cs_buf + (r + i) * nb;
      }
      if (R == 4) {
        dot_widened<4>(lv, cs, rs + r, x, nb, res);
        for (int i = 0; i < 4; ++i) out[t * ldy + r + i] = res[i];
      } else {
        for (; r < n_rows; ++r) {
          lv[0] = lv_buf + r * k;
          cs[0] = cs_buf + r * nb;
          dot_widened<1>(lv, cs, rs + r, x, nb, res);
          out[t * ldy + r] = res[0];
        }
        break;
      }
    }
  }
}

// ---- NF4 (fp32 activations) -----------------------------------------------------
// The code book as four byte planes (byte k of each value's fp32 bits), in
// both 128-bit lanes, for in-lane byte shuffles.
struct NF4Planes {
  __m256i p[4];
  NF4Planes() {
    alignas(16) uint8_t bytes[4][16];
    for (int i = 0; i < 16; ++i) {
      uint32_t u;
      std::memcpy(&u, &kNF4Values[i], 4);
      for (int k = 0; k < 4; ++k) bytes[k][i] = static_cast<uint8_t>(u >> (8 * k));
    }
    for (int k = 0; k < 4; ++k) {
      const __m128i t = _mm_load_si128(reinterpret_cast<const __m128i*>(bytes[k]));
      p[k] = _mm256_set_m128i(t, t);
    }
  }
};

// Block of 64 weights as 8 vectors of d * code[i], handed to use(offset, v)
// in element order. Per run of 32: the indices are regrouped by 4 so that
// each lane holds alternate groups (one cross-lane permute), four byte
// shuffles look up the bytes of the code values, and two rounds of unpacking
// assemble them into floats already in element order. Cross-lane float
// permutes (two per 8 weights) cost several times more on current x86 cores.
template <typename Use>
inline void nf4_block(const BlockNF4& blk, const NF4Planes& t, Use&& use) {
  const __m256 d = _mm256_set1_ps(fp16_to_fp32(blk.d));
  const __m256i groups = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  for (int half = 0; half < 2; ++half) {
    const __m256i idx = _mm256_permutevar8x32_epi32(unpack_nibbles(blk.qs + 16 * half), groups);
    const __m256i b0 = _mm256_shuffle_epi8(t.p[0], idx), b1 = _mm256_shuffle_epi8(t.p[1], idx);
    const __m256i b2 = _mm256_shuffle_epi8(t.p[2], idx), b3 = _mm256_shuffle_epi8(t.p[3], idx);
    const __m256i lo01 = _mm256_unpacklo_epi8(b0, b1), hi01 = _mm256_unpackhi_epi8(b0, b1);
    const __m256i lo23 = _mm256_unpacklo_epi8(b2, b3), hi23 = _mm256_unpackhi_epi8(b2, b3);
    const int at = 32 * half;
    use(at, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(lo01, lo23)), d));
    use(at + 8, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(lo01, lo23)), d));
    use(at + 16, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(hi01, hi23)), d));
    use(at + 24, _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(hi01, hi23)), d));
  }
}

inline void nf4_decode(const BlockNF4& blk, const NF4Planes& t, float* v) {
  nf4_block(blk, t, [v](int at, __m256 w) { _mm256_storeu_ps(v + at, w); });
}

// out[r] = hsum(sum_i fma(w_i, x_i)) over 8-wide lanes, one chain per row.
template <int R>
void dot_nf4_rows(const BlockNF4* const* rows, const float* x, int64_t nb, float* out,
                  bool prefetch, size_t row_bytes) {
  static const NF4Planes t;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  simd::AheadPrefetch ahead(rows[0]);  // the R rows lie back to back
  for (int64_t b = 0; b < nb; ++b) {
    if (prefetch) ahead.upto(static_cast<size_t>(b + 1) * R * row_bytes / static_cast<size_t>(nb));
    const float* xb = x + 64 * b;
    for (int r = 0; r < R; ++r) {
      __m256 a = acc[r];
      nf4_block(rows[r][b], t, [&a, xb](int at, __m256 w) {
        a = _mm256_fmadd_ps(w, _mm256_loadu_ps(xb + at), a);
      });
      acc[r] = a;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

template <int R>
void dot_f32_rows(const float* const* rows, const float* x, int64_t k, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(rows[r] + i), xv, acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

}  // namespace

#define BARATA_INT_TILE(fn, nib, scale, widen)                                                  \
  BARATA_DOT_TILE(fn) {                                                                         \
    int_tile<IntRow<nib, scale>>(w, row_bytes, n_rows, k, acts, act_stride, n_tokens, out, ldy, \
                                 widen);                                                        \
  }

BARATA_INT_TILE(dot_tile_i8_tensor_q8, false, Scale::kNone, false)
BARATA_INT_TILE(dot_tile_i8_row_q8, false, Scale::kRowHeader, false)
BARATA_INT_TILE(dot_tile_i4_row_q8, true, Scale::kRowHeader, true)

BARATA_DOT_TILE(dot_tile_nf4_f32) {
  const int64_t nb = k / kQKNF4;
  float res[4];
  auto row = [&](int64_t r) { return reinterpret_cast<const BlockNF4*>(w + r * row_bytes); };
  auto x_of = [&](int64_t t) { return reinterpret_cast<const float*>(acts + t * act_stride); };
  if (n_tokens == 1) {
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
      const BlockNF4* rows[4] = {row(r), row(r + 1), row(r + 2), row(r + 3)};
      dot_nf4_rows<4>(rows, x_of(0), nb, res, true, row_bytes);
      for (int i = 0; i < 4; ++i) out[r + i] = res[i];
    }
    for (; r < n_rows; ++r) {
      const BlockNF4* rows[1] = {row(r)};
      dot_nf4_rows<1>(rows, x_of(0), nb, res, false, row_bytes);
      out[r] = res[0];
    }
    return;
  }
  static const NF4Planes planes;
  thread_local Scratch<float> scratch;
  float* const buf = scratch.get(static_cast<size_t>(n_rows * k));
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t b = 0; b < nb; ++b) nf4_decode(row(r)[b], planes, buf + r * k + b * kQKNF4);
  for (int64_t t = 0; t < n_tokens; ++t) {
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
      const float* rows[4] = {&buf[r * k], &buf[(r + 1) * k], &buf[(r + 2) * k], &buf[(r + 3) * k]};
      dot_f32_rows<4>(rows, x_of(t), k, res);
      for (int i = 0; i < 4; ++i) out[t * ldy + r + i] = res[i];
    }
    for (; r < n_rows; ++r) {
      const float* rows[1] = {&buf[r * k]};
      dot_f32_rows<1>(rows, x_of(t), k, res);
      out[t * ldy + r] = res[0];
    }
  }
}

}  // namespace barata::BARATA_ISA_NS

#endif
