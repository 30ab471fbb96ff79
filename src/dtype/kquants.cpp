// Dequantizers of the 256-weight super-block types Q4_K, Q5_K, Q6_K and of
// IQ4_NL. Layouts are those of llama.cpp (ggml-common.h, b4748); the order of
// float operations matches gguf-py's numpy code, so results are bit-equal.
#include "barata/error.h"
#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "rows.h"

namespace barata::rows {
namespace {

// Unpacks the 6-bit scale and min of sub-block j (0..7) from the 12 packed
// bytes: bytes 0-3 scales 0-3, bytes 4-7 mins 0-3, bytes 8-11 the low nibbles
// of scales/mins 4-7, whose two high bits sit in the top of bytes 0-7.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0, nb = whole_blocks(n, kQK_K, "Q4_K"); i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    // Each 32 bytes of qs hold two sub-blocks: low nibbles then high nibbles.
    for (int j = 0; j < 8; ++j, dst += 32) {
      uint8_t sc, m;
      scale_min_k4(j, b[i].scales, sc, m);
      const float dj = d * static_cast<float>(sc), mj = dmin * static_cast<float>(m);
      const uint8_t* q = b[i].qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) dst[l] = dj * static_cast<float>((q[l] >> shift) & 0x0f) - mj;
    }
  }
}

void dequantize_q5_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_K*>(src);
  for (int64_t i = 0, nb = whole_blocks(n, kQK_K, "Q5_K"); i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    for (int j = 0; j < 8; ++j, dst += 32) {
      uint8_t sc, m;
      scale_min_k4(j, b[i].scales, sc, m);
      const float dj = d * static_cast<float>(sc), mj = dmin * static_cast<float>(m);
      const uint8_t* q = b[i].qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 0x0f) | (((b[i].qh[l] >> j) & 1) << 4);
        dst[l] = dj * static_cast<float>(v) - mj;
      }
    }
  }
}

void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0, nb = whole_blocks(n, kQK_K, "Q6_K"); i < nb; ++i, dst += kQK_K) {
    const float d = fp16_to_fp32(b[i].d);
    // Two halves of 128; within a half, element e takes its low nibble from
    // ql[64h + e%64] (shift 4 for e >= 64) and two high bits from
    // qh[32h + e%32] at shift 2*(e/32).
    for (int e = 0; e < kQK_K; ++e) {
      const int h = e / 128, r = e % 128;
      const int lo = (b[i].ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int hi = (b[i].qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
      const float ds = d * static_cast<float>(b[i].scales[e / 16]);
      dst[e] = ds * static_cast<float>((lo | (hi << 4)) - 32);
    }
  }
}

void dequantize_iq4_nl(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockIQ4_NL*>(src);
  for (int64_t i = 0, nb = whole_blocks(n, kQK4_NL, "IQ4_NL"); i < nb; ++i, dst += kQK4_NL) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < kQK4_NL / 2; ++j) {
      dst[j] = d * static_cast<float>(kIQ4NLValues[b[i].qs[j] & 0x0f]);
      dst[j + kQK4_NL / 2] = d * static_cast<float>(kIQ4NLValues[b[i].qs[j] >> 4]);
    }
  }
}

}  // namespace barata::rows
