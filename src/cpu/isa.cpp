#include "cpu/isa.h"

#include <atomic>
#include <cstdint>
#include <utility>
#include <cstdlib>
#include <string_view>

#include "barata/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace barata {
namespace {

// The CPU's features from cpuid, and whether the OS saves the AVX / AVX-512
// register state (XCR0), as the kernels need both. cpuid rather than
// __builtin_cpu_supports: clang 14 (the fuzz build) knows neither "f16c" nor
// "avxvnni" there. Bits: Intel SDM vol. 2A, CPUID leaves 1 and 7.
struct Features {
  bool avx2 = false, fma = false, f16c = false, avxvnni = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
};

Features detect() {
  Features f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  const bool fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
  uint64_t xcr0 = 0;
  if (osxsave) {
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
  const bool os_avx = (xcr0 & 0x6) == 0x6;       // SSE and AVX state
  const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;  // and opmask, ZMM_Hi256, Hi16_ZMM
  if (!avx || !os_avx) return f;
  f.fma = fma;
  f.f16c = f16c;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = (b >> 5) & 1;
    if (os_avx512) {
      f.avx512f = (b >> 16) & 1;
      f.avx512dq = (b >> 17) & 1;
      f.avx512bw = (b >> 30) & 1;
      f.avx512vl = (b >> 31) & 1;
      f.avx512vnni = (c >> 11) & 1;
    }
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avxvnni = (a >> 4) & 1;
    f.avx512bf16 = os_avx512 && ((a >> 5) & 1);
  }
#endif
  return f;
}

bool has(std::string_view name) {
  static const Features f = detect();
  const std::pair<std::string_view, bool> table[] = {{"avx2", f.avx2},
                                                     {"fma", f.fma},
                                                     {"f16c", f.f16c},
                                                     {"avxvnni", f.avxvnni},
                                                     {"avx512f", f.avx512f},
                                                     {"avx512bw", f.avx512bw},
                                                     {"avx512vl", f.avx512vl},
                                                     {"avx512dq", f.avx512dq},
                                                     {"avx512vnni", f.avx512vnni},
                                                     {"avx512bf16", f.avx512bf16}};
  for (const auto& [n, v] : table)
    if (n == name) return v;
  return false;
}

constexpr const char* kAvx2Features[] = {"avx2", "fma", "f16c"};
constexpr const char* kAvxVnniFeatures[] = {"avx2", "fma", "f16c", "avxvnni"};
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
    case CpuIsa::kAvxVnni:
#if defined(BARATA_HAVE_ISA_AVXVNNI)
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
  fail("BARATA_ISA={}: unknown instruction set (scalar, avx2, avxvnni, avx512)", env);
}

std::atomic<int> g_isa{-1};

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvxVnni:
      return "avxvnni";
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
    case CpuIsa::kAvxVnni:
      return has_all(kAvxVnniFeatures);
    case CpuIsa::kAvx512:
      return has_all(kAvx512Features);
  }
  return false;
}

CpuIsa cpu_best_isa() {
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvxVnni, CpuIsa::kAvx2})
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
#if defined(BARATA_HAVE_ISA_AVXVNNI)
    case CpuIsa::kAvxVnni:
      return isa_avxvnni::kernel_set();
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
    if (!ops.dot_f32) ops.dot_f32 = s.dot_f32;
    if (!ops.swiglu) ops.swiglu = s.swiglu;
    if (!ops.geglu) ops.geglu = s.geglu;
  }
  return ops;
}

CpuAttendFn cpu_attend(CpuIsa isa, int64_t head_dim) {
  for (int i = static_cast<int>(isa); i >= 0; --i) {
    const CpuKernelSet& s = cpu_kernel_set(static_cast<CpuIsa>(i));
    if (s.attend && s.attend_supported(head_dim)) return s.attend;
  }
  return nullptr;
}

}  // namespace barata
