// Which instruction set the CPU kernels use: the best one this CPU has, chosen
// once when the first kernel is looked up, or the one BARATA_ISA names
// (scalar, avx2, avxvnni, avx512), which tests and benches use to force each path.
#pragma once

#include <string>

#include "cpu/dot.h"

namespace barata {

// In order: a copy falls through to the ones below it for what it lacks.
enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvxVnni = 2, kAvx512 = 3 };
inline constexpr CpuIsa kAllCpuIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvxVnni,
                                         CpuIsa::kAvx512};

const char* cpu_isa_name(CpuIsa isa);
// Built into this binary, and the CPU has every feature the set needs:
//   avx2     AVX2, FMA, F16C
//   avxvnni  the above and AVX-VNNI (256-bit vpdpbusd)
//   avx512   AVX2, FMA, F16C and AVX-512 F, BW, VL, DQ, VNNI
bool cpu_isa_available(CpuIsa isa);
CpuIsa cpu_best_isa();
// The ISA in use: BARATA_ISA when set (an unknown or unavailable name is an
// error), else cpu_best_isa().
CpuIsa cpu_isa();
// Forces the ISA (tests); fails when it is not available. Weights bound before
// the change keep their kernels.
void set_cpu_isa(CpuIsa isa);
// "avx512 (avx512f avx512bw avx512vl avx512dq avx512vnni; avx512bf16 not used)"-style
// line for -v: the ISA in use and the CPU flags it was chosen from.
std::string cpu_isa_report();

// The kernel set of an ISA (see dot.h: null entries fall through to lower sets).
const CpuKernelSet& cpu_kernel_set(CpuIsa isa);

// The vector helpers of an ISA, each from the best copy at or below it.
struct CpuVectorOps {
  float (*dot_f32)(const float* a, const float* b, int64_t k);
  void (*swiglu)(float* gate, const float* up, int64_t n);
  void (*geglu)(float* gate, const float* up, int64_t n);
};
CpuVectorOps cpu_vector_ops(CpuIsa isa);
// The tiled attention of the best copy at or below `isa` that takes this head
// size (the scalar copy takes every size).
using CpuAttendFn = void (*)(const AttnArgs& a, const int32_t* table, int64_t t0, int64_t t1,
                             int64_t kvh);
CpuAttendFn cpu_attend(CpuIsa isa, int64_t head_dim);

}  // namespace barata
