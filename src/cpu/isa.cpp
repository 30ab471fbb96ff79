#include "cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "barata/error.h"

namespace barata {
namespace {

bool has(const char* feature) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // __builtin_cpu_supports wants a literal: one branch per feature we use.
  const std::string_view f = feature;
  if (f == "avx2") return __builtin_cpu_supports("avx2");
  if (f == "fma") return __builtin_cpu_supports("fma");
  if (f == "f16c") return __builtin_cpu_supports("f16c");
  if (f == "avx512f") return __builtin_cpu_supports("avx512f");
  if (f == "avx512bw") return __builtin_cpu_supports("avx512bw");
  if (f == "avx512vl") return __builtin_cpu_supports("avx512vl");
  if (f == "avx512dq") return __builtin_cpu_supports("avx512dq");
  if (f == "avx512vnni") return __builtin_cpu_supports("avx512vnni");
  if (f == "avx512bf16") return __builtin_cpu_supports("avx512bf16");
  if (f == "avxvnni") return __builtin_cpu_supports("avxvnni");
#endif
  (void)feature;
  return false;
}

constexpr const char* kAvx2Features[] = {"avx2", "fma", "f16c"};
constexpr const char* kAvx512Features[] = {"avx2",     "fma",      "f16c",     "avx512f",
                                           "avx512bw", "avx512vl", "avx512dq", "avx512vnni"};

template <size_t N>
bool has_all(const char* const (&features)[N]) {
  for (const char* f : features)
    if (!has(f)) return false;
  return true;
}

bool built(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
#if defined(BARATA_HAVE_ISA_AVX2)
      return true;
#else
      return false;
#endif
    case CpuIsa::kAvx512:
#if defined(BARATA_HAVE_ISA_AVX512)
      return true;
#else
      return false;
#endif
  }
  return false;
}

CpuIsa from_env() {
  const char* env = std::getenv("BARATA_ISA");
  if (env == nullptr || *env == '\0') return cpu_best_isa();
  for (CpuIsa isa : kAllCpuIsas) {
    if (std::string_view(env) != cpu_isa_name(isa)) continue;
    if (!cpu_isa_available(isa))
      fail("BARATA_ISA={}: this {} has no {} kernels (best here: {})", env,
           built(isa) ? "CPU" : "build", env, cpu_isa_name(cpu_best_isa()));
    return isa;
  }
  fail("BARATA_ISA={}: unknown instruction set (scalar, avx2, avx512)", env);
}

std::atomic<int> g_isa{-1};

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool cpu_isa_available(CpuIsa isa) {
  if (!built(isa)) return false;
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return has_all(kAvx2Features);
    case CpuIsa::kAvx512:
      return has_all(kAvx512Features);
  }
  return false;
}

CpuIsa cpu_best_isa() {
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2})
    if (cpu_isa_available(isa)) return isa;
  return CpuIsa::kScalar;
}

CpuIsa cpu_isa() {
  int v = g_isa.load(std::memory_order_acquire);
  if (v < 0) {
    v = static_cast<int>(from_env());
    g_isa.store(v, std::memory_order_release);
  }
  return static_cast<CpuIsa>(v);
}

void set_cpu_isa(CpuIsa isa) {
  if (!cpu_isa_available(isa))
    fail("instruction set {} is not available here (best: {})", cpu_isa_name(isa),
         cpu_isa_name(cpu_best_isa()));
  g_isa.store(static_cast<int>(isa), std::memory_order_release);
}

std::string cpu_isa_report() {
  std::string s = cpu_isa_name(cpu_isa());
  s += " kernels; CPU has:";
  for (const char* f : {"avx2", "fma", "f16c", "avxvnni", "avx512f", "avx512bw", "avx512vl",
                        "avx512dq", "avx512vnni", "avx512bf16"})
    if (has(f)) (s += ' ') += f;
  if (cpu_isa() != cpu_best_isa())
    s += std::string("; forced by BARATA_ISA (best: ") + cpu_isa_name(cpu_best_isa()) + ")";
  return s;
}

const CpuKernelSet& cpu_kernel_set(CpuIsa isa) {
  switch (isa) {
#if defined(BARATA_HAVE_ISA_AVX512)
    case CpuIsa::kAvx512:
      return isa_avx512::kernel_set();
#endif
#if defined(BARATA_HAVE_ISA_AVX2)
    case CpuIsa::kAvx2:
      return isa_avx2::kernel_set();
#endif
    default:
      return isa_scalar::kernel_set();
  }
}

CpuVectorOps cpu_vector_ops(CpuIsa isa) {
  CpuVectorOps ops{nullptr, nullptr, nullptr};
  for (int i = static_cast<int>(isa); i >= 0; --i) {
    const CpuKernelSet& s = cpu_kernel_set(static_cast<CpuIsa>(i));
    if (!ops.dot_f16_f32) ops.dot_f16_f32 = s.dot_f16_f32;
    if (!ops.axpy_f16) ops.axpy_f16 = s.axpy_f16;
    if (!ops.dot_f32) ops.dot_f32 = s.dot_f32;
  }
  return ops;
}

}  // namespace barata
