// The 32-weight block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: reference scalar
// code. Rounding follows llama.cpp's quantize_row_*_ref (ggml-quants.c, b4748)
// so a block quantized here is byte-equal to one quantized there; the order of
// float operations in the dequantizers matches gguf-py's numpy code so results
// are bit-equal (the project compiles with -ffp-contract=off for this).
#include <cmath>
#include <cstring>

#include "barata/error.h"
#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "rows.h"

namespace barata::rows {
namespace {

// The element of largest magnitude, sign kept (the first one on ties).
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, int n, float& min, float& max) {
  min = x[0];
  max = x[0];
  for (int j = 1; j < n; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
}

inline int min_int(int a, int b) {
  return a < b ? a : b;
}

}  // namespace

// ---- Q4_0: x = d * (q - 8) ------------------------------------------------------
void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0, nb = whole_blocks(n, kQK4_0, "Q4_0"); i < nb; ++i, dst += kQK4_0) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      dst[j] = d * static_cast<float>((b[i].qs[j] & 0x0f) - 8);
      dst[j + kQK4_0 / 2] = d * static_cast<float>((b[i].qs[j] >> 4) - 8);
    }
  }
}

void quantize_q4_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0, nb = whole_blocks(n, kQK4_0, "Q4_0"); i < nb; ++i, src += kQK4_0) {
    const float d = signed_absmax(src, kQK4_0) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int q0 = min_int(15, static_cast<int8_t>(src[j] * id + 8.5f));
      const int q1 = min_int(15, static_cast<int8_t>(src[j + kQK4_0 / 2] * id + 8.5f));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// ---- Q4_1: x = d * q + m ----------------------------------------------------------
void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_1*>(src);
  for (int64_t i = 0, nb = whole_blocks(n, kQK4_1, "Q4_1"); i < nb; ++i, dst += kQK4_1) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      dst[j] = d * static_cast<float>(b[i].qs[j] & 0x0f) + m;
      dst[j + kQK4_1 / 2] = d * static_cast<float>(b[i].qs[j] >> 4) + m;
    }
  }
}

void quantize_q4_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0, nb = whole_blocks(n, kQK4_1, "Q4_1"); i < nb; ++i, src += kQK4_1) {
    float min, max;
    min_max(src, kQK4_1, min, max);
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(min);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const int q0 = min_int(15, static_cast<int8_t>((src[j] - min) * id + 0.5f));
      const int q1 = min_int(15, static_cast<int8_t>((src[j + kQK4_1 / 2] - min) * id + 0.5f));
      b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// ---- Q5_0 / Q5_1: a fifth bit per element in qh (bit j = element j) -------------
namespace {
inline uint32_t load_qh(const uint8_t qh[4]) {
  uint32_t v;
  std::memcpy(&v, qh, 4);  // little-endian in the file, as on every host we build for
  return v;
}
inline void store_qh(uint8_t qh[4], uint32_t v) {
  std::memcpy(qh, &v, 4);
}
}  // namespace

void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_0*>(src);
  for (int64_t i = 0, nb = whole_blocks(n, kQK5_0, "Q5_0"); i < nb; ++i, dst += kQK5_0) {
    const float d = fp16_to_fp32(b[i].d);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
      dst[j] = d * static_cast<float>(((b[i].qs[j] & 0x0f) | (h0 << 4)) - 16);
      dst[j + kQK5_0 / 2] = d * static_cast<float>(((b[i].qs[j] >> 4) | (h1 << 4)) - 16);
    }
  }
}

void quantize_q5_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0, nb = whole_blocks(n, kQK5_0, "Q5_0"); i < nb; ++i, src += kQK5_0) {
    const float d = signed_absmax(src, kQK5_0) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int q0 = min_int(31, static_cast<int8_t>(src[j] * id + 16.5f));
      const int q1 = min_int(31, static_cast<int8_t>(src[j + kQK5_0 / 2] * id + 16.5f));
      b[i].qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
    }
    store_qh(b[i].qh, qh);
  }
}

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_1*>(src);
  for (int64_t i = 0, nb = whole_blocks(n, kQK5_1, "Q5_1"); i < nb; ++i, dst += kQK5_1) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
      dst[j] = d * static_cast<float>((b[i].qs[j] & 0x0f) | (h0 << 4)) + m;
      dst[j + kQK5_1 / 2] = d * static_cast<float>((b[i].qs[j] >> 4) | (h1 << 4)) + m;
    }
  }
}

void quantize_q5_1(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0, nb = whole_blocks(n, kQK5_1, "Q5_1"); i < nb; ++i, src += kQK5_1) {
    float min, max;
    min_max(src, kQK5_1, min, max);
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    b[i].m = fp32_to_fp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const int q0 = static_cast<uint8_t>((src[j] - min) * id + 0.5f);
      const int q1 = static_cast<uint8_t>((src[j + kQK5_1 / 2] - min) * id + 0.5f);
      b[i].qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
    }
    store_qh(b[i].qh, qh);
  }
}

// ---- Q8_0: x = d * q --------------------------------------------------------------
void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0, nb = whole_blocks(n, kQK8_0, "Q8_0"); i < nb; ++i, dst += kQK8_0) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK8_0; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void quantize_q8_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0, nb = whole_blocks(n, kQK8_0, "Q8_0"); i < nb; ++i, src += kQK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(src[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(src[j] * id));
  }
}

}  // namespace barata::rows
