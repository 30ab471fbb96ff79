// Packed block layouts of llama.cpp's quantized types. The layouts are facts of
// the GGUF format (ggml-common.h in llama.cpp, release b4748); sizes are checked.
#pragma once

#include <cstdint>

namespace barata {

inline constexpr int kQK4_0 = 32;
inline constexpr int kQK4_1 = 32;
inline constexpr int kQK5_0 = 32;
inline constexpr int kQK5_1 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK4_NL = 32;
inline constexpr int kQK_K = 256;       // super-block of the K-quants
inline constexpr int kKScaleSize = 12;  // packed 6-bit scales and mins of Q4_K/Q5_K

#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;              // fp16 scale
  uint8_t qs[kQK4_0 / 2];  // nibbles: low = element i, high = element i + 16
};
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qs[kQK4_1 / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // fifth bit of each of the 32 elements, little-endian uint32
  uint8_t qs[kQK5_0 / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
struct BlockQ4_K {
  uint16_t d;                   // fp16 super-block scale of the scales
  uint16_t dmin;                // fp16 super-block scale of the mins
  uint8_t scales[kKScaleSize];  // 8 sub-blocks of 32: 6-bit scale and 6-bit min each
  uint8_t qs[kQK_K / 2];        // nibbles
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];  // fifth bits
  uint8_t qs[kQK_K / 2];  // low nibbles
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 8-bit scales of 16 sub-blocks of 16
  uint16_t d;                 // fp16 super-block scale
};
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK4_NL / 2];  // indices into the non-linear code book
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_NL) == 18);

// IQ4_NL code book (llama.cpp ggml-common.h kvalues_iq4nl; also gguf-py quants.py).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace barata
