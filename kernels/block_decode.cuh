// The arithmetic of reading one packed weight block as floats, shared by the
// device kernels (gemv.cu) and host code: plain C++ as well as CUDA, so the
// host tests compare these helpers bit for bit with barata's reference
// dequantizers (dequantize_tensor), and the emulated kernels run the very same
// functions (tests/test_emu_gemv.cpp).
//
// Every value is the reference's to the bit. Small integers become floats
// through the exponent trick (the bits 0x4B000000 | u are the float 2^23 + u,
// exactly, for u < 2^23; subtracting 2^23 + bias leaves u - bias exactly), one
// byte permute and one add on the device instead of an int-to-float
// conversion, which Hopper runs at a quarter of the FMA rate. The scale is then
// applied with the reference's own operations, in its order, never fused:
// Q4_0 d * (q - 8), Q8_0 q * d, Q4_1 d * q + m (two roundings, as numpy and
// barata's -ffp-contract=off reference do).
//
// Block layouts (include/barata/quant_blocks.h): Q4_0 {fp16 d; 16 bytes qs},
// Q4_1 {fp16 d; fp16 m; 16 bytes qs}, Q8_0 {fp16 d; int8 qs[32]}; in the
// 4-bit types qs byte i holds element i (low nibble) and element i + 16 (high).
// Blocks are 18, 20 and 34 bytes, so a block in a row can start at any even
// offset (any offset at all when the tensor itself is misaligned): the
// helpers take 32-bit little-endian words already assembled by the caller,
// or byte pointers of any alignment (the *_element functions).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(BARATA_CUDA_EMU)
#include "emu/cuda_emu.h"
#elif defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#include "barata/half.h"

#ifndef BARATA_HD
#if defined(__CUDACC__)
#define BARATA_HD __host__ __device__
#else
#define BARATA_HD
#endif
#endif

namespace barata::cuda {

// ---- bit-level pieces -------------------------------------------------------------

BARATA_HD inline float bits_as_float(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(BARATA_CUDA_EMU)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// fp16 bits -> fp32, exact (the device's cvt; barata::fp16_to_fp32 on a plain host build).
BARATA_HD inline float half_bits_as_float(uint32_t h16) {
#if defined(__CUDA_ARCH__) || defined(BARATA_CUDA_EMU)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h16 & 0xffffu)));
#else
  return fp16_to_fp32(static_cast<uint16_t>(h16 & 0xffffu));
#endif
}

// The bf16 in the low (hi = false) or high half of a word, exact: a shift or a mask.
BARATA_HD inline float bf16_in_word(uint32_t word, bool hi) {
  return bits_as_float(hi ? (word & 0xffff0000u) : (word << 16));
}

// 2^23 + byte i (0..3) of word, as a float (exact).
BARATA_HD inline float byte_plus_2p23(uint32_t word, int i) {
#if defined(__CUDA_ARCH__)
  // result bytes: [byte i of word, 0, 0, 0x4B] (selector nibbles 4, 4, 7 pick y's bytes)
  return __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | static_cast<unsigned>(i)));
#else
  return bits_as_float(0x4B000000u | ((word >> (8 * i)) & 0xffu));
#endif
}

inline constexpr float k2p23 = 8388608.0f;  // 2^23

// The 32-bit little-endian word at byte offset `byte_off` of an array of
// words, for any offset: two aligned loads and one funnel shift. The word
// after the last one touched must be readable.
BARATA_HD inline uint32_t funnel_word(uint32_t lo, uint32_t hi, uint32_t byte_shift) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, 8u * byte_shift);
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (8u * byte_shift));
#endif
}

// Byte-pointer loads of any alignment (host tests and edge cases).
BARATA_HD inline uint32_t load_le16(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8);
}
BARATA_HD inline uint32_t load_le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// Multiply and add, rounded each, never contracted into an FMA (the reference's rounding).
BARATA_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // the project builds host code with -ffp-contract=off
#endif
}
BARATA_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// ---- four elements from one word of a block ----------------------------------------
// `qs4` is the little-endian word of qs bytes [4c, 4c + 4) (c = 0..3 for the
// 4-bit types, 0..7 for Q8_0); `high` picks the high nibbles. out[j] is then
// element 4c + j (low nibbles, or Q8_0) or 16 + 4c + j (high nibbles).

BARATA_HD inline void q4_0_decode4(uint32_t qs4, bool high, float d, float out[4]) {
  const uint32_t q = (qs4 >> (high ? 4 : 0)) & 0x0f0f0f0fu;
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = mul_rn(d, byte_plus_2p23(q, j) - (k2p23 + 8.0f));
}

BARATA_HD inline void q4_1_decode4(uint32_t qs4, bool high, float d, float m, float out[4]) {
  const uint32_t q = (qs4 >> (high ? 4 : 0)) & 0x0f0f0f0fu;
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = add_rn(mul_rn(d, byte_plus_2p23(q, j) - k2p23), m);
}

BARATA_HD inline void q8_0_decode4(uint32_t qs4, float d, float out[4]) {
  const uint32_t u = qs4 ^ 0x80808080u;  // int8 q -> q + 128 in each byte
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = mul_rn(byte_plus_2p23(u, j) - (k2p23 + 128.0f), d);
}

// Two consecutive 16-bit floats packed in a word (element 2i low, 2i + 1 high).
BARATA_HD inline void f16_decode2(uint32_t word, float out[2]) {
  out[0] = half_bits_as_float(word & 0xffffu);
  out[1] = half_bits_as_float(word >> 16);
}
BARATA_HD inline void bf16_decode2(uint32_t word, float out[2]) {
  out[0] = bf16_in_word(word, false);
  out[1] = bf16_in_word(word, true);
}

// ---- element j of one block at any address (the host tests' entry points) --------

BARATA_HD inline float q4_0_element(const unsigned char* block, int j) {
  const float d = half_bits_as_float(load_le16(block));
  float v[4];
  q4_0_decode4(load_le32(block + 2 + 4 * ((j & 15) >> 2)), j >= 16, d, v);
  return v[j & 3];
}

BARATA_HD inline float q4_1_element(const unsigned char* block, int j) {
  const float d = half_bits_as_float(load_le16(block));
  const float m = half_bits_as_float(load_le16(block + 2));
  float v[4];
  q4_1_decode4(load_le32(block + 4 + 4 * ((j & 15) >> 2)), j >= 16, d, m, v);
  return v[j & 3];
}

BARATA_HD inline float q8_0_element(const unsigned char* block, int j) {
  const float d = half_bits_as_float(load_le16(block));
  float v[4];
  q8_0_decode4(load_le32(block + 2 + 4 * (j >> 2)), d, v);
  return v[j & 3];
}

// Element j of a row of 16-bit floats (j counted from `row`).
BARATA_HD inline float f16_element(const unsigned char* row, int64_t j) {
  return half_bits_as_float(load_le16(row + 2 * j));
}
BARATA_HD inline float bf16_element(const unsigned char* row, int64_t j) {
  return bf16_in_word(load_le16(row + 2 * j), false);
}
BARATA_HD inline float f32_element(const unsigned char* row, int64_t j) {
  return bits_as_float(load_le32(row + 4 * j));
}

}  // namespace barata::cuda
