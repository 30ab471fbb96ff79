// barata's own quantization schemes: reference scalar code (docs/quantize.md).
//
//   I8_ROW / I8_TENSOR   x = d * q, q in -127..127, d = absmax / 127
//   I4_ROW / I4_TENSOR   x = d * q, q in -8..7 (stored q + 8), d = absmax / 7
//   I4_G128              as int4, one fp16 d per 128 weights of a row (rows are
//                        whole 32s; the last group may be shorter)
//   NF4_B64              x = absmax * kNF4Values[i], one fp16 absmax per 64
//
// Per-row types start each row with its fp32 d; per-tensor types keep rows at
// unit scale (the matrix's d sits in the tensor header, see dtype.cpp).
// 4-bit rows pack each run of c <= 32 weights as llama.cpp's Q4_0 does: byte j
// holds element j (low nibble) and element j + c/2 (high nibble).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "rows.h"

namespace barata::rows {
namespace {

float absmax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, std::fabs(x[j]));
  return m;
}

inline int quantize_level(float x, float id, int lo, int hi) {
  const float q = std::nearbyint(x * id);
  return static_cast<int>(std::clamp(q, static_cast<float>(lo), static_cast<float>(hi)));
}

int64_t even_length(int64_t n, const char* type) {
  if (n < 0 || n % 2 != 0) fail("{}: row length {} must be even (two weights per byte)", type, n);
  return n;
}

// Stored nibbles (0..15) of n weights, n even.
void pack_nibbles(const uint8_t* nib, int64_t n, uint8_t* out) {
  for (int64_t c0 = 0; c0 < n; c0 += 32) {
    const int64_t half = std::min<int64_t>(32, n - c0) / 2;
    for (int64_t j = 0; j < half; ++j)
      out[c0 / 2 + j] = static_cast<uint8_t>(nib[c0 + j] | (nib[c0 + j + half] << 4));
  }
}

void unpack_nibbles(const uint8_t* in, int64_t n, uint8_t* nib) {
  for (int64_t c0 = 0; c0 < n; c0 += 32) {
    const int64_t half = std::min<int64_t>(32, n - c0) / 2;
    for (int64_t j = 0; j < half; ++j) {
      nib[c0 + j] = in[c0 / 2 + j] & 0x0f;
      nib[c0 + j + half] = in[c0 / 2 + j] >> 4;
    }
  }
}

float read_f32(const void* p) {
  float d;
  std::memcpy(&d, p, sizeof d);
  return d;
}

// The NF4 level nearest to v (v in [-1, 1]); ties go to the lower level.
uint8_t nearest_nf4(float v) {
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (kNF4Values[mid] <= v)
      lo = mid;
    else
      hi = mid;
  }
  return static_cast<uint8_t>(v - kNF4Values[lo] <= kNF4Values[hi] - v ? lo : hi);
}

}  // namespace

// ---- int8 -----------------------------------------------------------------------
void quantize_i8_scaled(const float* src, void* dst, int64_t n, float d) {
  auto* q = static_cast<int8_t*>(dst);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int64_t j = 0; j < n; ++j) q[j] = static_cast<int8_t>(quantize_level(src[j], id, -127, 127));
}

void dequantize_i8_levels(const void* src, float* dst, int64_t n) {
  const auto* q = static_cast<const int8_t*>(src);
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<float>(q[j]);
}

void quantize_i8_row(const float* src, void* dst, int64_t n) {
  const float d = absmax(src, n) / 127.0f;
  std::memcpy(dst, &d, sizeof d);
  quantize_i8_scaled(src, static_cast<uint8_t*>(dst) + 4, n, d);
}

void dequantize_i8_row(const void* src, float* dst, int64_t n) {
  const float d = read_f32(src);
  const auto* q = static_cast<const int8_t*>(src) + 4;
  for (int64_t j = 0; j < n; ++j) dst[j] = d * static_cast<float>(q[j]);
}

// ---- int4 -----------------------------------------------------------------------
void quantize_i4_scaled(const float* src, void* dst, int64_t n, float d) {
  even_length(n, "int4");
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  uint8_t nib[32];
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t c0 = 0; c0 < n; c0 += 32) {
    const int64_t c = std::min<int64_t>(32, n - c0);
    for (int64_t j = 0; j < c; ++j)
      nib[j] = static_cast<uint8_t>(quantize_level(src[c0 + j], id, -8, 7) + 8);
    pack_nibbles(nib, c, out + c0 / 2);
  }
}

void dequantize_i4_levels(const void* src, float* dst, int64_t n) {
  even_length(n, "int4");
  uint8_t nib[32];
  const auto* in = static_cast<const uint8_t*>(src);
  for (int64_t c0 = 0; c0 < n; c0 += 32) {
    const int64_t c = std::min<int64_t>(32, n - c0);
    unpack_nibbles(in + c0 / 2, c, nib);
    for (int64_t j = 0; j < c; ++j) dst[c0 + j] = static_cast<float>(nib[j] - 8);
  }
}

void quantize_i4_row(const float* src, void* dst, int64_t n) {
  const float d = absmax(src, n) / 7.0f;
  std::memcpy(dst, &d, sizeof d);
  quantize_i4_scaled(src, static_cast<uint8_t*>(dst) + 4, n, d);
}

void dequantize_i4_row(const void* src, float* dst, int64_t n) {
  const float d = read_f32(src);
  dequantize_i4_levels(static_cast<const uint8_t*>(src) + 4, dst, n);
  for (int64_t j = 0; j < n; ++j) dst[j] *= d;
}

// ---- int4 group-128 -------------------------------------------------------------
// Row: fp16 d of each started group of 128, then the nibbles of the whole row.
void quantize_i4_g128(const float* src, void* dst, int64_t n) {
  whole_blocks(n, 32, "I4_G128");
  const int64_t groups = (n + kQKG128 - 1) / kQKG128;
  auto* d = static_cast<uint16_t*>(dst);
  auto* qs = static_cast<uint8_t*>(dst) + 2 * groups;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t len = std::min<int64_t>(kQKG128, n - g * kQKG128);
    d[g] = fp32_to_fp16(absmax(src + g * kQKG128, len) / 7.0f);
    quantize_i4_scaled(src + g * kQKG128, qs + g * kQKG128 / 2, len, fp16_to_fp32(d[g]));
  }
}

void dequantize_i4_g128(const void* src, float* dst, int64_t n) {
  whole_blocks(n, 32, "I4_G128");
  const int64_t groups = (n + kQKG128 - 1) / kQKG128;
  const auto* d = static_cast<const uint16_t*>(src);
  const auto* qs = static_cast<const uint8_t*>(src) + 2 * groups;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t len = std::min<int64_t>(kQKG128, n - g * kQKG128);
    float* out = dst + g * kQKG128;
    dequantize_i4_levels(qs + g * kQKG128 / 2, out, len);
    const float dg = fp16_to_fp32(d[g]);
    for (int64_t j = 0; j < len; ++j) out[j] *= dg;
  }
}

// ---- NF4 block-64 ---------------------------------------------------------------
void quantize_nf4(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockNF4*>(dst);
  uint8_t nib[kQKNF4];
  for (int64_t i = 0, nb = whole_blocks(n, kQKNF4, "NF4_B64"); i < nb; ++i, src += kQKNF4) {
    b[i].d = fp32_to_fp16(absmax(src, kQKNF4));
    const float d = fp16_to_fp32(b[i].d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQKNF4; ++j) nib[j] = nearest_nf4(std::clamp(src[j] * id, -1.0f, 1.0f));
    pack_nibbles(nib, kQKNF4, b[i].qs);
  }
}

void dequantize_nf4(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockNF4*>(src);
  uint8_t nib[kQKNF4];
  for (int64_t i = 0, nb = whole_blocks(n, kQKNF4, "NF4_B64"); i < nb; ++i, dst += kQKNF4) {
    const float d = fp16_to_fp32(b[i].d);
    unpack_nibbles(b[i].qs, kQKNF4, nib);
    for (int j = 0; j < kQKNF4; ++j) dst[j] = d * kNF4Values[nib[j]];
  }
}

}  // namespace barata::rows
