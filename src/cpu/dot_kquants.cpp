// The AVX2 kernel for Q5_1 (blocks of 32; layout: llama.cpp ggml-common.h,
// b4748), the one llama.cpp block type without a 16-row layout: the others
// run on the 8-row kernels (dot_r8.cpp). A step turns 32 weights into bytes,
// takes the exact integer dot with the activation's int8 values and adds it,
// scaled, to one FMA chain per row; the min goes through the activation
// block's precomputed d * sum(q).
#include <cstring>

#include "barata/half.h"
#include "cpu/matmul.h"
#include "barata/quant_blocks.h"
#include "dot.h"
#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

namespace barata::BARATA_ISA_NS {
namespace {

using simd::hsum;
using simd::unpack_nibbles;

// 32 bits -> 32 bytes: 0x10 where bit i of `bits` is set (the fifth bit of
// element i), 0 elsewhere.
inline __m256i fifth_bits(uint32_t bits) {
  // byte i of the broadcast holds source byte i / 8; keep its bit i % 8.
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i select = _mm256_set1_epi64x(0x8040201008040201);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// ---- per-type decoders ------------------------------------------------------------
// decode(row, b) gives chunk b (32 weights) as unsigned levels q, the scale
// of their integer dot and the constant `min` (the chunk contributes
// scale * d_x * dot(q, x) - min * d_x * sum(x)).
struct Chunk {
  __m256i q;
  float scale, min;
};

struct Q5_1Dec {
  static Chunk decode(const uint8_t* row, int64_t b) {
    const auto& blk = reinterpret_cast<const BlockQ5_1*>(row)[b];
    uint32_t qh;
    std::memcpy(&qh, blk.qh, 4);
    return {_mm256_or_si256(unpack_nibbles(blk.qs), fifth_bits(qh)), fp16_to_fp32(blk.d),
            -fp16_to_fp32(blk.m)};
  }
};

// acc += scale * d_x * dot(q, x) (exact integers), off -= min * d_x * sum(x).
template <typename Dec>
inline __m256 apply(const Chunk& c, const BlockQ8Act& x, __m256 acc, float& off) {
  const __m256i xq = load32(x.q);
  const __m256i p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(c.q, xq), _mm256_set1_epi16(1));
  off -= c.min * x.s;
  return _mm256_fmadd_ps(_mm256_set1_ps(c.scale * x.d), _mm256_cvtepi32_ps(p32), acc);
}

// Matrix-vector: chunks decoded in registers, four rows per activation load.
template <typename Dec, int R>
void rows_dot(const uint8_t* w, size_t row_bytes, const BlockQ8Act* x, int64_t nb, float* out,
              bool prefetch) {
  __m256 acc[R];
  float off[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    off[r] = 0.0f;
  }
  simd::AheadPrefetch ahead(w);  // the R rows, back to back: one stream
  for (int64_t b = 0; b < nb; ++b) {
    if (prefetch) ahead.upto(static_cast<size_t>(b + 1) * R * row_bytes / static_cast<size_t>(nb));
    for (int r = 0; r < R; ++r)
      acc[r] = apply<Dec>(Dec::decode(w + r * row_bytes, b), x[b], acc[r], off[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) + off[r];
}

// Matrix-matrix: the tile's rows are decoded once into a per-thread buffer of
// chunks, which every token then reads; the same apply() per output.
template <typename Dec, int R>
void rows_dot_wide(const Chunk* const* rows, const BlockQ8Act* x, int64_t nb, float* out) {
  __m256 acc[R];
  float off[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    off[r] = 0.0f;
  }
  for (int64_t b = 0; b < nb; ++b)
    for (int r = 0; r < R; ++r) acc[r] = apply<Dec>(rows[r][b], x[b], acc[r], off[r]);
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) + off[r];
}

// A few tokens (a speculative verify pass, a small batch): each chunk is
// decoded once in registers and applied to every token, so the decoding is
// shared; each output gets the same apply() sequence as in rows_dot. Up to 8
// (at 9 the accumulators spill: slower than the decoded-tile path below).
template <typename Dec, int T>
void row_dot_tokens(const uint8_t* w, const BlockQ8Act* const* x, int64_t nb, float* out,
                    size_t ldy) {
  __m256 acc[T];
  float off[T];
  for (int t = 0; t < T; ++t) {
    acc[t] = _mm256_setzero_ps();
    off[t] = 0.0f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const Chunk c = Dec::decode(w, b);
    for (int t = 0; t < T; ++t) acc[t] = apply<Dec>(c, x[t][b], acc[t], off[t]);
  }
  for (int t = 0; t < T; ++t) out[static_cast<size_t>(t) * ldy] = hsum(acc[t]) + off[t];
}

template <typename Dec, int T>
void tile_tokens(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t nb,
                 const BlockQ8Act* const* x, float* out, size_t ldy) {
  for (int64_t r = 0; r < n_rows; ++r)
    row_dot_tokens<Dec, T>(w + r * row_bytes, x, nb, out + r, ldy);
}

template <typename Dec>
void tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k, const uint8_t* acts,
          size_t act_stride, int64_t n_tokens, float* out, size_t ldy) {
  const int64_t nb = k / 32;
  float res[4];
  auto x_of = [&](int64_t t) { return reinterpret_cast<const BlockQ8Act*>(acts + t * act_stride); };
  if (n_tokens >= 2 && n_tokens <= 8) {
    const BlockQ8Act* x[8];
    for (int64_t t = 0; t < n_tokens; ++t) x[t] = x_of(t);
    switch (n_tokens) {
      case 2:
        return tile_tokens<Dec, 2>(w, row_bytes, n_rows, nb, x, out, ldy);
      case 3:
        return tile_tokens<Dec, 3>(w, row_bytes, n_rows, nb, x, out, ldy);
      case 4:
        return tile_tokens<Dec, 4>(w, row_bytes, n_rows, nb, x, out, ldy);
      case 5:
        return tile_tokens<Dec, 5>(w, row_bytes, n_rows, nb, x, out, ldy);
      case 6:
        return tile_tokens<Dec, 6>(w, row_bytes, n_rows, nb, x, out, ldy);
      case 7:
        return tile_tokens<Dec, 7>(w, row_bytes, n_rows, nb, x, out, ldy);
      default:
        return tile_tokens<Dec, 8>(w, row_bytes, n_rows, nb, x, out, ldy);
    }
  }
  if (n_tokens < 4) {
    for (int64_t t = 0; t < n_tokens; ++t) {
      int64_t r = 0;
      for (; r + 4 <= n_rows; r += 4) {
        rows_dot<Dec, 4>(w + r * row_bytes, row_bytes, x_of(t), nb, res, n_tokens == 1);
        for (int i = 0; i < 4; ++i) out[t * ldy + r + i] = res[i];
      }
      for (; r < n_rows; ++r) {
        rows_dot<Dec, 1>(w + r * row_bytes, row_bytes, x_of(t), nb, res, false);
        out[t * ldy + r] = res[0];
      }
    }
    return;
  }
  thread_local Scratch<Chunk> scratch;
  Chunk* const wide = scratch.get(static_cast<size_t>(n_rows * nb));
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t b = 0; b < nb; ++b)
      wide[static_cast<size_t>(r * nb + b)] = Dec::decode(w + r * row_bytes, b);
  for (int64_t t = 0; t < n_tokens; ++t) {
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
      const Chunk* rows[4] = {&wide[r * nb], &wide[(r + 1) * nb], &wide[(r + 2) * nb],
                              &wide[(r + 3) * nb]};
      rows_dot_wide<Dec, 4>(rows, x_of(t), nb, res);
      for (int i = 0; i < 4; ++i) out[t * ldy + r + i] = res[i];
    }
    for (; r < n_rows; ++r) {
      const Chunk* rows[1] = {&wide[r * nb]};
      rows_dot_wide<Dec, 1>(rows, x_of(t), nb, res);
      out[t * ldy + r] = res[0];
    }
  }
}

}  // namespace

BARATA_DOT_TILE(dot_tile_q5_1_q8) {
  tile<Q5_1Dec>(w, row_bytes, n_rows, k, acts, act_stride, n_tokens, out, ldy);
}

}  // namespace barata::BARATA_ISA_NS

#endif
