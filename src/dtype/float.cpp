// Plain float types: F32, F16, BF16 (block size 1).
#include <cstring>

#include "barata/half.h"
#include "rows.h"

namespace barata::rows {

void dequantize_f32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void quantize_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

namespace {

// Sources may sit at any byte offset (a row inside a packed buffer): each
// value is read with memcpy, which compiles to one plain load.
uint16_t load_u16(const void* src, int64_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(src) + 2 * i, sizeof v);
  return v;
}

}  // namespace

void dequantize_f16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(src, i));
}
void quantize_f16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(src[i]);
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(src, i));
}
void quantize_bf16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(src[i]);
}

}  // namespace barata::rows
