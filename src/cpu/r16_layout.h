// The 16-row interleaved layouts of the legacy block types (Q4_0, Q4_1,
// Q5_0, IQ4_NL, Q8_0), barata's int4 rows and the float types: their layout, arithmetic and
// the load-time repacking, shared by the AVX-512 kernels (dot_avx512.cpp,
// 16 rows per vector) and the AVX2 ones (dot_r8.cpp, each group as two
// halves of 8 rows). Plain C++; included by a kernel file inside its ISA
// namespace's anonymous namespace (see dot.h: nothing here may have vague
// linkage outside it). Needs read_u32, load256, simd::scale_min, simd::AheadPrefetch and the
// quant_blocks.h types.
#pragma once

// Exact integer dot of 32 codes with 32 activation bytes, over [lo, hi).
inline int32_t code_dot(const uint8_t* u, const int8_t* q, int lo, int hi) {
  int32_t s = 0;
  for (int j = lo; j < hi; ++j) s += static_cast<int32_t>(u[j]) * q[j];
  return s;
}

// ---- repacked layouts: 16 rows interleaved, one row per lane -------------------------
// For Q4_0, Q4_1, Q5_0, IQ4_NL and Q8_0 the CPU backend repacks each matrix at
// load (the file stays as it is): rows in groups of 16, and within a group,
// for each block of 32 weights, the codes u (unsigned) of 4 consecutive
// weights of the 16 rows side by side, 64 bytes, so that one vpdpbusd against
// 4 activation bytes broadcast gives each row's partial sum in its own lane.
// The per-block scales of the 16 rows are one vector, so the scaling costs
// one multiply and one FMA (two for Q4_1) per block for all 16 rows together.
//
// Arithmetic (per row r, token t, over blocks b in order, from acc = 0). For
// the types whose offset is a constant o (all but Q4_1), one FMA per block:
//     acc = fma(float(sum_j u_j * q_j - o * sum_j q_j), dv * d_x, acc)
// with the integer exact (it is the block's signed codes times q), and per type
//     Q4_0: u = nibble, o = 8         Q5_0: u = nibble + 16 * fifth bit, o = 16
//     IQ4_NL: u = code book value + 128, o = 128      Q8_0: u = q + 128, o = 128
// (dv = the block's d). Q4_1's offset is its own fp16 min m:
//     acc = fma(float(sum_j u_j * q_j), dv * d_x, acc);  acc = fma(m, s_x, acc)
// with s_x = d_x * sum(q). Every ISA reaches the same integer its own way:
// vpdpbusd on u starting from -o * sum(q); without VNNI, vpmaddubsw on the
// nibbles from the same start, or on |c| against sign(c) * q for the byte
// codes c = u - 128 (pair sums at most 2 * 128 * 127, no saturation).
// The kernel on the file's rows (r_tile_rows, below; BARATA_REPACK=0) does
// exactly the same operations, so repacking changes no bit of the result,
// and the ISAs' kernels on the layout give the same bits.
//
// Group layout, in sections (each block's part contiguous):
//     codes: per block 256 bytes (nibble types: 4 x 64, byte 4r + j of word i
//            holding u[r][8i + j] | u[r][8i + 4 + j] << 4) or 512 (Q8_0: 8 x 64)
//     d:     per block 16 fp16        m (Q4_1): per block 16 fp16
//     high bits (Q5_0): per block 8 x 64 bits, bit 4r + j of word g = the fifth
//            bit of weight 4g + j of row r.
using simd::AheadPrefetch;

// kI4G128 / kI4Tensor: barata's int4 group-128 and per-tensor rows (stored
// level + 8 in Q4_0's nibble order; d = the group's fp16 scale, or 1 with the
// tensor's scale applied by the matmul driver), mv = -8 d: the kNib layout.
enum class RKind { kNib, kNibMin, kNib5, kNibTable, kByte, kI4G128, kI4Tensor };

template <RKind K>
struct RLayout {
  static constexpr size_t kCodes = K == RKind::kByte ? 512 : 256;
  static constexpr size_t kD = 32;
  static constexpr size_t kM = K == RKind::kNibMin ? 32 : 0;
  static constexpr size_t kHigh = K == RKind::kNib5 ? 64 : 0;
  static constexpr size_t kBlock = kCodes + kD + kM + kHigh;  // 16 rows x 32 weights
  static constexpr int kOffset = K == RKind::kNib5                            ? 16
                                 : K == RKind::kByte || K == RKind::kNibTable ? 128
                                 : K == RKind::kNibMin                        ? 0
                                                                              : 8;
  static constexpr bool kMin = K == RKind::kNibMin;  // a float min per block, not kOffset
};

// Where a nibble type's block b lies in its file row: the 16 code bytes (byte
// j: weight j in the low nibble, weight j + 16 in the high one; IQ4_NL's are
// code book indices), the fp16 scale and min, Q5_0's fifth bits.
struct NibSource {
  const uint8_t* qs;
  uint16_t d = 0x3c00, m = 0;  // int4 per tensor: d = 1
  uint32_t qh = 0;
};

template <RKind K>
NibSource nib_source(const uint8_t* row, int64_t b, int64_t nb) {
  NibSource o;
  if constexpr (K == RKind::kI4G128 || K == RKind::kI4Tensor) {
    o.qs = row + (K == RKind::kI4G128 ? 2 * ((nb + 3) / 4) : 0) + 16 * b;
    if constexpr (K == RKind::kI4G128) std::memcpy(&o.d, row + 2 * (b / 4), 2);
  } else if constexpr (K == RKind::kNibMin) {
    const auto& x = reinterpret_cast<const BlockQ4_1*>(row)[b];
    o.qs = x.qs;
    o.d = x.d;
    o.m = x.m;
  } else if constexpr (K == RKind::kNib5) {
    const auto& x = reinterpret_cast<const BlockQ5_0*>(row)[b];
    o.qs = x.qs;
    o.d = x.d;
    o.qh = read_u32(x.qh);
  } else {
    static_assert(K == RKind::kNib || K == RKind::kNibTable, "not a nibble type");
    const auto& x = reinterpret_cast<const BlockQ4_0*>(row)[b];  // IQ4_NL has the same layout
    o.qs = x.qs;
    o.d = x.d;
  }
  return o;
}

// Eight 4-bit codes (one per byte, high nibbles clear) -> the layout's 32-bit
// word: byte j holds code j low and code j + 4 high.
inline uint32_t pack_nibble_word(uint64_t codes8) {
  return static_cast<uint32_t>(codes8 | ((codes8 >> 32) << 4));
}

// One row's block b in code form: u[32], the fp16 scale (and min).
struct RowBlock {
  uint8_t u[32];
  uint16_t d, m;
};

template <RKind K>
RowBlock row_block(const uint8_t* row, int64_t b, int64_t nb) {
  RowBlock o{};
  if constexpr (K == RKind::kByte) {
    const auto& x = reinterpret_cast<const BlockQ8_0*>(row)[b];
    for (int j = 0; j < 32; ++j) o.u[j] = static_cast<uint8_t>(x.qs[j] + 128);
    o.d = x.d;
  } else {
    const NibSource src = nib_source<K>(row, b, nb);
    for (int j = 0; j < 16; ++j) {
      o.u[j] = src.qs[j] & 0x0f;
      o.u[j + 16] = src.qs[j] >> 4;
    }
    for (int j = 0; j < 32; ++j)
      o.u[j] = static_cast<uint8_t>(o.u[j] | (((src.qh >> j) & 1u) << 4));
    if constexpr (K == RKind::kNibTable)
      for (int j = 0; j < 32; ++j) o.u[j] = static_cast<uint8_t>(kIQ4NLValues[o.u[j]] + 128);
    o.d = src.d;
    o.m = src.m;
  }
  return o;
}

template <RKind K>
size_t r_row_bytes(int64_t k) {
  return static_cast<size_t>(k / 32) * RLayout<K>::kBlock / 16;
}

template <RKind K>
void r_repack(const uint8_t* src, size_t src_row_bytes, int64_t k, int64_t n_rows, uint8_t* dst) {
  using L = RLayout<K>;
  const int64_t nb = k / 32;
  const int64_t groups = (n_rows + 15) / 16;
  const size_t group_bytes = static_cast<size_t>(nb) * L::kBlock;
  std::memset(dst, 0, static_cast<size_t>(groups) * group_bytes);
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* codes = dst + g * group_bytes;
    uint8_t* dsec = codes + nb * L::kCodes;
    uint8_t* msec = dsec + nb * L::kD;
    uint8_t* hsec = msec + nb * L::kM;
    for (int64_t r = 0; r < 16 && g * 16 + r < n_rows; ++r) {
      const uint8_t* row = src + (g * 16 + r) * src_row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        uint8_t* c = codes + b * L::kCodes;
        if constexpr (K == RKind::kByte) {
          const RowBlock rb = row_block<K>(row, b, nb);
          for (int gi = 0; gi < 8; ++gi)
            for (int j = 0; j < 4; ++j) c[64 * gi + 4 * r + j] = rb.u[4 * gi + j];
          std::memcpy(dsec + b * L::kD + 2 * r, &rb.d, 2);
        } else {
          // The nibble types straight from the file's 16 code bytes: word i of
          // the layout holds weights 8i + j (low) and 8i + 4 + j (high).
          const NibSource ns = nib_source<K>(row, b, nb);
          uint64_t half[2];
          std::memcpy(half, ns.qs, 16);
          for (int i = 0; i < 4; ++i) {
            const uint32_t word =
                pack_nibble_word((half[i % 2] >> (4 * (i / 2))) & 0x0f0f0f0f0f0f0f0full);
            std::memcpy(c + 64 * i + 4 * r, &word, 4);
          }
          if constexpr (K == RKind::kNib5) {
            // Bits 4r .. 4r + 3 of word gi = fifth bits 4gi .. 4gi + 3: byte r / 2.
            for (int gi = 0; gi < 8; ++gi)
              hsec[b * L::kHigh + 8 * gi + r / 2] |=
                  static_cast<uint8_t>(((ns.qh >> (4 * gi)) & 0x0f) << (4 * (r % 2)));
          }
          std::memcpy(dsec + b * L::kD + 2 * r, &ns.d, 2);
          if constexpr (K == RKind::kNibMin) std::memcpy(msec + b * L::kM + 2 * r, &ns.m, 2);
        }
      }
    }
  }
}

// The layout's arithmetic on the file's rows, one row and token at a time
// (BARATA_REPACK=0): the exact integer dot, then the FMA (two for Q4_1).
template <RKind K>
void r_tile_rows(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k, const uint8_t* acts,
                 size_t act_stride, int64_t n_tokens, float* out, size_t ldy) {
  const int64_t nb = k / 32;
  constexpr int32_t kOff = RLayout<K>::kOffset;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8Act*>(acts + t * act_stride);
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const RowBlock rb = row_block<K>(row, b, nb);
        const float dv = fp16_to_fp32(rb.d);
        const int32_t dot = code_dot(rb.u, x[b].q, 0, 32) - kOff * x[b].sum;
        acc = std::fma(static_cast<float>(dot), dv * x[b].d, acc);
        if constexpr (RLayout<K>::kMin) acc = std::fma(fp16_to_fp32(rb.m), x[b].s, acc);
      }
      out[t * ldy + r] = acc;
    }
  }
}

// ---- the float types (F16, BF16, F32): 16 rows interleaved -------------------------
// Per group of 16 rows, weight j of the 16 rows side by side (16 * B bytes).
// Arithmetic (per row and token, from a_e = a_o = 0): two chains, over even
// and odd j, added at the end:
//     a_e = fma(w_j, x_j, a_e) (j even);  a_o = fma(w_j, x_j, a_o) (j odd);  out = a_e + a_o
// with w_j widened to fp32 exactly. The kernels on the file's rows do the same.
template <int64_t B>
size_t fr_row_bytes(int64_t k) {
  return static_cast<size_t>(k * B);
}

template <int64_t B>
void fr_repack(const uint8_t* src, size_t src_row_bytes, int64_t k, int64_t n_rows, uint8_t* dst) {
  const int64_t groups = (n_rows + 15) / 16;
  std::memset(dst, 0, static_cast<size_t>(groups * 16 * k * B));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < 16 && g * 16 + r < n_rows; ++r) {
      const uint8_t* row = src + (g * 16 + r) * src_row_bytes;
      uint8_t* out = dst + static_cast<size_t>(g * 16 * k * B);
      for (int64_t j = 0; j < k; ++j) std::memcpy(out + 16 * B * j + B * r, row + B * j, B);
    }
}

// Weight j of a file row, widened exactly.
inline float f16_at(const uint8_t* row, int64_t j) {
  uint16_t v;
  std::memcpy(&v, row + 2 * j, 2);
  return fp16_to_fp32(v);
}
inline float bf16_at(const uint8_t* row, int64_t j) {
  uint16_t v;
  std::memcpy(&v, row + 2 * j, 2);
  return bf16_to_fp32(v);
}
inline float f32_at(const uint8_t* row, int64_t j) {
  float v;
  std::memcpy(&v, row + 4 * j, 4);
  return v;
}

// The float layout's arithmetic on the file's rows (BARATA_REPACK=0).
template <float (*At)(const uint8_t*, int64_t)>
void f_tile_rows(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k, const uint8_t* acts,
                 size_t act_stride, int64_t n_tokens, float* out, size_t ldy) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* x = reinterpret_cast<const float*>(acts + t * act_stride);
      float ae = 0.0f, ao = 0.0f;
      int64_t j = 0;
      for (; j + 2 <= k; j += 2) {
        ae = std::fma(At(row, j), x[j], ae);
        ao = std::fma(At(row, j + 1), x[j + 1], ao);
      }
      if (j < k) ae = std::fma(At(row, j), x[j], ae);
      out[t * ldy + r] = ae + ao;
    }
  }
}

// ---- repacked K-quants (Q4_K, Q5_K, Q6_K) ------------------------------------------
// The same 16-row interleaving, per block of 32 weights (a K-quant sub-block),
// with the super-block's scales kept compact: per group and super-block of
// 256, the 16 rows' fp16 d (and dmin) and their 6-bit sub-block scales (and
// mins) as bytes. Per block b, row r:
//     Q4_K / Q5_K: u = q (0..15 / 0..31), dv = float(sc) * d, mv = -(float(m) * dmin),
//                  acc = fma(float(isum), dv * d_x, acc); acc = fma(mv, s_x, acc)
//     Q6_K:        u = q (0..63), two sub-blocks of 16 with int8 scales sc_a, sc_b:
//                  isum_h = sum over the half of u * x - 32 * (the half's sum of x),
//                  acc = fma(float(isum_a), float(sc_a) * d * d_x, acc);
//                  acc = fma(float(isum_b), float(sc_b) * d * d_x, acc)
// k_tile_rows (below) does the same on the file's rows.
enum class KKind { kQ4K, kQ5K, kQ6K };

template <KKind K>
struct KLayout {
  static constexpr size_t kCodes = 256;  // nibble words, as the 4-bit types above
  static constexpr size_t kHigh = K == KKind::kQ5K ? 64 : K == KKind::kQ6K ? 128 : 0;
  // per super-block: d[16] fp16, (dmin[16] fp16), scales: Q4_K/Q5_K sc[8][16], m[8][16]; Q6_K
  // sc[16][16]
  static constexpr size_t kSuper = K == KKind::kQ6K ? 32 + 256 : 64 + 256;
  static constexpr size_t kGroupPerSuper = 8 * (kCodes + kHigh) + kSuper;  // 16 rows x 256
};

// Row r's sub-block b: codes, the raw fp16 d / dmin and the integer scales.
struct KRowBlock {
  uint8_t u[32];
  uint16_t d, dmin;
  int sc_a, sc_b, m;  // Q4_K/Q5_K: sc_a and m; Q6_K: sc_a (weights 0..15), sc_b (16..31)
};

template <KKind K>
KRowBlock k_row_block(const uint8_t* row, int64_t b) {
  KRowBlock o{};
  const int j = static_cast<int>(b % 8);
  if constexpr (K == KKind::kQ6K) {
    const BlockQ6_K& x = reinterpret_cast<const BlockQ6_K*>(row)[b / 8];
    const int h = j / 4, jj = j % 4;
    for (int l = 0; l < 32; ++l) {
      const int lo = (x.ql[64 * h + 32 * (jj % 2) + l] >> (4 * (jj / 2))) & 0x0f;
      const int hi = (x.qh[32 * h + l] >> (2 * jj)) & 0x03;
      o.u[l] = static_cast<uint8_t>(lo | (hi << 4));
    }
    o.d = x.d;
    o.sc_a = x.scales[2 * j];
    o.sc_b = x.scales[2 * j + 1];
  } else {
    using Block = std::conditional_t<K == KKind::kQ4K, BlockQ4_K, BlockQ5_K>;
    const Block& x = reinterpret_cast<const Block*>(row)[b / 8];
    for (int l = 0; l < 32; ++l) {
      int q = (x.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
      if constexpr (K == KKind::kQ5K) q |= ((x.qh[l] >> j) & 1) << 4;
      o.u[l] = static_cast<uint8_t>(q);
    }
    o.d = x.d;
    o.dmin = x.dmin;
    simd::scale_min(x.scales, j, o.sc_a, o.m);
  }
  return o;
}

template <KKind K>
size_t k_row_bytes(int64_t k) {
  return static_cast<size_t>(k / 256) * KLayout<K>::kGroupPerSuper / 16;
}

template <KKind K>
void k_repack(const uint8_t* src, size_t src_row_bytes, int64_t k, int64_t n_rows, uint8_t* dst) {
  using L = KLayout<K>;
  const int64_t nb = k / 32, nsb = k / 256;
  const int64_t groups = (n_rows + 15) / 16;
  const size_t group_bytes = static_cast<size_t>(nsb) * L::kGroupPerSuper;
  std::memset(dst, 0, static_cast<size_t>(groups) * group_bytes);
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* codes = dst + g * group_bytes;
    uint8_t* high = codes + nb * L::kCodes;
    uint8_t* super = high + nb * L::kHigh;
    for (int64_t r = 0; r < 16 && g * 16 + r < n_rows; ++r) {
      const uint8_t* row = src + (g * 16 + r) * src_row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        const KRowBlock kb = k_row_block<K>(row, b);
        uint8_t* c = codes + b * L::kCodes;
        // Eight codes at a time, no branch per bit (the bits are random).
        uint64_t u8[4];
        std::memcpy(u8, kb.u, 32);
        for (int i = 0; i < 4; ++i) {
          const uint32_t word = pack_nibble_word(u8[i] & 0x0f0f0f0f0f0f0f0full);
          std::memcpy(c + 64 * i + 4 * r, &word, 4);
        }
        uint8_t* h = high + b * L::kHigh;
        for (int gi = 0; gi < 8; ++gi) {
          uint32_t x;
          std::memcpy(&x, kb.u + 4 * gi, 4);
          if constexpr (K == KKind::kQ5K) {
            // Bits 4r .. 4r + 3 of word gi: the fifth bits of codes 4gi .. 4gi + 3
            // (one per byte of x, gathered into a nibble by the multiply).
            const uint32_t nib = (((x >> 4) & 0x01010101u) * 0x01020408u) >> 24;
            h[8 * gi + r / 2] |= static_cast<uint8_t>(nib << (4 * (r % 2)));
          } else if constexpr (K == KKind::kQ6K) {
            // word gi / 4, bytes 4r .. 4r + 3, bits 2 (gi % 4) .. + 1
            uint32_t w;
            std::memcpy(&w, h + 64 * (gi / 4) + 4 * r, 4);
            w |= ((x >> 4) & 0x03030303u) << (2 * (gi % 4));
            std::memcpy(h + 64 * (gi / 4) + 4 * r, &w, 4);
          }
        }
        uint8_t* sp = super + (b / 8) * L::kSuper;
        const int sub = static_cast<int>(b % 8);
        std::memcpy(sp + 2 * r, &kb.d, 2);
        if constexpr (K == KKind::kQ6K) {
          sp[32 + 16 * (2 * sub) + r] = static_cast<uint8_t>(static_cast<int8_t>(kb.sc_a));
          sp[32 + 16 * (2 * sub + 1) + r] = static_cast<uint8_t>(static_cast<int8_t>(kb.sc_b));
        } else {
          std::memcpy(sp + 32 + 2 * r, &kb.dmin, 2);
          sp[64 + 16 * sub + r] = static_cast<uint8_t>(kb.sc_a);
          sp[64 + 128 + 16 * sub + r] = static_cast<uint8_t>(kb.m);
        }
      }
    }
  }
}

// Sums of the activation's int8 values over weights 0..15 and 16..31 (AVX2
// intrinsics: every copy that includes this file has them).
inline void half_sums(const int8_t* q, int32_t& a, int32_t& b) {
  const __m256i v = _mm256_xor_si256(load256(q), _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i sad = _mm256_sad_epu8(v, _mm256_setzero_si256());  // 4 x sum of 8 (x + 128)
  const __m256i pair = _mm256_add_epi64(sad, _mm256_shuffle_epi32(sad, 0x4e));
  a = _mm256_cvtsi256_si32(pair) - 16 * 128;
  b = _mm_cvtsi128_si32(_mm256_extracti128_si256(pair, 1)) - 16 * 128;
}

template <KKind K>
void k_tile_rows(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k, const uint8_t* acts,
                 size_t act_stride, int64_t n_tokens, float* out, size_t ldy) {
  const int64_t nb = k / 32;
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint8_t* row = w + r * row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const auto* x = reinterpret_cast<const BlockQ8Act*>(acts + t * act_stride);
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const KRowBlock kb = k_row_block<K>(row, b);
        const float d = fp16_to_fp32(kb.d);
        if constexpr (K == KKind::kQ6K) {
          int32_t sa, sb;
          half_sums(x[b].q, sa, sb);
          const int32_t ia = code_dot(kb.u, x[b].q, 0, 16) - 32 * sa;
          const int32_t ib = code_dot(kb.u, x[b].q, 16, 32) - 32 * sb;
          acc = std::fma(static_cast<float>(ia), static_cast<float>(kb.sc_a) * d * x[b].d, acc);
          acc = std::fma(static_cast<float>(ib), static_cast<float>(kb.sc_b) * d * x[b].d, acc);
        } else {
          const float dv = static_cast<float>(kb.sc_a) * d;
          const float mv = -(static_cast<float>(kb.m) * fp16_to_fp32(kb.dmin));
          acc = std::fma(static_cast<float>(code_dot(kb.u, x[b].q, 0, 32)), dv * x[b].d, acc);
          acc = std::fma(mv, x[b].s, acc);
        }
      }
      out[t * ldy + r] = acc;
    }
  }
}
