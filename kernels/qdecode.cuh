// Four consecutive weights of a row in its stored type, as fp32: the one
// decoder behind the batched matmul (qmm.cu), the row dequantizer that feeds
// cuBLAS and the embedding lookup of the types that gemv.cu and elem_decode.cuh
// do not read. __host__ __device__, so tests compare it on the host, bit for
// bit, with barata's reference dequantizers (tests/test_emu_qmm.cpp).
//
// QFmt<T>::decode4(row, k, e, lut, out) writes elements e..e+3 of a row of k
// (e % 4 == 0; an element at or past k is 0). `row` is the start of the row
// as the model gives it: the row header included for the kRow types, past the
// tensor header for the kTensor types (which decode at unit scale; the
// caller's `scale` multiplies later, as on the CPU). Rows may lie at any byte
// address: every load is a byte load. `lut` points at the type's 16-entry
// code book as floats (NF4, IQ4_NL; others ignore it), which kernels keep in
// shared memory: 16 consecutive words are 16 banks, so a warp's lookups never
// conflict, where __constant__ memory would serialise divergent indices.
//
// Each value is the reference's operations in its order, each rounded, never
// fused (src/dtype/legacy.cpp, kquants.cpp, barata_quant.cpp):
//   Q5_0   d * (q - 16)          Q5_1  d * q + m          IQ4_NL  d * book[q]
//   Q4_K   (d * sc) * q - dmin * m                        Q5_K    the same, 5 bits
//   Q6_K   (d * sc) * (q - 32)   I8_ROW d * q             I4_ROW  (q - 8) * d
//   I4_G128 (q - 8) * d_group    NF4  d * book[q]         I8/I4_TENSOR  q, q - 8
// and for the six types the GEMV reads, the formulas of block_decode.cuh.
//
// Layouts (include/barata/quant_blocks.h; the K-quants as in llama.cpp's
// ggml-common.h, b4748): 4-bit codes in chunks of 32 hold element i in the low
// nibble of byte i and element i + 16 in the high one; barata's int4 rows do
// the same per 32 weights, a short last chunk of c weights pairing i with
// i + c / 2.
#pragma once

#include <cstdint>
#include <cstring>

#include "barata/dtype.h"
#include "barata/quant_blocks.h"
#include "common.cuh"

#ifndef BARATA_HD
#define BARATA_HD __host__ __device__
#endif

namespace barata::cuda::qdec {

BARATA_HD __forceinline__ uint32_t ld8(const unsigned char* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}
BARATA_HD __forceinline__ uint32_t ld16(const unsigned char* p) {
  return ld8(p) | (ld8(p + 1) << 8);
}
BARATA_HD __forceinline__ uint32_t ld32(const unsigned char* p) {
  return ld16(p) | (ld16(p + 2) << 16);
}
BARATA_HD __forceinline__ float f32_at(const unsigned char* p) {
  const uint32_t u = ld32(p);
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}
BARATA_HD __forceinline__ float f16_at(const unsigned char* p) {
  return fp16_bits_to_float(static_cast<uint16_t>(ld16(p)));
}
BARATA_HD __forceinline__ float bf16_at(const unsigned char* p) {
  const uint32_t u = ld16(p) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}
BARATA_HD __forceinline__ float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // host code is built with -ffp-contract=off
#endif
}
BARATA_HD __forceinline__ float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
BARATA_HD __forceinline__ float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// The code books, entry by entry, as literals equal to kNF4Values and
// kIQ4NLValues (a host table is not addressable from device code; kernels copy
// these into shared memory; tests/test_emu_qmm.cpp checks the equality).
BARATA_HD inline float nf4_entry(int i) {
  switch (i & 15) {
    case 0:
      return -1.0f;
    case 1:
      return -0.6961928009986877f;
    case 2:
      return -0.5250730514526367f;
    case 3:
      return -0.39491748809814453f;
    case 4:
      return -0.28444138169288635f;
    case 5:
      return -0.18477343022823334f;
    case 6:
      return -0.09105003625154495f;
    case 7:
      return 0.0f;
    case 8:
      return 0.07958029955625534f;
    case 9:
      return 0.16093020141124725f;
    case 10:
      return 0.24611230194568634f;
    case 11:
      return 0.33791524171829224f;
    case 12:
      return 0.44070982933044434f;
    case 13:
      return 0.5626170039176941f;
    case 14:
      return 0.7229568362236023f;
    default:
      return 1.0f;
  }
}
BARATA_HD inline float iq4nl_entry(int i) {
  switch (i & 15) {
    case 0:
      return -127.0f;
    case 1:
      return -104.0f;
    case 2:
      return -83.0f;
    case 3:
      return -65.0f;
    case 4:
      return -49.0f;
    case 5:
      return -35.0f;
    case 6:
      return -22.0f;
    case 7:
      return -10.0f;
    case 8:
      return 1.0f;
    case 9:
      return 13.0f;
    case 10:
      return 25.0f;
    case 11:
      return 38.0f;
    case 12:
      return 53.0f;
    case 13:
      return 69.0f;
    case 14:
      return 89.0f;
    default:
      return 113.0f;
  }
}

// Nibble codes of elements e..e+3 (e % 4 == 0) of a 32-weight chunk whose
// 16 code bytes start at qs: bytes (e & 15) .. +3, high nibbles for e >= 16.
BARATA_HD __forceinline__ void nibbles4(const unsigned char* qs, int e, int q[4]) {
  const uint32_t w = ld32(qs + (e & 15)) >> (e >= 16 ? 4 : 0);
#pragma unroll
  for (int j = 0; j < 4; ++j) q[j] = static_cast<int>((w >> (8 * j)) & 15u);
}

// Four int8 codes in one word, element j in byte j (what __dp4a takes).
BARATA_HD __forceinline__ uint32_t pack4(const int q[4]) {
  return (static_cast<uint32_t>(q[0]) & 0xffu) | ((static_cast<uint32_t>(q[1]) & 0xffu) << 8) |
         ((static_cast<uint32_t>(q[2]) & 0xffu) << 16) | (static_cast<uint32_t>(q[3]) << 24);
}

// The 8-bit-activation form (kQ8 types): decode4_q8(row, k, e, lut, q, scale,
// off) gives elements e..e+3 as w_j = scale * q_j + off (off = 0 unless kOff)
// with q_j the signed
// int8 in byte j of q, scale and off constant over the four (and over the
// 32-element activation block, or the 16-weight group of Q6_K). The same
// split as the CPU's q8 kernels (src/cpu/dot_kquants.cpp, dot.cpp), so that
// scale * d_x * dot(q, x_q) + off * d_x * sum(x_q) is their arithmetic.
template <DType T>
struct QFmt;

// decode4 of the block types from their 8-bit form: mul(scale, q), then
// add(., off) for the types with an offset (kOff); x + (-y) is x - y exactly,
// so this is the reference's arithmetic (tests/test_emu_qmm.cpp checks it bit
// for bit against src/dtype's dequantizers).
template <typename D>
struct FromQ8 {
  static constexpr bool kLut = false;  // IQ4_NL says otherwise
  BARATA_HD static float lut_entry(int) { return 0.0f; }
  BARATA_HD static void decode4(const unsigned char* row, int64_t k, int64_t e, const float* lut,
                                float out[4]) {
    uint32_t q;
    float scale, off;
    D::decode4_q8(row, k, e, lut, q, scale, off);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float v = mul(scale, static_cast<float>(static_cast<int8_t>((q >> (8 * j)) & 0xffu)));
      out[j] = D::kOff ? add(v, off) : v;
    }
  }
};

// The float types: F32, F16 and BF16 values as they are.
template <DType T>
struct QFmtFloat {
  static constexpr bool kLut = false;
  static constexpr bool kQ8 = false;
  BARATA_HD static float lut_entry(int) { return 0.0f; }
  BARATA_HD static float at(const unsigned char* row, int64_t j) {
    if constexpr (T == DType::F32) return f32_at(row + 4 * j);
    if constexpr (T == DType::F16) return f16_at(row + 2 * j);
    return bf16_at(row + 2 * j);
  }
  BARATA_HD static void decode4(const unsigned char* row, int64_t k, int64_t e, const float*,
                                float out[4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = e + j < k ? at(row, e + j) : 0.0f;
  }
};
template <>
struct QFmt<DType::F32> : QFmtFloat<DType::F32> {};
template <>
struct QFmt<DType::F16> : QFmtFloat<DType::F16> {};
template <>
struct QFmt<DType::BF16> : QFmtFloat<DType::BF16> {};

template <>
struct QFmt<DType::Q8_0> : FromQ8<QFmt<DType::Q8_0>> {
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = false;
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* b = row + (e / 32) * sizeof(BlockQ8_0);
    scale = f16_at(b);
    off = 0.0f;
    q = ld32(b + 2 + (e & 31));
  }
};

template <>
struct QFmt<DType::Q4_0> : FromQ8<QFmt<DType::Q4_0>> {
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = false;
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* b = row + (e / 32) * sizeof(BlockQ4_0);
    int c[4];
    nibbles4(b + 2, static_cast<int>(e & 31), c);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] -= 8;
    q = pack4(c);
    scale = f16_at(b);
    off = 0.0f;
  }
};

template <>
struct QFmt<DType::Q4_1> : FromQ8<QFmt<DType::Q4_1>> {
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = true;
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* b = row + (e / 32) * sizeof(BlockQ4_1);
    int c[4];
    nibbles4(b + 4, static_cast<int>(e & 31), c);
    q = pack4(c);
    scale = f16_at(b);
    off = f16_at(b + 2);
  }
};

// Q5_0 / Q5_1: the fifth bit of element i is bit i of qh (a little-endian word).
BARATA_HD __forceinline__ void q5_codes(const unsigned char* qh_at, const unsigned char* qs, int i,
                                        int c[4]) {
  const uint32_t qh = ld32(qh_at);
  nibbles4(qs, i, c);
#pragma unroll
  for (int j = 0; j < 4; ++j) c[j] |= static_cast<int>(((qh >> (i + j)) & 1u) << 4);
}
template <>
struct QFmt<DType::Q5_0> : FromQ8<QFmt<DType::Q5_0>> {
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = false;
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* b = row + (e / 32) * sizeof(BlockQ5_0);
    int c[4];
    q5_codes(b + 2, b + 6, static_cast<int>(e & 31), c);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] -= 16;
    q = pack4(c);
    scale = f16_at(b);
    off = 0.0f;
  }
};

template <>
struct QFmt<DType::Q5_1> : FromQ8<QFmt<DType::Q5_1>> {
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = true;
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* b = row + (e / 32) * sizeof(BlockQ5_1);
    int c[4];
    q5_codes(b + 4, b + 8, static_cast<int>(e & 31), c);
    q = pack4(c);
    scale = f16_at(b);
    off = f16_at(b + 2);
  }
};

template <>
struct QFmt<DType::IQ4_NL> : FromQ8<QFmt<DType::IQ4_NL>> {
  static constexpr bool kLut = true;
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = false;
  // The code book's entries are integers (-127..113): exact as int8.
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float* lut,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* b = row + (e / 32) * sizeof(BlockIQ4_NL);
    int c[4];
    nibbles4(b + 2, static_cast<int>(e & 31), c);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] = static_cast<int>(lut[c[j]]);
    q = pack4(c);
    scale = f16_at(b);
    off = 0.0f;
  }
  BARATA_HD static float lut_entry(int i) {
    return iq4nl_entry(i);
  }
};

// Q4_K / Q5_K: sub-block s (32 weights) of a super-block has a 6-bit scale and
// min packed in 12 bytes; its codes are the low (s even) or high (s odd)
// nibbles of qs[32 (s / 2) ..], and Q5_K's fifth bit is bit s of qh[l].
BARATA_HD __forceinline__ void k4_scale_min(const unsigned char* sc, int s, int& scale, int& mn) {
  if (s < 4) {
    scale = static_cast<int>(ld8(sc + s) & 63u);
    mn = static_cast<int>(ld8(sc + s + 4) & 63u);
  } else {
    scale = static_cast<int>((ld8(sc + s + 4) & 0x0fu) | ((ld8(sc + s - 4) >> 6) << 4));
    mn = static_cast<int>((ld8(sc + s + 4) >> 4) | ((ld8(sc + s) >> 6) << 4));
  }
}

template <DType T>
struct QFmtK45 : FromQ8<QFmtK45<T>> {
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = true;
  // d * sc and dmin * m are exact in fp32 (an fp16 times a 6-bit integer).
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* b = row + (e / kQK_K) * kBytes;
    const int i = static_cast<int>(e % kQK_K), s = i / 32, l = i % 32;
    int sc, mn;
    k4_scale_min(b + 4, s, sc, mn);
    scale = mul(f16_at(b), static_cast<float>(sc));
    off = -mul(f16_at(b + 2), static_cast<float>(mn));
    const uint32_t w = ld32(b + kQs + 32 * (s / 2) + l) >> (4 * (s % 2));
    uint32_t h = 0;
    if constexpr (k5) h = ld32(b + 16 + l) >> s;
    int c[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      c[j] = static_cast<int>((w >> (8 * j)) & 15u);
      if constexpr (k5) c[j] |= static_cast<int>(((h >> (8 * j)) & 1u) << 4);
    }
    q = pack4(c);
  }
  static constexpr bool k5 = T == DType::Q5_K;
  static constexpr size_t kBytes = k5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  static constexpr int kQs = k5 ? 16 + 32 : 16;  // offset of qs in the block
};
template <>
struct QFmt<DType::Q4_K> : QFmtK45<DType::Q4_K> {};
template <>
struct QFmt<DType::Q5_K> : QFmtK45<DType::Q5_K> {};

// Q6_K: in half h (128 weights) element r takes its low nibble from
// ql[64h + r % 64] (high nibble for r >= 64), two bits from qh[32h + r % 32]
// at shift 2 (r / 32), and the int8 scale of its 16-weight group.
template <>
struct QFmt<DType::Q6_K> : FromQ8<QFmt<DType::Q6_K>> {
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = false;
  // d * sc is exact in fp32 (an fp16 times an int8).
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* b = row + (e / kQK_K) * sizeof(BlockQ6_K);
    const int i = static_cast<int>(e % kQK_K), h = i / 128, r = i % 128;
    const uint32_t lo = ld32(b + 64 * h + r % 64) >> (4 * (r / 64));
    const uint32_t hi = ld32(b + 128 + 32 * h + r % 32) >> (2 * (r / 32));
    const int sc = static_cast<int8_t>(ld8(b + 192 + i / 16));
    int c[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      c[j] = static_cast<int>(((lo >> (8 * j)) & 15u) | (((hi >> (8 * j)) & 3u) << 4)) - 32;
    q = pack4(c);
    scale = mul(f16_at(b + 208), static_cast<float>(sc));
    off = 0.0f;
  }
};

// barata's int8 rows: [fp32 d] then k int8 (I8_ROW); I8_TENSOR has no header.
template <bool kRowScale>
struct QFmtI8 {
  static constexpr bool kLut = false;
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = false;
  // Rows of whole 32-element blocks only (the activations' block).
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* c = row + (kRowScale ? 4 : 0);
    q = ld32(c + e);
    scale = kRowScale ? f32_at(row) : 1.0f;
    off = 0.0f;
  }
  BARATA_HD static float lut_entry(int) { return 0.0f; }
  BARATA_HD static void decode4(const unsigned char* row, int64_t k, int64_t e, const float*,
                                float out[4]) {
    const unsigned char* q = row + (kRowScale ? 4 : 0);
    const float d = kRowScale ? f32_at(row) : 1.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float v = e + j < k ? static_cast<float>(static_cast<int8_t>(ld8(q + e + j))) : 0.0f;
      out[j] = !kRowScale ? v : e + j < k ? mul(d, v) : 0.0f;
    }
  }
};
template <>
struct QFmt<DType::I8_ROW> : QFmtI8<true> {};
template <>
struct QFmt<DType::I8_TENSOR> : QFmtI8<false> {};

// The nibble of element j of an int4 row of k (even) weights packed per
// chunk of 32, the last chunk possibly shorter.
BARATA_HD __forceinline__ int i4_code(const unsigned char* qs, int64_t k, int64_t j) {
  const int64_t c0 = j & ~int64_t{31};
  const int64_t c = k - c0 < 32 ? k - c0 : 32;
  const int64_t half = c / 2, jj = j - c0;
  const uint32_t byte = ld8(qs + c0 / 2 + (jj < half ? jj : jj - half));
  return static_cast<int>(jj < half ? byte & 15u : byte >> 4);
}

// I4_ROW: [fp32 d] then the codes; I4_TENSOR: the codes at unit scale.
template <bool kRowScale>
struct QFmtI4 {
  static constexpr bool kLut = false;
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = false;
  // Rows of whole 32-element chunks only (the activations' block).
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const unsigned char* qs = row + (kRowScale ? 4 : 0);
    int c[4];
    nibbles4(qs + (e & ~int64_t{31}) / 2, static_cast<int>(e & 31), c);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] -= 8;
    q = pack4(c);
    scale = kRowScale ? f32_at(row) : 1.0f;
    off = 0.0f;
  }
  BARATA_HD static float lut_entry(int) {
    return 0.0f;
  }
  BARATA_HD static void decode4(const unsigned char* row, int64_t k, int64_t e, const float*,
                                float out[4]) {
    const unsigned char* qs = row + (kRowScale ? 4 : 0);
    const float d = kRowScale ? f32_at(row) : 1.0f;
    int q[4];
    if (e + 4 <= (k & ~int64_t{31})) {  // inside a whole chunk: one word
      nibbles4(qs + (e & ~int64_t{31}) / 2, static_cast<int>(e & 31), q);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) q[j] = e + j < k ? i4_code(qs, k, e + j) : 8;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float v = static_cast<float>(q[j] - 8);
      out[j] = !kRowScale ? v : e + j < k ? mul(v, d) : 0.0f;
    }
  }
};
template <>
struct QFmt<DType::I4_ROW> : QFmtI4<true> {};
template <>
struct QFmt<DType::I4_TENSOR> : QFmtI4<false> {};

// I4_G128: one fp16 scale per started group of 128 (k is whole chunks of 32),
// all before the codes.
template <>
struct QFmt<DType::I4_G128> : FromQ8<QFmt<DType::I4_G128>> {
  static constexpr bool kQ8 = true;
  static constexpr bool kOff = false;
  BARATA_HD static void decode4_q8(const unsigned char* row, int64_t k, int64_t e, const float*,
                                   uint32_t& q, float& scale, float& off) {
    const int64_t groups = (k + kQKG128 - 1) / kQKG128;
    int c[4];
    nibbles4(row + 2 * groups + (e & ~int64_t{31}) / 2, static_cast<int>(e & 31), c);
#pragma unroll
    for (int j = 0; j < 4; ++j) c[j] -= 8;
    q = pack4(c);
    scale = f16_at(row + 2 * (e / kQKG128));
    off = 0.0f;
  }
};

template <>
struct QFmt<DType::NF4_B64> {
  static constexpr bool kLut = true;
  static constexpr bool kQ8 = false;
  BARATA_HD static float lut_entry(int i) { return nf4_entry(i); }
  BARATA_HD static void decode4(const unsigned char* row, int64_t, int64_t e, const float* lut,
                                float out[4]) {
    const unsigned char* b = row + (e / kQKNF4) * sizeof(BlockNF4);
    const int i = static_cast<int>(e % kQKNF4);
    const float d = f16_at(b);
    int q[4];
    nibbles4(b + 2 + 16 * (i / 32), i & 31, q);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = mul(d, lut[q[j]]);
  }
};

}  // namespace barata::cuda::qdec

// Every type with a QFmt, for dispatch: X(F32) X(F16) ... (DType enumerator names).
// clang-format off
#define BARATA_QFMT_TYPES(X) \
  X(F32) X(F16) X(BF16) X(Q8_0) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q4_K) X(Q5_K) X(Q6_K) \
  X(IQ4_NL) X(I8_TENSOR) X(I8_ROW) X(I4_TENSOR) X(I4_ROW) X(I4_G128) X(NF4_B64)
// clang-format on
