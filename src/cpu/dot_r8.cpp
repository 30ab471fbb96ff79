// AVX2 kernels on the 16-row interleaved layouts (r16_layout.h), built only
// into the avx2 copy (see dot.h): each 16-row group is read as two halves of
// 8 rows, one row per 32-bit lane of a 256-bit vector.
//
// AVX2 has no vpdpbusd: the exact integer dot of a block (32 weights of 8
// rows against one token's 32 int8 activations) is eight vpmaddubsw (4
// weights of each row against 4 activation bytes broadcast: two int16 pair
// sums per row), three int16 adds of those (within range: a pair sum is at
// most 2 * 31 * 127 = 7874 for the 5-bit codes, so four of them fit), and two
// vpmaddwd against ones that finish each row's sum in its own int32 lane,
// started from -o * sum(q) (the type's constant offset o).
// The float part is the layout's contract, operation for operation the
// AVX-512 kernel's: acc = fma(float(dot), dv * d_x, acc) (and for Q4_1
// acc = fma(m, s_x, acc)). So these kernels give the AVX-512 kernels' bits,
// and the one on the file's rows (r_tile_rows, r16_layout.h) gives the
// repacked kernel's.
//
// Types: Q4_0, Q4_1, Q5_0 and barata's int4 group-128 and per-tensor rows
// (codes of at most 5 bits); IQ4_NL and Q8_0, whose codes u = c + 128 are
// bytes up to 255 (a pair sum would saturate vpmaddubsw), as the signed codes
// c: vpmaddubsw of |c| against sign(c) * q, each to int32 on its own, exact;
// and F32, F16, BF16 (below).
#include <cstring>

#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "dot.h"
#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace barata::BARATA_ISA_NS {
namespace {

inline uint32_t read_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

#include "r16_layout.h"  // IWYU pragma: keep (inside the ISA namespace)
inline __m256i bcast4(const int8_t* q) {
  return _mm256_set1_epi32(static_cast<int>(read_u32(q)));
}

// 32 bits -> 32 bytes, byte i = 16 where bit i is set (the fifth bits of
// 4 weights x 8 rows: bit 4r + j is byte 4r + j).
inline __m256i fifth_bits(uint32_t bits) {
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(16));
}

// The copy with AVX-VNNI (the avxvnni ISA: Zen 5, Intel client cores) has the
// 256-bit vpdpbusd: u8 x s8 products summed in int32 lanes, no saturation.
// The avx512 copy builds the same code with the EVEX encoding of that
// instruction (AVX-512 VL + VNNI) as a check table only (CpuKernelSet::
// r8_vnni): no machine here has AVX-VNNI, and this way its arithmetic runs in
// the tests wherever AVX-512 does.
#if defined(__AVXVNNI__)
#define BARATA_R8_VNNI 1
#define BARATA_DPBUSD _mm256_dpbusd_avx_epi32
#define BARATA_R8_ISA ".avxvnni"
#elif defined(BARATA_HAVE_AVX512_KERNELS)
#define BARATA_R8_VNNI 1
#define BARATA_DPBUSD _mm256_dpbusd_epi32
#define BARATA_R8_ISA ".vnni256.avx512"
#else
#define BARATA_R8_ISA ".avx2"
#endif
#if defined(BARATA_R8_VNNI)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

// The exact sum over one block of each row's codes times the token's
// activations, starting from `init`: int32 lane r = init + sum_j u[r][j] * q[j].
// Without VNNI the codes must be at most 31 (pair sums in int16).
inline __m256i block_dot(const __m256i u[8], const int8_t* q,
                         __m256i init = _mm256_setzero_si256()) {
#if defined(BARATA_R8_VNNI)
  __m256i a = BARATA_DPBUSD(init, u[0], bcast4(q));
  __m256i b = BARATA_DPBUSD(_mm256_setzero_si256(), u[1], bcast4(q + 4));
  a = BARATA_DPBUSD(a, u[2], bcast4(q + 8));
  b = BARATA_DPBUSD(b, u[3], bcast4(q + 12));
  a = BARATA_DPBUSD(a, u[4], bcast4(q + 16));
  b = BARATA_DPBUSD(b, u[5], bcast4(q + 20));
  a = BARATA_DPBUSD(a, u[6], bcast4(q + 24));
  b = BARATA_DPBUSD(b, u[7], bcast4(q + 28));
  return _mm256_add_epi32(a, b);
#else
  const __m256i s01 = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], bcast4(q)),
                                       _mm256_maddubs_epi16(u[1], bcast4(q + 4)));
  const __m256i s23 = _mm256_add_epi16(_mm256_maddubs_epi16(u[2], bcast4(q + 8)),
                                       _mm256_maddubs_epi16(u[3], bcast4(q + 12)));
  const __m256i s45 = _mm256_add_epi16(_mm256_maddubs_epi16(u[4], bcast4(q + 16)),
                                       _mm256_maddubs_epi16(u[5], bcast4(q + 20)));
  const __m256i s67 = _mm256_add_epi16(_mm256_maddubs_epi16(u[6], bcast4(q + 24)),
                                       _mm256_maddubs_epi16(u[7], bcast4(q + 28)));
  const __m256i ones = _mm256_set1_epi16(1);
  return _mm256_add_epi32(
      _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(s01, s23), ones), init),
      _mm256_madd_epi16(_mm256_add_epi16(s45, s67), ones));
#endif
}

#if !defined(BARATA_R8_VNNI)
// Without VNNI, for byte codes: lane r = sum_j c[r][j] * q[j] with the signed
// codes c (|c| <= 128), as vpmaddubsw of |c| against sign(c) * q; a pair sum
// reaches 2 * 128 * 127 = 32512, so each goes to int32 on its own. Exact.
inline __m256i block_dot_signed(const __m256i a[8], const __m256i c[8], const int8_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s[8];
  for (int g = 0; g < 8; ++g)
    s[g] = _mm256_madd_epi16(_mm256_maddubs_epi16(a[g], _mm256_sign_epi8(bcast4(q + 4 * g), c[g])),
                             ones);
  return _mm256_add_epi32(
      _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3])),
      _mm256_add_epi32(_mm256_add_epi32(s[4], s[5]), _mm256_add_epi32(s[6], s[7])));
}
#endif

// The same over 16 weights (groups g0 .. g0 + 3), for Q6_K's half-blocks: its
// 6-bit codes give pair sums up to 16002, so two add in int16.
inline __m256i half_block_dot(const __m256i* u, const int8_t* q, __m256i init) {
#if defined(BARATA_R8_VNNI)
  __m256i a = BARATA_DPBUSD(init, u[0], bcast4(q));
  __m256i b = BARATA_DPBUSD(_mm256_setzero_si256(), u[1], bcast4(q + 4));
  a = BARATA_DPBUSD(a, u[2], bcast4(q + 8));
  b = BARATA_DPBUSD(b, u[3], bcast4(q + 12));
  return _mm256_add_epi32(a, b);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i p01 = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[0], bcast4(q)),
                                                         _mm256_maddubs_epi16(u[1], bcast4(q + 4))),
                                        ones);
  const __m256i p23 =
      _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[2], bcast4(q + 8)),
                                         _mm256_maddubs_epi16(u[3], bcast4(q + 12))),
                        ones);
  return _mm256_add_epi32(_mm256_add_epi32(p01, p23), init);
#endif
}

// out[t * ldy + r] = acc[t][r] for r < n_valid (at most 8).
template <int T>
void store8(float* out, size_t ldy, const __m256 (&acc)[T], int n_valid) {
  if (n_valid == 8) {
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(out + static_cast<size_t>(t) * ldy, acc[t]);
  } else {
    const __m256i m =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n_valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int t = 0; t < T; ++t) _mm256_maskstore_ps(out + static_cast<size_t>(t) * ldy, m, acc[t]);
  }
}

// T tokens against half `h` (rows 8h .. 8h + 7) of one 16-row group;
// out[t * ldy + r] for r < n_valid.
template <RKind K, int T>
void r8_tile(const uint8_t* grp, int64_t nb, const BlockQ8Act* const* x, float* out, size_t ldy,
             int h, int n_valid) {
  using L = RLayout<K>;
  // Codes up to 255: without VNNI, signed codes through the sign trick
  // (vpmaddubsw on u would saturate).
  constexpr bool kSigned = (K == RKind::kByte || K == RKind::kNibTable) && !kVnni;
  const uint8_t* codes = grp;
  const uint8_t* dsec = codes + nb * L::kCodes;
  const uint8_t* msec = dsec + nb * L::kD;
  const uint8_t* hsec = msec + nb * L::kM;
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f);
  __m256i table = _mm256_setzero_si256();
  if constexpr (K == RKind::kNibTable) {
    // The code book as u = value + 128 (VNNI), or as the signed values.
    alignas(16) uint8_t tb[16];
    for (int i = 0; i < 16; ++i)
      tb[i] = static_cast<uint8_t>(kIQ4NLValues[i] + (kSigned ? 0 : 128));
    table = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(tb)));
  }
  AheadPrefetch ahead(grp);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* c = codes + b * L::kCodes + 32 * h;
    ahead.upto(static_cast<size_t>(b + 1) * L::kBlock);
    __m256i u[8];
    if constexpr (K == RKind::kByte) {
      for (int g = 0; g < 8; ++g) u[g] = load256(c + 64 * g);
    } else {
      for (int i = 0; i < 4; ++i) {
        const __m256i w = load256(c + 64 * i);
        u[2 * i] = _mm256_and_si256(w, low);
        u[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
      }
    }
    if constexpr (K == RKind::kNibTable)
      for (int g = 0; g < 8; ++g) u[g] = _mm256_shuffle_epi8(table, u[g]);
    // kSigned: u becomes the signed codes c, and a = |c|.
    __m256i a[kSigned ? 8 : 1];
    if constexpr (kSigned)
      for (int g = 0; g < 8; ++g) {
        if constexpr (K == RKind::kByte)
          u[g] = _mm256_xor_si256(u[g], _mm256_set1_epi8(static_cast<char>(0x80)));
        a[g] = _mm256_abs_epi8(u[g]);
      }
    if constexpr (K == RKind::kNib5) {
      const uint8_t* hb = hsec + b * L::kHigh + 4 * h;
      for (int g = 0; g < 8; ++g) u[g] = _mm256_or_si256(u[g], fifth_bits(read_u32(hb + 8 * g)));
    }
    const __m256 dv = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(dsec + b * L::kD + 16 * h)));
    __m256 mv = _mm256_setzero_ps();
    if constexpr (L::kMin)
      mv = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(msec + b * L::kM + 16 * h)));
    for (int t = 0; t < T; ++t) {
      const BlockQ8Act& xb = x[t][b];
      __m256i dot;
      if constexpr (kSigned) {
        dot = block_dot_signed(a, u, xb.q);
      } else if constexpr (L::kMin) {
        dot = block_dot(u, xb.q);
      } else {
        dot = block_dot(u, xb.q, _mm256_set1_epi32(-L::kOffset * xb.sum));
      }
      const __m256 p = _mm256_cvtepi32_ps(dot);
      acc[t] = _mm256_fmadd_ps(p, _mm256_mul_ps(dv, _mm256_set1_ps(xb.d)), acc[t]);
      if constexpr (L::kMin) acc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xb.s), acc[t]);
    }
  }
  store8(out, ldy, acc, n_valid);
}

// Runs tile(T, group, half, x, out, n_valid) over the 8-row halves of the
// 16-row groups and the tokens, 4, 2 or 1 at a time (T an integral_constant).
template <typename Tile>
void over_halves(const uint8_t* w, size_t row_bytes, int64_t n_rows, const uint8_t* acts,
                 size_t act_stride, int64_t n_tokens, float* out, size_t ldy, const Tile& tile) {
  for (int64_t g = 0; g * 16 < n_rows; ++g) {
    const uint8_t* grp = w + static_cast<size_t>(g * 16) * row_bytes;
    for (int h = 0; h < 2; ++h) {
      const int n_valid = static_cast<int>(std::clamp<int64_t>(n_rows - g * 16 - 8 * h, 0, 8));
      if (n_valid == 0) break;
      for (int64_t t = 0; t < n_tokens;) {
        const BlockQ8Act* x[4];
        const int64_t left = n_tokens - t;
        const int nt = left >= 4 ? 4 : left >= 2 ? 2 : 1;
        for (int i = 0; i < nt; ++i)
          x[i] = reinterpret_cast<const BlockQ8Act*>(acts + (t + i) * act_stride);
        float* o = out + g * 16 + 8 * h + static_cast<size_t>(t) * ldy;
        if (nt == 4) {
          tile(std::integral_constant<int, 4>{}, grp, h, x, o, n_valid);
        } else if (nt == 2) {
          tile(std::integral_constant<int, 2>{}, grp, h, x, o, n_valid);
        } else {
          tile(std::integral_constant<int, 1>{}, grp, h, x, o, n_valid);
        }
        t += nt;
      }
    }
  }
}

template <RKind K>
void r8_matmul_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                    const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                    size_t ldy) {
  over_halves(w, row_bytes, n_rows, acts, act_stride, n_tokens, out, ldy,
              [&](auto T, const uint8_t* grp, int h, const BlockQ8Act* const* x, float* o, int nv) {
                r8_tile<K, decltype(T)::value>(grp, k / 32, x, o, ldy, h, nv);
              });
}

// ---- the K-quants on their 16-row layout (r16_layout.h) -------------------------
// Half h of a group, T tokens; the float steps are the AVX-512 k_tile's.
// Q6_K's codes reach 63: a pair sum is at most 2 * 63 * 127 = 16002, so two
// vpmaddubsw results are added in int16 before each vpmaddwd.
template <KKind K, int T>
void k8_tile(const uint8_t* grp, int64_t nb, const BlockQ8Act* const* x, float* out, size_t ldy,
             int h, int n_valid) {
  using L = KLayout<K>;
  const uint8_t* codes = grp;
  const uint8_t* high = codes + nb * L::kCodes;
  const uint8_t* super = high + nb * L::kHigh;
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256 neg = _mm256_set1_ps(-0.0f);
  __m256 dvec = _mm256_setzero_ps(), dminv = _mm256_setzero_ps();
  auto half8 = [&](const uint8_t* p) {  // 8 fp16 of this half
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
  };
  auto scale = [&](const uint8_t* bytes, bool is_signed) {  // 8 bytes of this half
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8 * h));
    return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
  };
  AheadPrefetch ahead(grp);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sp = super + (b / 8) * L::kSuper;
    const int sub = static_cast<int>(b % 8);
    if (sub == 0) {
      dvec = half8(sp);
      if constexpr (K != KKind::kQ6K) dminv = half8(sp + 32);
    }
    const uint8_t* c = codes + b * L::kCodes + 32 * h;
    ahead.upto(static_cast<size_t>(b + 1) * L::kGroupPerSuper / 8);
    __m256i u[8];
    for (int i = 0; i < 4; ++i) {
      const __m256i w = load256(c + 64 * i);
      u[2 * i] = _mm256_and_si256(w, low);
      u[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
    }
    const uint8_t* hp = high + b * L::kHigh;
    if constexpr (K == KKind::kQ5K) {
      for (int g = 0; g < 8; ++g)
        u[g] = _mm256_or_si256(u[g], fifth_bits(read_u32(hp + 8 * g + 4 * h)));
    } else if constexpr (K == KKind::kQ6K) {
      const __m256i three = _mm256_set1_epi8(0x03);
      for (int hw = 0; hw < 2; ++hw) {
        const __m256i w = load256(hp + 64 * hw + 32 * h);
        for (int s = 0; s < 4; ++s) {
          const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(w, 2 * s), three);
          u[4 * hw + s] = _mm256_or_si256(u[4 * hw + s], _mm256_slli_epi16(hb, 4));
        }
      }
    }
    if constexpr (K == KKind::kQ6K) {
      const __m256 dva = _mm256_mul_ps(scale(sp + 32 + 16 * (2 * sub), true), dvec);
      const __m256 dvb = _mm256_mul_ps(scale(sp + 32 + 16 * (2 * sub + 1), true), dvec);
      for (int t = 0; t < T; ++t) {
        const BlockQ8Act& xb = x[t][b];
        int32_t sa, sb;
        half_sums(xb.q, sa, sb);
        const __m256i ia = half_block_dot(u, xb.q, _mm256_set1_epi32(-32 * sa));
        const __m256i ib = half_block_dot(u + 4, xb.q + 16, _mm256_set1_epi32(-32 * sb));
        const __m256 dx = _mm256_set1_ps(xb.d);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), _mm256_mul_ps(dva, dx), acc[t]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ib), _mm256_mul_ps(dvb, dx), acc[t]);
      }
    } else {
      const __m256 dv = _mm256_mul_ps(scale(sp + 64 + 16 * sub, false), dvec);
      const __m256 mv =
          _mm256_xor_ps(_mm256_mul_ps(scale(sp + 64 + 128 + 16 * sub, false), dminv), neg);
      for (int t = 0; t < T; ++t) {
        const BlockQ8Act& xb = x[t][b];
        const __m256 p = _mm256_cvtepi32_ps(block_dot(u, xb.q));
        acc[t] = _mm256_fmadd_ps(p, _mm256_mul_ps(dv, _mm256_set1_ps(xb.d)), acc[t]);
        acc[t] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xb.s), acc[t]);
      }
    }
  }
  store8(out, ldy, acc, n_valid);
}

template <KKind K>
void k8_matmul_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                    const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                    size_t ldy) {
  over_halves(w, row_bytes, n_rows, acts, act_stride, n_tokens, out, ldy,
              [&](auto T, const uint8_t* grp, int h, const BlockQ8Act* const* x, float* o, int nv) {
                k8_tile<K, decltype(T)::value>(grp, k / 32, x, o, ldy, h, nv);
              });
}

#define BARATA_K8_KERNELS(T, name, K)                                                 \
  MatmulKernel{DType::T, name ".r8" BARATA_R8_ISA, ActFormat::kQ8, k8_matmul_tile<K>, \
               256,      k_row_bytes<K>,           k_repack<K>},                      \
      MatmulKernel {                                                                  \
    DType::T, name ".q8" BARATA_R8_ISA, ActFormat::kQ8, k_tile_rows<K>, 256           \
  }

// ---- the float types on their 16-row layout (r16_layout.h) -----------------------
// Both halves of a group at once (weight j of the 16 rows is two vectors),
// 1 or 2 tokens per tile: 4T accumulators, the two chains per row and token
// of the layout's contract.
struct Fr8F16 {
  static constexpr int64_t kBytes = 2;
  static __m256 widen8(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static constexpr auto at = f16_at;
};
struct Fr8BF16 {
  static constexpr int64_t kBytes = 2;
  static __m256 widen8(const uint8_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
  static constexpr auto at = bf16_at;
};
struct Fr8F32 {
  static constexpr int64_t kBytes = 4;
  static __m256 widen8(const uint8_t* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  static constexpr auto at = f32_at;
};

template <typename E, int T>
void fr8_tile(const uint8_t* grp, int64_t k, const float* const* x, float* out, size_t ldy,
              int n_valid) {
  constexpr int64_t S = 16 * E::kBytes;  // bytes per weight index (16 rows)
  constexpr int64_t H = 8 * E::kBytes;   // the second half's offset
  __m256 ae[T][2], ao[T][2];
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < 2; ++h) ae[t][h] = ao[t][h] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 2 <= k; j += 2) {
    const char* p = reinterpret_cast<const char*>(grp + S * j);
    _mm_prefetch(p + 4096, _MM_HINT_T0);
    if constexpr (S == 64) _mm_prefetch(p + 4096 + 64, _MM_HINT_T0);
    const __m256 w00 = E::widen8(grp + S * j), w01 = E::widen8(grp + S * j + H);
    const __m256 w10 = E::widen8(grp + S * (j + 1)), w11 = E::widen8(grp + S * (j + 1) + H);
    for (int t = 0; t < T; ++t) {
      const __m256 x0 = _mm256_set1_ps(x[t][j]), x1 = _mm256_set1_ps(x[t][j + 1]);
      ae[t][0] = _mm256_fmadd_ps(w00, x0, ae[t][0]);
      ae[t][1] = _mm256_fmadd_ps(w01, x0, ae[t][1]);
      ao[t][0] = _mm256_fmadd_ps(w10, x1, ao[t][0]);
      ao[t][1] = _mm256_fmadd_ps(w11, x1, ao[t][1]);
    }
  }
  if (j < k) {
    const __m256 w00 = E::widen8(grp + S * j), w01 = E::widen8(grp + S * j + H);
    for (int t = 0; t < T; ++t) {
      const __m256 x0 = _mm256_set1_ps(x[t][j]);
      ae[t][0] = _mm256_fmadd_ps(w00, x0, ae[t][0]);
      ae[t][1] = _mm256_fmadd_ps(w01, x0, ae[t][1]);
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int nv = std::clamp(n_valid - 8 * h, 0, 8);
    if (nv == 0) break;
    const __m256i m =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(nv), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int t = 0; t < T; ++t)
      _mm256_maskstore_ps(out + static_cast<size_t>(t) * ldy + 8 * h, m,
                          _mm256_add_ps(ae[t][h], ao[t][h]));
  }
}

template <typename E>
void fr8_matmul_tile(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                     const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                     size_t ldy) {
  for (int64_t g = 0; g * 16 < n_rows; ++g) {
    const uint8_t* grp = w + static_cast<size_t>(g * 16) * row_bytes;
    const int n_valid = static_cast<int>(std::min<int64_t>(16, n_rows - g * 16));
    for (int64_t t = 0; t < n_tokens;) {
      const float* x[2];
      const int nt = n_tokens - t >= 2 ? 2 : 1;
      for (int i = 0; i < nt; ++i)
        x[i] = reinterpret_cast<const float*>(acts + (t + i) * act_stride);
      float* o = out + g * 16 + static_cast<size_t>(t) * ldy;
      if (nt == 2) {
        fr8_tile<E, 2>(grp, k, x, o, ldy, n_valid);
      } else {
        fr8_tile<E, 1>(grp, k, x, o, ldy, n_valid);
      }
      t += nt;
    }
  }
}

#define BARATA_FR8_KERNELS(T, name, E)                                                      \
  MatmulKernel{DType::T, name ".r8" BARATA_R8_ISA, ActFormat::kF32,     fr8_matmul_tile<E>, \
               1,        fr_row_bytes<E::kBytes>,  fr_repack<E::kBytes>},                   \
      MatmulKernel {                                                                        \
    DType::T, name ".f32" BARATA_R8_ISA, ActFormat::kF32, f_tile_rows<E::at>, 1             \
  }

#define BARATA_R8_KERNELS(T, name, K)                                                 \
  MatmulKernel{DType::T, name ".r8" BARATA_R8_ISA, ActFormat::kQ8, r8_matmul_tile<K>, \
               32,       r_row_bytes<K>,           r_repack<K>},                      \
      MatmulKernel {                                                                  \
    DType::T, name ".q8" BARATA_R8_ISA, ActFormat::kQ8, r_tile_rows<K>, 32            \
  }

}  // namespace

const MatmulKernel kR8Kernels[] = {
    BARATA_R8_KERNELS(Q4_0, "q4_0", RKind::kNib),
    BARATA_R8_KERNELS(Q4_1, "q4_1", RKind::kNibMin),
    BARATA_R8_KERNELS(Q5_0, "q5_0", RKind::kNib5),
    BARATA_R8_KERNELS(IQ4_NL, "iq4_nl", RKind::kNibTable),
    BARATA_R8_KERNELS(Q8_0, "q8_0", RKind::kByte),
    BARATA_R8_KERNELS(I4_TENSOR, "i4_tensor", RKind::kI4Tensor),
    BARATA_R8_KERNELS(I4_G128, "i4_g128", RKind::kI4G128),
    BARATA_K8_KERNELS(Q4_K, "q4_k", KKind::kQ4K),
    BARATA_K8_KERNELS(Q5_K, "q5_k", KKind::kQ5K),
    BARATA_K8_KERNELS(Q6_K, "q6_k", KKind::kQ6K),
    BARATA_FR8_KERNELS(F32, "f32", Fr8F32),
    BARATA_FR8_KERNELS(F16, "f16", Fr8F16),
    BARATA_FR8_KERNELS(BF16, "bf16", Fr8BF16),
};
const size_t kR8KernelCount = sizeof kR8Kernels / sizeof kR8Kernels[0];

#if defined(__AVXVNNI__)
// The avxvnni copy is this file and attention.cpp: its kernel set is the
// 8-row kernels, the activation quantizer and the attention (int keys by
// vpdpbusd); everything else falls through to the avx2 copy.
const CpuKernelSet& kernel_set() {
  static const CpuKernelSet set{
      "avxvnni",        kR8Kernels,  kR8KernelCount, nullptr, quantize_row_q8_avx2,
      attend_supported, attend_tile, swiglu,         geglu};
  return set;
}
#endif

// As quantize_row_q8_act, lane for lane (the AVX-512 copy's quantizer on 8
// lanes): |x| max with NaN skipped (max_ps returns its second operand when
// either is NaN), the same d and 1/d, the product clamped to +-127 (a NaN
// product gives +127, as fmin/fmax do) and rounded to nearest even.
void quantize_row_q8_avx2(const float* x, BlockQ8Act* out, int64_t k) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t b = 0; b < k / 32; ++b, x += 32) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 8 * i);
      m = _mm256_max_ps(_mm256_and_ps(v[i], abs_mask), m);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id), hi = _mm256_set1_ps(127.0f),
                 lo = _mm256_set1_ps(-127.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 c = _mm256_max_ps(_mm256_min_ps(_mm256_mul_ps(v[i], vid), hi), lo);
      q[i] = _mm256_cvtps_epi32(_mm256_round_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    // int32 -> int8 (no saturation: |q| <= 127); the packs interleave 4-lane
    // groups, the permutation puts them back in element order.
    const __m256i p =
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].q),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    out[b].d = d;
    out[b].sum = _mm_cvtsi128_si32(s4);
    out[b].s = d * static_cast<float>(out[b].sum);
  }
}

}  // namespace barata::BARATA_ISA_NS
#endif
