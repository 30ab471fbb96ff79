// The kernel set of one ISA copy (see dot.h): what this copy's flags let the
// other kernel files build.
#include "dot.h"

namespace barata::BARATA_ISA_NS {
namespace {

#define BARATA_STR2(x) #x
#define BARATA_STR(x) BARATA_STR2(x)

#if !defined(BARATA_HAVE_AVX512_KERNELS)
const MatmulKernel kFast[] = {
#if !defined(BARATA_HAVE_R8_KERNELS)  // else dot_r8.cpp's
    MatmulKernel{DType::F32, "f32.f32" BARATA_DOT_ISA, ActFormat::kF32, dot_tile_f32},
    MatmulKernel{DType::F16, "f16.f32" BARATA_DOT_ISA, ActFormat::kF32, dot_tile_f16},
#endif
#if !defined(BARATA_HAVE_R8_KERNELS)  // else dot_r8.cpp's
    MatmulKernel{DType::Q4_0, "q4_0.q8" BARATA_DOT_ISA, ActFormat::kQ8, dot_tile_q4_0_q8},
    MatmulKernel{DType::Q4_1, "q4_1.q8" BARATA_DOT_ISA, ActFormat::kQ8, dot_tile_q4_1_q8},
#endif
#if !defined(BARATA_HAVE_R8_KERNELS)
    MatmulKernel{DType::Q8_0, "q8_0.q8" BARATA_DOT_ISA, ActFormat::kQ8, dot_tile_q8_0_q8},
#endif
#if defined(BARATA_HAVE_BARATA_QUANT_KERNELS)
    MatmulKernel{DType::I8_TENSOR, "i8_tensor.q8.avx2", ActFormat::kQ8, dot_tile_i8_tensor_q8},
    MatmulKernel{DType::I8_ROW, "i8_row.q8.avx2", ActFormat::kQ8, dot_tile_i8_row_q8},
    MatmulKernel{DType::I4_ROW, "i4_row.q8.avx2", ActFormat::kQ8, dot_tile_i4_row_q8},
    MatmulKernel{DType::NF4_B64, "nf4_b64.f32.avx2", ActFormat::kF32, dot_tile_nf4_f32},
    MatmulKernel{DType::Q5_1, "q5_1.q8.avx2", ActFormat::kQ8, dot_tile_q5_1_q8},
#endif
};
#endif

}  // namespace

const CpuKernelSet& kernel_set() {
#if defined(BARATA_HAVE_AVX512_KERNELS)
  // Only its own kernels: every other type, and rows these cannot take (k not
  // a multiple of 64), fall through to the AVX2 set.
  static const CpuKernelSet set{BARATA_STR(BARATA_ISA_NS) + 4,
                                kAvx512Kernels,
                                kAvx512KernelCount,
                                nullptr,
                                quantize_row_q8_avx512,
                                attend_supported,
                                attend_tile,
                                swiglu,
                                geglu,
                                kR8Kernels,
                                kR8KernelCount};
#elif defined(BARATA_HAVE_R8_KERNELS)
  // The 8-row kernels first: the registry takes a type's first kernel.
  static MatmulKernel all[kR8KernelMax + sizeof kFast / sizeof kFast[0]];
  static const size_t n_all = [] {
    size_t n = 0;
    for (size_t i = 0; i < kR8KernelCount && i < kR8KernelMax; ++i) all[n++] = kR8Kernels[i];
    for (const MatmulKernel& m : kFast) all[n++] = m;
    return n;
  }();
  static const CpuKernelSet set{BARATA_STR(BARATA_ISA_NS) + 4,
                                all,
                                n_all,
                                dot_f32,
                                quantize_row_q8_avx2,
                                attend_supported,
                                attend_tile,
                                swiglu,
                                geglu};
#else
  static const CpuKernelSet set{BARATA_STR(BARATA_ISA_NS) + 4,
                                kFast,
                                sizeof kFast / sizeof kFast[0],
                                dot_f32,
                                nullptr,
                                attend_supported,
                                attend_tile,
                                swiglu,
                                geglu};
#endif
  return set;
}

}  // namespace barata::BARATA_ISA_NS
