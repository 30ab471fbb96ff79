// Dot-product tile kernels (see matmul.h for the DotTileFn contract), compiled
// once per instruction set.
//
// Each kernel source (dot.cpp, dot_kquants.cpp, dot_barata.cpp, dot_avx512.cpp,
// dot_table.cpp) is built several times by CMake, each time with one ISA's
// target flags and BARATA_ISA_NS naming the namespace it lands in
// (isa_scalar, isa_avx2, isa_avx512). Nothing in those files may have
// external linkage outside that namespace: a template or inline function
// shared between the copies would let the linker keep the AVX-512 one for all.
// The one entry point of each copy is its kernel set; isa.h chooses which set
// runs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/matmul.h"

namespace barata {

// What one ISA's copy provides. Null entries (and types missing from
// `matmul`) fall through to the next lower ISA's set, then to the reference.
struct CpuKernelSet {
  const char* isa;             // "scalar", "avx2", "avx512"
  const MatmulKernel* matmul;  // fast kernels of this ISA
  size_t n_matmul;
  float (*dot_f32)(const float* a, const float* b, int64_t k);
  float (*dot_f16_f32)(const uint16_t* w, const float* x, int64_t k);
  void (*axpy_f16)(float a, const uint16_t* x, float* y, int64_t k);  // y += a * x
  // quantize_row_q8_act (matmul.h), the same bits, vectorized.
  void (*quantize_row_q8)(const float* x, BlockQ8Act* out, int64_t k) = nullptr;
};

namespace isa_scalar {
const CpuKernelSet& kernel_set();
}
namespace isa_avx2 {
const CpuKernelSet& kernel_set();
}
namespace isa_avx512 {
const CpuKernelSet& kernel_set();
}

#if defined(BARATA_ISA_NS)
namespace BARATA_ISA_NS {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define BARATA_DOT_ISA ".avx2"
#else
#define BARATA_DOT_ISA ".scalar"
#endif

// A growing per-thread buffer for the kernels' widened tiles. Not std::vector:
// its out-of-line members would be shared with the other ISA copies (see above).
template <typename T>
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { delete[] p_; }
  T* get(size_t n) {
    if (n > n_) {
      delete[] p_;
      p_ = new T[n];
      n_ = n;
    }
    return p_;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

float dot_f32(const float* a, const float* b, int64_t k);
float dot_f16_f32(const uint16_t* w, const float* x, int64_t k);
void axpy_f16(float a, const uint16_t* x, float* y, int64_t k);  // y += a * x

#define BARATA_DOT_TILE(name)                                                                   \
  void name(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k, const uint8_t* acts, \
            size_t act_stride, int64_t n_tokens, float* out, size_t ldy)
BARATA_DOT_TILE(dot_tile_f32);
BARATA_DOT_TILE(dot_tile_f16);
BARATA_DOT_TILE(dot_tile_q4_0_q8);
BARATA_DOT_TILE(dot_tile_q4_1_q8);
BARATA_DOT_TILE(dot_tile_q8_0_q8);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define BARATA_HAVE_BARATA_QUANT_KERNELS 1
BARATA_DOT_TILE(dot_tile_i8_tensor_q8);  // dot_barata.cpp
BARATA_DOT_TILE(dot_tile_i8_row_q8);
BARATA_DOT_TILE(dot_tile_i4_tensor_q8);
BARATA_DOT_TILE(dot_tile_i4_row_q8);
BARATA_DOT_TILE(dot_tile_i4_g128_q8);
BARATA_DOT_TILE(dot_tile_nf4_f32);
BARATA_DOT_TILE(dot_tile_q5_0_q8);  // dot_kquants.cpp
BARATA_DOT_TILE(dot_tile_q5_1_q8);
BARATA_DOT_TILE(dot_tile_iq4_nl_q8);
BARATA_DOT_TILE(dot_tile_q4_k_q8);
BARATA_DOT_TILE(dot_tile_q5_k_q8);
BARATA_DOT_TILE(dot_tile_q6_k_q8);
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define BARATA_HAVE_AVX512_KERNELS 1
// dot_avx512.cpp: 64 weights per step, vpdpbusd, register tiles of rows x tokens.
// k must be a multiple of 64 (16 for the float types).
extern const MatmulKernel kAvx512Kernels[];
extern const size_t kAvx512KernelCount;
float dot_f16_f32_avx512(const uint16_t* w, const float* x, int64_t k);
void quantize_row_q8_avx512(const float* x, BlockQ8Act* out, int64_t k);
void axpy_f16_avx512(float a, const uint16_t* x, float* y, int64_t k);
#endif

}  // namespace BARATA_ISA_NS
#endif

}  // namespace barata
