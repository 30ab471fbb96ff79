// Reference row (de)quantizers, one pair per type; bound into the traits table
// in dtype.cpp. Internal to the library.
#pragma once

#include <cstdint>

#include "barata/error.h"

namespace barata::rows {

// n / block, or an error naming the type when n is not a whole number of blocks.
inline int64_t whole_blocks(int64_t n, int64_t block, const char* type) {
  if (n < 0 || n % block != 0)
    fail("{}: {} elements is not a whole number of blocks of {}", type, n, block);
  return n / block;
}

#define BARATA_ROW_FNS(T)                                      \
  void dequantize_##T(const void* src, float* dst, int64_t n); \
  void quantize_##T(const float* src, void* dst, int64_t n);

BARATA_ROW_FNS(f32)
BARATA_ROW_FNS(f16)
BARATA_ROW_FNS(bf16)
BARATA_ROW_FNS(q4_0)
BARATA_ROW_FNS(q4_1)
BARATA_ROW_FNS(q5_0)
BARATA_ROW_FNS(q5_1)
BARATA_ROW_FNS(q8_0)
BARATA_ROW_FNS(q4_k)
BARATA_ROW_FNS(q5_k)
BARATA_ROW_FNS(q6_k)
BARATA_ROW_FNS(iq4_nl)
BARATA_ROW_FNS(i8_row)
BARATA_ROW_FNS(i4_row)
BARATA_ROW_FNS(i4_g128)
BARATA_ROW_FNS(nf4)
// The per-tensor types: rows at unit scale (levels as floats), and rows
// quantized with the matrix's scale d.
void dequantize_i8_levels(const void* src, float* dst, int64_t n);
void dequantize_i4_levels(const void* src, float* dst, int64_t n);
void quantize_i8_scaled(const float* src, void* dst, int64_t n, float d);
void quantize_i4_scaled(const float* src, void* dst, int64_t n, float d);

#undef BARATA_ROW_FNS

}  // namespace barata::rows
