// Reference row (de)quantizers, one pair per type; bound into the traits table
// in dtype.cpp. Internal to the library.
#pragma once

#include <cstdint>

namespace barata::rows {

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

#undef BARATA_ROW_FNS

}  // namespace barata::rows
