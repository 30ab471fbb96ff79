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

// barata's own block types (docs/quantize.md). The 4-bit ones pack each 32
// weights as llama.cpp's Q4_0 does (low nibble = element i, high = i + 16).
inline constexpr int kQKG128 = 128;  // I4_G128 group (a row layout: see barata_quant.cpp)
inline constexpr int kQKNF4 = 64;
struct BlockNF4 {
  uint16_t d;  // fp16 absmax: x = d * kNF4Values[nibble]
  uint8_t qs[kQKNF4 / 2];
};
// The NF4 code book: 16 quantiles of N(0, 1) scaled to [-1, 1], as published
// by bitsandbytes (functional.py, get_4bit_type("nf4")) for QLoRA
// (Dettmers et al. 2023).
inline constexpr float kNF4Values[16] = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockNF4) == 34);

// IQ4_NL code book (llama.cpp ggml-common.h kvalues_iq4nl; also gguf-py quants.py).
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace barata
