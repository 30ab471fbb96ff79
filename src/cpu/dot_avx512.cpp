// AVX-512 kernels (F, BW, VL, DQ and VNNI), built only into the avx512 copy
// (see dot.h). docs/cpu.md describes them with their measurements.
//
// Most types run on 16-row interleaved layouts that the CPU backend makes at
// load (repack functions below; the file stays as it is): one row per lane,
// so vpdpbusd against 4 broadcast activation bytes (or, for the float types,
// one FMA against a broadcast x_j) gives 16 rows' partial sums at once and the
// block scales of 16 rows are one vector. Each such type also has a kernel on
// the file's rows that does exactly the same operations (bit-identical), used
// when repacking is off.
//
// Q5_1, int8 and int4 per row read the file's rows 64 weights per step as 16
// lanes of 4 ("units"), R rows x T tokens per register tile. NF4 looks its
// code book up with vpermps.
#include <cstring>
#include <type_traits>

#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "dot.h"
#include "simd.h"

#if defined(BARATA_HAVE_AVX512_KERNELS)
#include <immintrin.h>

#include <algorithm>
#include <cmath>

// GCC 12's _mm512_cast*256*512 read an "undefined" register that it then warns about.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace barata::BARATA_ISA_NS {
namespace {

inline const BlockQ8Act* act_row(const uint8_t* acts, size_t stride, int64_t t) {
  return reinterpret_cast<const BlockQ8Act*>(acts + t * stride);
}

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
inline __m128i load128(const void* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// a in lanes 0..7, b in lanes 8..15.
inline __m512 halves(float a, float b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b), 1);
}

// 32 bytes holding two runs of Q4_0-style nibbles (bytes 0..15: run a, 16..31:
// run b; a byte's low nibble is element j, its high one element j + 16)
// -> 64 bytes in element order: lo a, hi a, lo b, hi b.
inline __m512i spread_runs(__m256i ab) {
  const __m512i z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                             _mm512_castsi256_si512(ab));
  return _mm512_and_si512(_mm512_srlv_epi64(z, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                          _mm512_set1_epi8(0x0f));
}
inline __m512i nibble_runs(const uint8_t* a, const uint8_t* b) {
  return spread_runs(_mm256_inserti128_si256(_mm256_castsi128_si256(load128(a)), load128(b), 1));
}
inline __m512i join(const void* a, const void* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(a)), load256(b), 1);
}
inline uint32_t read_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float read_f32(const void* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// ---- decoders on the file's rows: unit u (weights 64u .. 64u + 63) of one row ------
// A unit becomes 64 unsigned bytes q and, per 4-byte lane, a scale dv and for
// some types a min mv, such that each weight is
//     w = dv * (q - kOffset)        (int8, int4: kMin false)
//     w = dv * q + mv               (Q5_1: kMin)
// vpdpbusd against the activation's 64 int8 values gives exact lane sums; the
// offset rides in its accumulator input (-kOffset * the lane's sum of x), the
// mins go through one more FMA with d_x * (the lane's sum of x).
struct Unit {
  __m512i q;
  __m512 dv;
  __m512 mv;  // kMin types only
};

// The fifth bits of two blocks (32 each, bit i = element i) added as 16.
inline __m512i add_fifth(__m512i q, uint32_t qa, uint32_t qb) {
  const __mmask64 m = static_cast<__mmask64>(qa) | (static_cast<__mmask64>(qb) << 32);
  return _mm512_mask_add_epi8(q, m, q, _mm512_set1_epi8(16));
}

struct Q5_1D {
  static constexpr bool kMin = true;
  static constexpr int kOffset = 0;
  const BlockQ5_1* b;
  Q5_1D(const uint8_t* row, int64_t) : b(reinterpret_cast<const BlockQ5_1*>(row)) {}
  const void* at(int64_t u) const { return b + 2 * u; }
  void unit(int64_t u, Unit& o) const {
    const BlockQ5_1* x = b + 2 * u;
    o.q = add_fifth(nibble_runs(x[0].qs, x[1].qs), read_u32(x[0].qh), read_u32(x[1].qh));
    o.dv = halves(fp16_to_fp32(x[0].d), fp16_to_fp32(x[1].d));
    o.mv = halves(fp16_to_fp32(x[0].m), fp16_to_fp32(x[1].m));
  }
};

// barata's int8 / int4 rows (docs/quantize.md): per-row types start with an
// fp32 d, I4_G128 with one fp16 d per 128 weights; per-tensor types have unit
// scale here (the matrix's d is applied by the matmul driver).
enum class RowScale { kNone, kHeader, kGroup128 };

template <RowScale kScale>
struct I8D {
  static constexpr bool kMin = false;
  static constexpr int kOffset = 128;
  const uint8_t* q;
  float d;
  I8D(const uint8_t* row, int64_t)
      : q(kScale == RowScale::kHeader ? row + 4 : row),
        d(kScale == RowScale::kHeader ? read_f32(row) : 1.0f) {}
  const void* at(int64_t u) const { return q + 64 * u; }
  void unit(int64_t u, Unit& o) const {
    o.q =
        _mm512_xor_si512(_mm512_loadu_si512(q + 64 * u), _mm512_set1_epi8(static_cast<char>(0x80)));
    o.dv = _mm512_set1_ps(d);
  }
};

template <RowScale kScale>
struct I4D {
  static constexpr bool kMin = false;
  static constexpr int kOffset = 8;  // stored level + 8
  const uint8_t* q;
  const uint8_t* groups;
  float d;
  I4D(const uint8_t* row, int64_t nu)
      : q(kScale == RowScale::kHeader     ? row + 4
          : kScale == RowScale::kGroup128 ? row + 2 * ((2 * nu + 3) / 4)
                                          : row),
        groups(row),
        d(kScale == RowScale::kHeader ? read_f32(row) : 1.0f) {}
  const void* at(int64_t u) const { return q + 32 * u; }
  void unit(int64_t u, Unit& o) const {
    o.q = spread_runs(load256(q + 32 * u));
    if constexpr (kScale == RowScale::kGroup128) {
      uint16_t h;
      std::memcpy(&h, groups + 2 * (u / 2), 2);
      o.dv = _mm512_set1_ps(fp16_to_fp32(h));
    } else {
      o.dv = _mm512_set1_ps(d);
    }
  }
};

#include "r16_layout.h"  // IWYU pragma: keep (inside the ISA namespace)

// ---- the tile ---------------------------------------------------------------------
template <typename Dec, int R, int T>
void q_tile(const Dec* rows, size_t row_bytes, int64_t nu, const BlockQ8Act* const* x, float* out,
            size_t ldy) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  // The R rows lie back to back: one linear stream, consumed evenly over the
  // units (R short rows read side by side are too broken up a pattern for
  // the hardware prefetcher to run far enough ahead on its own).
  const auto* base = static_cast<const uint8_t*>(rows[0].at(0));
  AheadPrefetch ahead(base);
  for (int64_t u = 0; u < nu; ++u) {
    ahead.upto(static_cast<size_t>(u + 1) * R * row_bytes / static_cast<size_t>(nu));
    Unit w[R];
    for (int r = 0; r < R; ++r) rows[r].unit(u, w[r]);
    for (int t = 0; t < T; ++t) {
      const BlockQ8Act* xb = x[t] + 2 * u;
      const __m512i xq = join(xb[0].q, xb[1].q);
      const __m512 dx = halves(xb[0].d, xb[1].d);
      if constexpr (Dec::kMin) {
        const __m512 ds = _mm512_mul_ps(
            dx, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, _mm512_set1_epi8(1), xq)));
        for (int r = 0; r < R; ++r) {
          const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, w[r].q, xq));
          acc[r][t] = _mm512_fmadd_ps(p, _mm512_mul_ps(w[r].dv, dx), acc[r][t]);
          acc[r][t] = _mm512_fmadd_ps(w[r].mv, ds, acc[r][t]);
        }
      } else {
        const __m512i off = _mm512_sub_epi32(
            zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(static_cast<char>(Dec::kOffset)), xq));
        for (int r = 0; r < R; ++r) {
          const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(off, w[r].q, xq));
          acc[r][t] = _mm512_fmadd_ps(p, _mm512_mul_ps(w[r].dv, dx), acc[r][t]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      out[static_cast<size_t>(t) * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

// Tokens in groups of up to kMaxT for one group of R rows.
template <typename Dec, int R>
void q_tokens(const Dec* rows, size_t row_bytes, int64_t nu, const uint8_t* acts, size_t act_stride,
              int64_t n_tokens, float* out, size_t ldy) {
  // The min types hold one more vector per row: 3 tokens keep them in registers.
  constexpr int kMaxT = Dec::kMin ? 3 : 4;
  for (int64_t t = 0; t < n_tokens;) {
    const BlockQ8Act* x[kMaxT];
    const int nt = static_cast<int>(std::min<int64_t>(kMaxT, n_tokens - t));
    for (int i = 0; i < nt; ++i) x[i] = act_row(acts, act_stride, t + i);
    float* o = out + static_cast<size_t>(t) * ldy;
    switch (nt) {
      case 4:
        if constexpr (kMaxT >= 4) q_tile<Dec, R, 4>(rows, row_bytes, nu, x, o, ldy);
        break;
      case 3:
        q_tile<Dec, R, 3>(rows, row_bytes, nu, x, o, ldy);
        break;
      case 2:
        q_tile<Dec, R, 2>(rows, row_bytes, nu, x, o, ldy);
        break;
      default:
        q_tile<Dec, R, 1>(rows, row_bytes, nu, x, o, ldy);
        break;
    }
    t += nt;
  }
}

template <typename Dec>
void q_matmul_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                   const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                   size_t ldy) {
  const int64_t nu = k / 64;
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    const Dec rows[4] = {Dec(w + r * row_bytes, nu), Dec(w + (r + 1) * row_bytes, nu),
                         Dec(w + (r + 2) * row_bytes, nu), Dec(w + (r + 3) * row_bytes, nu)};
    q_tokens<Dec, 4>(rows, row_bytes, nu, acts, act_stride, n_tokens, out + r, ldy);
  }
  for (; r < n_rows; ++r) {
    const Dec rows[1] = {Dec(w + r * row_bytes, nu)};
    q_tokens<Dec, 1>(rows, row_bytes, nu, acts, act_stride, n_tokens, out + r, ldy);
  }
}

inline __m512i bcast4(const int8_t* q) {
  return _mm512_set1_epi32(static_cast<int>(read_u32(q)));
}

// One block of 32 weights of 16 interleaved rows against one token: the exact
// integer dot (two chains of four vpdpbusd, the first starting from -o * sum(q)
// for the constant-offset types), then acc = fma(dot, dv * d_x, acc), and for
// Q4_1 acc = fma(m, s_x, acc) (r16_layout.h).
template <RKind K>
inline __m512 block_step(const __m512i u[8], __m512 dv, __m512 mv, const BlockQ8Act& xb,
                         __m512 acc) {
  using L = RLayout<K>;
  __m512i i0 = _mm512_dpbusd_epi32(
      L::kMin ? _mm512_setzero_si512() : _mm512_set1_epi32(-L::kOffset * xb.sum), u[0],
      bcast4(xb.q));
  __m512i i1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[1], bcast4(xb.q + 4));
  i0 = _mm512_dpbusd_epi32(i0, u[2], bcast4(xb.q + 8));
  i1 = _mm512_dpbusd_epi32(i1, u[3], bcast4(xb.q + 12));
  i0 = _mm512_dpbusd_epi32(i0, u[4], bcast4(xb.q + 16));
  i1 = _mm512_dpbusd_epi32(i1, u[5], bcast4(xb.q + 20));
  i0 = _mm512_dpbusd_epi32(i0, u[6], bcast4(xb.q + 24));
  i1 = _mm512_dpbusd_epi32(i1, u[7], bcast4(xb.q + 28));
  const __m512 p = _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1));
  acc = _mm512_fmadd_ps(p, _mm512_mul_ps(dv, _mm512_set1_ps(xb.d)), acc);
  if constexpr (L::kMin) acc = _mm512_fmadd_ps(mv, _mm512_set1_ps(xb.s), acc);
  return acc;
}

// Software prefetch (simd::AheadPrefetch, simd.h): the group's bytes
// BARATA_R_AHEAD ahead into L2 (prefetcht1), BARATA_R_NEAR ahead into L1.
// The L2 distance was chosen when each section was prefetched alone. Measured on the Qwen 0.5B
// shape's Q4_0 decode at t=1 (2026-12-04, Zen 5 VM), per section: prefetcht0
// 4 KiB ahead 47 tokens/s; prefetcht1 4 KiB 61, 8 KiB 72, 16 KiB 76-82, 32
// KiB 81-83. An L1 prefetch holds one of the few L1 miss buffers until its
// line arrives; into L2 many more lines are in flight, which is what a DRAM
// stream at this rate needs.

template <RKind K, int T>
void r_tile(const uint8_t* grp, int64_t nb, const BlockQ8Act* const* x, float* out, size_t ldy,
            int n_valid) {
  using L = RLayout<K>;
  const uint8_t* codes = grp;
  const uint8_t* dsec = codes + nb * L::kCodes;
  const uint8_t* msec = dsec + nb * L::kD;
  const uint8_t* hsec = msec + nb * L::kM;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512i table = _mm512_setzero_si512();
  if constexpr (K == RKind::kNibTable) {
    alignas(16) uint8_t tb[16];
    for (int i = 0; i < 16; ++i) tb[i] = static_cast<uint8_t>(kIQ4NLValues[i] + 128);
    table = _mm512_broadcast_i32x4(load128(tb));
  }
  AheadPrefetch ahead(grp);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* c = codes + b * L::kCodes;
    ahead.upto(static_cast<size_t>(b + 1) * L::kBlock);
    __m512i u[8];
    if constexpr (K == RKind::kByte) {
      for (int g = 0; g < 8; ++g) u[g] = _mm512_loadu_si512(c + 64 * g);
    } else {
      for (int i = 0; i < 4; ++i) {
        const __m512i w = _mm512_loadu_si512(c + 64 * i);
        u[2 * i] = _mm512_and_si512(w, low);
        u[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
      }
      if constexpr (K == RKind::kNibTable)
        for (int g = 0; g < 8; ++g) u[g] = _mm512_shuffle_epi8(table, u[g]);
      if constexpr (K == RKind::kNib5) {
        const uint8_t* h = hsec + b * L::kHigh;
        for (int g = 0; g < 8; ++g) {
          uint64_t bits;
          std::memcpy(&bits, h + 8 * g, 8);
          u[g] =
              _mm512_mask_add_epi8(u[g], static_cast<__mmask64>(bits), u[g], _mm512_set1_epi8(16));
        }
      }
    }
    const __m512 dv = _mm512_cvtph_ps(load256(dsec + b * L::kD));
    const __m512 mv = L::kMin ? _mm512_cvtph_ps(load256(msec + b * L::kM)) : _mm512_setzero_ps();
    for (int t = 0; t < T; ++t) {
      const BlockQ8Act& xb = x[t][b];
      acc[t] = block_step<K>(u, dv, mv, xb, acc[t]);
    }
  }
  const __mmask16 m = static_cast<__mmask16>((1u << n_valid) - 1);
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(out + static_cast<size_t>(t) * ldy, m, acc[t]);
}

// Runs tile(T, group, x, out, n_valid) over the 16-row groups of a repacked
// tile and its tokens, 8, 4, 2 or 1 at a time (T an integral_constant); X is
// the activation row type.
template <typename X, typename Tile>
void over_groups(const uint8_t* w, size_t row_bytes, int64_t n_rows, const uint8_t* acts,
                 size_t act_stride, int64_t n_tokens, float* out, size_t ldy, const Tile& tile) {
  for (int64_t g = 0; g * 16 < n_rows; ++g) {
    const uint8_t* grp = w + static_cast<size_t>(g * 16) * row_bytes;
    const int n_valid = static_cast<int>(std::min<int64_t>(16, n_rows - g * 16));
    for (int64_t t = 0; t < n_tokens;) {
      const X* x[8];
      const int64_t left = n_tokens - t;
      const int nt = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      for (int i = 0; i < nt; ++i) x[i] = reinterpret_cast<const X*>(acts + (t + i) * act_stride);
      float* o = out + g * 16 + static_cast<size_t>(t) * ldy;
      switch (nt) {
        case 8:
          tile(std::integral_constant<int, 8>{}, grp, x, o, n_valid);
          break;
        case 4:
          tile(std::integral_constant<int, 4>{}, grp, x, o, n_valid);
          break;
        case 2:
          tile(std::integral_constant<int, 2>{}, grp, x, o, n_valid);
          break;
        default:
          tile(std::integral_constant<int, 1>{}, grp, x, o, n_valid);
          break;
      }
      t += nt;
    }
  }
}

template <RKind K>
void r_matmul_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                   const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                   size_t ldy) {
  over_groups<BlockQ8Act>(
      w, row_bytes, n_rows, acts, act_stride, n_tokens, out, ldy,
      [&](auto T, const uint8_t* grp, const BlockQ8Act* const* x, float* o, int n_valid) {
        r_tile<K, decltype(T)::value>(grp, k / 32, x, o, ldy, n_valid);
      });
}

// ---- repacked K-quants (Q4_K, Q5_K, Q6_K): layouts in r16_layout.h ---------------

template <KKind K, int T>
void k_tile(const uint8_t* grp, int64_t nb, const BlockQ8Act* const* x, float* out, size_t ldy,
            int n_valid) {
  using L = KLayout<K>;
  const uint8_t* codes = grp;
  const uint8_t* high = codes + nb * L::kCodes;
  const uint8_t* super = high + nb * L::kHigh;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0f);
  const __m512 neg = _mm512_set1_ps(-0.0f);
  __m512 dvec = _mm512_setzero_ps(), dminv = _mm512_setzero_ps();
  AheadPrefetch ahead(grp);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sp = super + (b / 8) * L::kSuper;
    const int sub = static_cast<int>(b % 8);
    if (sub == 0) {
      dvec = _mm512_cvtph_ps(load256(sp));
      if constexpr (K != KKind::kQ6K) dminv = _mm512_cvtph_ps(load256(sp + 32));
    }
    const uint8_t* c = codes + b * L::kCodes;
    ahead.upto(static_cast<size_t>(b + 1) * L::kGroupPerSuper / 8);
    __m512i u[8];
    for (int i = 0; i < 4; ++i) {
      const __m512i w = _mm512_loadu_si512(c + 64 * i);
      u[2 * i] = _mm512_and_si512(w, low);
      u[2 * i + 1] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
    }
    const uint8_t* h = high + b * L::kHigh;
    if constexpr (K == KKind::kQ5K) {
      for (int g = 0; g < 8; ++g) {
        uint64_t bits;
        std::memcpy(&bits, h + 8 * g, 8);
        u[g] = _mm512_mask_add_epi8(u[g], static_cast<__mmask64>(bits), u[g], _mm512_set1_epi8(16));
      }
    } else if constexpr (K == KKind::kQ6K) {
      const __m512i three = _mm512_set1_epi8(0x03);
      for (int hw = 0; hw < 2; ++hw) {
        const __m512i w = _mm512_loadu_si512(h + 64 * hw);
        for (int s = 0; s < 4; ++s) {
          const __m512i hb = _mm512_and_si512(_mm512_srli_epi16(w, 2 * s), three);
          u[4 * hw + s] = _mm512_or_si512(u[4 * hw + s], _mm512_slli_epi16(hb, 4));
        }
      }
    }
    auto scale = [&](const uint8_t* bytes, bool is_signed) {
      const __m128i v = load128(bytes);
      return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v));
    };
    if constexpr (K == KKind::kQ6K) {
      const __m512 dva = _mm512_mul_ps(scale(sp + 32 + 16 * (2 * sub), true), dvec);
      const __m512 dvb = _mm512_mul_ps(scale(sp + 32 + 16 * (2 * sub + 1), true), dvec);
      for (int t = 0; t < T; ++t) {
        const BlockQ8Act& xb = x[t][b];
        int32_t sa, sb;
        half_sums(xb.q, sa, sb);
        __m512i a0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-32 * sa), u[0], bcast4(xb.q));
        __m512i a1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[1], bcast4(xb.q + 4));
        __m512i b0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(-32 * sb), u[4], bcast4(xb.q + 16));
        __m512i b1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[5], bcast4(xb.q + 20));
        a0 = _mm512_dpbusd_epi32(a0, u[2], bcast4(xb.q + 8));
        a1 = _mm512_dpbusd_epi32(a1, u[3], bcast4(xb.q + 12));
        b0 = _mm512_dpbusd_epi32(b0, u[6], bcast4(xb.q + 24));
        b1 = _mm512_dpbusd_epi32(b1, u[7], bcast4(xb.q + 28));
        const __m512 dx = _mm512_set1_ps(xb.d);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)),
                                 _mm512_mul_ps(dva, dx), acc[t]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(b0, b1)),
                                 _mm512_mul_ps(dvb, dx), acc[t]);
      }
    } else {
      const __m512 dv = _mm512_mul_ps(scale(sp + 64 + 16 * sub, false), dvec);
      const __m512 mv =
          _mm512_xor_ps(_mm512_mul_ps(scale(sp + 64 + 128 + 16 * sub, false), dminv), neg);
      for (int t = 0; t < T; ++t) {
        const BlockQ8Act& xb = x[t][b];
        acc[t] = block_step<RKind::kNibMin>(u, dv, mv, xb, acc[t]);  // a float min, as Q4_1
      }
    }
  }
  const __mmask16 m = static_cast<__mmask16>((1u << n_valid) - 1);
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(out + static_cast<size_t>(t) * ldy, m, acc[t]);
}

template <KKind K>
void k_matmul_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                   const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                   size_t ldy) {
  over_groups<BlockQ8Act>(
      w, row_bytes, n_rows, acts, act_stride, n_tokens, out, ldy,
      [&](auto T, const uint8_t* grp, const BlockQ8Act* const* x, float* o, int n_valid) {
        k_tile<K, decltype(T)::value>(grp, k / 32, x, o, ldy, n_valid);
      });
}

#define BARATA_K_KERNELS(T, name, K)                                           \
  MatmulKernel{DType::T, name ".r16.avx512", ActFormat::kQ8, k_matmul_tile<K>, \
               256,      k_row_bytes<K>,     k_repack<K>},                     \
      MatmulKernel {                                                           \
    DType::T, name ".q8.avx512", ActFormat::kQ8, k_tile_rows<K>, 256           \
  }

#define BARATA_R_KERNELS(T, name, K)                                           \
  MatmulKernel{DType::T, name ".r16.avx512", ActFormat::kQ8, r_matmul_tile<K>, \
               32,       r_row_bytes<K>,     r_repack<K>},                     \
      MatmulKernel {                                                           \
    DType::T, name ".q8.avx512", ActFormat::kQ8, r_tile_rows<K>, 32            \
  }

// ---- NF4 block-64, fp32 activations -------------------------------------------------
// The code book is 16 floats: one vpermps looks up 16 weights at once, from a
// copy of the book scaled by the block's d. 64 weights are four lookups;
// R rows x T tokens per tile, as above.
inline void nf4_block(const BlockNF4& blk, const __m512 book, __m512 v[4]) {
  const __m512 book_d = _mm512_mul_ps(book, _mm512_set1_ps(fp16_to_fp32(blk.d)));
  for (int h = 0; h < 2; ++h) {  // weights 32h .. 32h + 31: Q4_0's nibble order
    const __m512i bytes = _mm512_cvtepu8_epi32(load128(blk.qs + 16 * h));
    const __m512i lo = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0f));
    const __m512i hi = _mm512_srli_epi32(bytes, 4);
    v[2 * h] = _mm512_permutexvar_ps(lo, book_d);
    v[2 * h + 1] = _mm512_permutexvar_ps(hi, book_d);
  }
}

template <int R, int T>
void nf4_tile(const uint8_t* const* rows, int64_t nb, const float* const* x, float* out,
              size_t ldy) {
  const __m512 book = _mm512_loadu_ps(kNF4Values);
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  AheadPrefetch ahead(rows[0]);  // the R rows lie back to back (nf4_matmul_tile)
  for (int64_t b = 0; b < nb; ++b) {
    ahead.upto(static_cast<size_t>(b + 1) * R * sizeof(BlockNF4));
    __m512 v[R][4];
    for (int r = 0; r < R; ++r)
      nf4_block(reinterpret_cast<const BlockNF4*>(rows[r])[b], book, v[r]);
    for (int t = 0; t < T; ++t) {
      for (int q = 0; q < 4; ++q) {
        const __m512 xv = _mm512_loadu_ps(x[t] + 64 * b + 16 * q);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(v[r][q], xv, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      out[static_cast<size_t>(t) * ldy + r] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int R>
void nf4_tokens(const uint8_t* const* rows, int64_t nb, const uint8_t* acts, size_t act_stride,
                int64_t n_tokens, float* out, size_t ldy) {
  for (int64_t t = 0; t < n_tokens;) {
    const float* x[4];
    const int nt = static_cast<int>(std::min<int64_t>(4, n_tokens - t));
    for (int i = 0; i < nt; ++i) x[i] = reinterpret_cast<const float*>(acts + (t + i) * act_stride);
    float* o = out + static_cast<size_t>(t) * ldy;
    switch (nt) {
      case 4:
        nf4_tile<R, 4>(rows, nb, x, o, ldy);
        break;
      case 3:
        nf4_tile<R, 3>(rows, nb, x, o, ldy);
        break;
      case 2:
        nf4_tile<R, 2>(rows, nb, x, o, ldy);
        break;
      default:
        nf4_tile<R, 1>(rows, nb, x, o, ldy);
        break;
    }
    t += nt;
  }
}

void nf4_matmul_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                     const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                     size_t ldy) {
  const int64_t nb = k / kQKNF4;
  int64_t r = 0;
  for (; r + 2 <= n_rows; r += 2) {
    const uint8_t* rows[2] = {w + r * row_bytes, w + (r + 1) * row_bytes};
    nf4_tokens<2>(rows, nb, acts, act_stride, n_tokens, out + r, ldy);
  }
  for (; r < n_rows; ++r) {
    const uint8_t* rows[1] = {w + r * row_bytes};
    nf4_tokens<1>(rows, nb, acts, act_stride, n_tokens, out + r, ldy);
  }
}

// ---- F16 / BF16 / F32 repacked: 16 rows interleaved (r16_layout.h) -------------------
// A step is one widening load of weight j of the 16 rows and, per token, one
// FMA with the token's x_j broadcast: no horizontal sums, and one stream per
// group. f_tile_rows (r16_layout.h) does the same on the file's rows.
// Element types of the float layouts: bytes per weight, 16 rows' weight j
// widened to fp32, one weight widened.
struct FrF16 {
  static constexpr int64_t kBytes = 2;
  static __m512 widen16(const uint8_t* p) { return _mm512_cvtph_ps(load256(p)); }
  static constexpr auto at = f16_at;
};
struct FrBF16 {
  static constexpr int64_t kBytes = 2;
  static __m512 widen16(const uint8_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load256(p)), 16));
  }
  static constexpr auto at = bf16_at;
};
struct FrF32 {
  static constexpr int64_t kBytes = 4;
  static __m512 widen16(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static constexpr auto at = f32_at;
};

template <typename E, int T>
void fr_tile(const uint8_t* grp, int64_t k, const float* const* x, float* out, size_t ldy,
             int n_valid) {
  constexpr int64_t S = 16 * E::kBytes;  // bytes per weight index
  __m512 ae[T], ao[T];
  for (int t = 0; t < T; ++t) ae[t] = ao[t] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 2 <= k; j += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(grp + S * j) + 4096, _MM_HINT_T0);
    if constexpr (S == 64)
      _mm_prefetch(reinterpret_cast<const char*>(grp + S * j) + 4096 + 64, _MM_HINT_T0);
    const __m512 w0 = E::widen16(grp + S * j);
    const __m512 w1 = E::widen16(grp + S * (j + 1));
    for (int t = 0; t < T; ++t) {
      ae[t] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[t][j]), ae[t]);
      ao[t] = _mm512_fmadd_ps(w1, _mm512_set1_ps(x[t][j + 1]), ao[t]);
    }
  }
  if (j < k) {
    const __m512 w0 = E::widen16(grp + S * j);
    for (int t = 0; t < T; ++t) ae[t] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[t][j]), ae[t]);
  }
  const __mmask16 m = static_cast<__mmask16>((1u << n_valid) - 1);
  for (int t = 0; t < T; ++t)
    _mm512_mask_storeu_ps(out + static_cast<size_t>(t) * ldy, m, _mm512_add_ps(ae[t], ao[t]));
}

template <typename E>
void fr_matmul_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                    const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                    size_t ldy) {
  over_groups<float>(w, row_bytes, n_rows, acts, act_stride, n_tokens, out, ldy,
                     [&](auto T, const uint8_t* grp, const float* const* x, float* o, int n_valid) {
                       fr_tile<E, decltype(T)::value>(grp, k, x, o, ldy, n_valid);
                     });
}

#define BARATA_FR_KERNELS(T, name, E)                                                     \
  MatmulKernel{DType::T, name ".r16.avx512",      ActFormat::kF32,     fr_matmul_tile<E>, \
               1,        fr_row_bytes<E::kBytes>, fr_repack<E::kBytes>},                  \
      MatmulKernel {                                                                      \
    DType::T, name ".f32.avx512", ActFormat::kF32, f_tile_rows<E::at>, 1                  \
  }

#define BARATA_Q_KERNEL(T, name, Dec)                                   \
  MatmulKernel {                                                        \
    DType::T, name ".q8.avx512", ActFormat::kQ8, q_matmul_tile<Dec>, 64 \
  }
}  // namespace

const MatmulKernel kAvx512Kernels[] = {
    BARATA_FR_KERNELS(F32, "f32", FrF32),
    BARATA_FR_KERNELS(F16, "f16", FrF16),
    BARATA_FR_KERNELS(BF16, "bf16", FrBF16),
    MatmulKernel{DType::NF4_B64, "nf4_b64.f32.avx512", ActFormat::kF32, nf4_matmul_tile, kQKNF4},
    BARATA_R_KERNELS(Q4_0, "q4_0", RKind::kNib),
    BARATA_R_KERNELS(Q4_1, "q4_1", RKind::kNibMin),
    BARATA_R_KERNELS(Q5_0, "q5_0", RKind::kNib5),
    BARATA_R_KERNELS(IQ4_NL, "iq4_nl", RKind::kNibTable),
    BARATA_R_KERNELS(Q8_0, "q8_0", RKind::kByte),
    BARATA_Q_KERNEL(Q5_1, "q5_1", Q5_1D),
    BARATA_K_KERNELS(Q4_K, "q4_k", KKind::kQ4K),
    BARATA_K_KERNELS(Q5_K, "q5_k", KKind::kQ5K),
    BARATA_K_KERNELS(Q6_K, "q6_k", KKind::kQ6K),
    BARATA_Q_KERNEL(I8_TENSOR, "i8_tensor", I8D<RowScale::kNone>),
    BARATA_Q_KERNEL(I8_ROW, "i8_row", I8D<RowScale::kHeader>),
    BARATA_R_KERNELS(I4_TENSOR, "i4_tensor", RKind::kI4Tensor),
    BARATA_Q_KERNEL(I4_ROW, "i4_row", I4D<RowScale::kHeader>),
    BARATA_R_KERNELS(I4_G128, "i4_g128", RKind::kI4G128),
};
const size_t kAvx512KernelCount = sizeof kAvx512Kernels / sizeof kAvx512Kernels[0];

// As quantize_row_q8_act, lane for lane: |x| max with NaN skipped (max_ps
// returns its second operand when either is NaN), the same d and 1/d, the
// product clamped to +-127 (a NaN product gives +127, as fmin/fmax do) and
// rounded to nearest even, as nearbyint does in the default rounding mode.
void quantize_row_q8_avx512(const float* x, BlockQ8Act* out, int64_t k) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < k / 32; ++b, x += 32) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const __m512 m = _mm512_max_ps(_mm512_and_ps(x1, abs_mask),
                                   _mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_setzero_ps()));
    const float amax = _mm512_reduce_max_ps(m);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id), hi = _mm512_set1_ps(127.0f),
                 lo = _mm512_set1_ps(-127.0f);
    auto q = [&](__m512 v) {
      const __m512 c = _mm512_max_ps(_mm512_min_ps(_mm512_mul_ps(v, vid), hi), lo);
      return _mm512_cvtps_epi32(
          _mm512_roundscale_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    };
    const __m512i q0 = q(x0), q1 = q(x1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].q), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].q + 16), _mm512_cvtepi32_epi8(q1));
    out[b].d = d;
    out[b].sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    out[b].s = d * static_cast<float>(out[b].sum);
  }
}

}  // namespace barata::BARATA_ISA_NS

#endif
