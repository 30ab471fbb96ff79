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

#include "barata/kv_types.h"
#include "cpu/matmul.h"

namespace barata {

struct BatchRowMeta;

// One attention call's view of the step (attention.cpp): queries and outputs
// [tokens][q_dim], each token's position, and where layer `layer`'s K and V
// of a cache block start.
struct AttnArgs {
  const float* q;
  float* out;
  const BatchRowMeta* rows;
  const uint8_t* kv_base;  // the pool's block 0
  int64_t block_bytes;     // bytes per pool block
  int64_t k_off, v_off;    // byte offsets of the layer's K and V in a block
  int64_t k_row, v_row;    // bytes of one token's K and V row (all heads)
  KvType k_type, v_type;   // their storage types (kv_types.h; rotation done by rope_kv)
  int64_t hd, q_dim, kv_dim, group;
  float scale;
  int64_t window;  // 0, or a sliding window: position p sees (p - window, p]
};
// The most queries (tokens x group) one attend() item may hold.
inline constexpr int64_t kAttnMaxQueries = 64;

// What one ISA's copy provides. Null entries (and types missing from
// `matmul`) fall through to the next lower ISA's set, then to the reference.
struct CpuKernelSet {
  const char* isa;             // "scalar", "avx2", "avxvnni", "avx512"
  const MatmulKernel* matmul;  // fast kernels of this ISA
  size_t n_matmul;
  float (*dot_f32)(const float* a, const float* b, int64_t k);
  // quantize_row_q8_act (matmul.h), the same bits, vectorized.
  void (*quantize_row_q8)(const float* x, BlockQ8Act* out, int64_t k) = nullptr;
  // Tiled attention (attention.cpp) of tokens [t0, t1) of one sequence and
  // one KV head, for head sizes attend_supported() accepts.
  bool (*attend_supported)(int64_t hd) = nullptr;
  void (*attend)(const AttnArgs& a, const int32_t* table, int64_t t0, int64_t t1,
                 int64_t kvh) = nullptr;
  // gate = act(gate) * up: SiLU and GELU (tanh form).
  void (*swiglu)(float* gate, const float* up, int64_t n) = nullptr;
  void (*geglu)(float* gate, const float* up, int64_t n) = nullptr;
  // The avx512 copy only: the avxvnni copy's 8-row kernels built with the EVEX
  // encoding of the 256-bit vpdpbusd, so that tests run their arithmetic on
  // the AVX-512 machines (none here has AVX-VNNI). Never bound to weights.
  const MatmulKernel* r8_vnni = nullptr;
  size_t n_r8_vnni = 0;
};

namespace isa_scalar {
const CpuKernelSet& kernel_set();
}
namespace isa_avx2 {
const CpuKernelSet& kernel_set();
}
namespace isa_avxvnni {
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

bool attend_supported(int64_t hd);  // attention.cpp
void attend_tile(const AttnArgs& a, const int32_t* table, int64_t t0, int64_t t1, int64_t kvh);
void swiglu(float* gate, const float* up, int64_t n);
void geglu(float* gate, const float* up, int64_t n);

float dot_f32(const float* a, const float* b, int64_t k);
float dot_f16_f32(const uint16_t* w, const float* x, int64_t k);

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
BARATA_DOT_TILE(dot_tile_i4_row_q8);
BARATA_DOT_TILE(dot_tile_nf4_f32);
BARATA_DOT_TILE(dot_tile_q5_1_q8);  // dot_kquants.cpp
#endif

#if defined(BARATA_HAVE_BARATA_QUANT_KERNELS)
#if !defined(__AVX512F__)
#define BARATA_HAVE_R8_KERNELS 1
#endif
// dot_r8.cpp: the 16-row interleaved layouts read as two halves of 8 rows
// (in the avx512 copy: the avxvnni copy's code on EVEX vpdpbusd, for tests).
extern const MatmulKernel kR8Kernels[];
extern const size_t kR8KernelCount;
inline constexpr size_t kR8KernelMax = 32;
void quantize_row_q8_avx2(const float* x, BlockQ8Act* out, int64_t k);
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define BARATA_HAVE_AVX512_KERNELS 1
// dot_avx512.cpp: 64 weights per step, vpdpbusd, register tiles of rows x tokens.
// k must be a multiple of 64 (16 for the float types).
extern const MatmulKernel kAvx512Kernels[];
extern const size_t kAvx512KernelCount;
void quantize_row_q8_avx512(const float* x, BlockQ8Act* out, int64_t k);
#endif

}  // namespace BARATA_ISA_NS
#endif

}  // namespace barata
