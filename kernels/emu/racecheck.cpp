// The emulation's race and initialization checker (docs/cuda-emulation.md,
// "The race checker"). The emulated kernel translation units are compiled
// with GCC's -fsanitize=thread *instrumentation* only: the compiler puts a
// call to __tsan_read4(addr), __tsan_write8(addr), ... before every load and
// store, and this file, not libtsan, defines those functions. Outside a kernel
// they return at once; inside one they keep a shadow of every byte the
// launch touches:
//
//   - the last writer and the last reader(s), each as (block, thread) and the
//     synchronization interval it was in. Two accesses by different threads,
//     at least one a write, race unless they are ordered: by a __syncthreads
//     between them (same block), or by a warp barrier of the whole warp
//     between them (same warp). Different blocks of one launch are never
//     ordered, except that each block has its own shared memory.
//   - for shared memory, whether this block wrote the byte: a read of a byte
//     it never wrote is an uninitialized read.
//   - for cudaMalloc'd memory (tracked here), whether anything wrote the byte
//     since the allocation (a kernel, a copy, a set, the emulated GEMM).
//
// The first finding of a launch, and the number of the others, fail the
// launch when it ends. The source position of the second access comes from
// addr2line when it is installed.
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cuda_emu.h"

// The kernels' static __shared__ variables are `static` (cuda_emu.h): in the
// executable's writable static storage, from the start of .data to the end of
// .bss (the kernels have no __device__ globals, and "device memory" is heap).
extern "C" {
extern unsigned char __data_start[] __attribute__((weak));
extern unsigned char _end[] __attribute__((weak));
}

namespace barata_emu {
namespace detail::rc {

namespace {

constexpr unsigned kPageBits = 12;
constexpr uintptr_t kPageBytes = uintptr_t{1} << kPageBits;
constexpr unsigned kL2Bits = 18;  // pages per 1 GiB region
constexpr uint32_t kMulti = 1u << 31;        // in a cell's reader interval: several readers
constexpr uint32_t kCrossWarp = 1u << 30;    // ... from more than one warp
constexpr uint32_t kIvMask = kCrossWarp - 1;

// One byte's history in the running launch. Tags are (block serial << 10 |
// thread) + 1, 0 = none; an interval is the value of the accessing warp's
// counter at the access (see Thread::iv).
struct Cell {
  uint32_t w, wiv, r, riv;
};
struct Page {
  uint64_t gen;  // the launch these cells describe; older ones read as empty
  Cell cells[kPageBytes];
};
// Persistent per cudaMalloc'd byte: allocated (tracked) and written since (init).
struct InitPage {
  uint64_t tracked[kPageBytes / 64];
  uint64_t init[kPageBytes / 64];
};

template <typename P>
struct Table {  // address -> page, two levels over the 47-bit user space
  Table() = default;
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  ~Table() { clear(); }
  std::map<uintptr_t, P**> regions;
  uintptr_t last_region = ~uintptr_t{0};
  P** last = nullptr;
  P* find(uintptr_t a, bool create) {
    const uintptr_t region = a >> (kPageBits + kL2Bits);
    if (region != last_region) {
      auto it = regions.find(region);
      if (it == regions.end()) {
        if (!create) return nullptr;
        P** l2 = static_cast<P**>(std::calloc(size_t{1} << kL2Bits, sizeof(P*)));
        if (!l2) std::abort();
        it = regions.emplace(region, l2).first;
      }
      last_region = region;
      last = it->second;
    }
    P*& p = last[(a >> kPageBits) & ((uintptr_t{1} << kL2Bits) - 1)];
    if (!p && create) {
      p = static_cast<P*>(std::calloc(1, sizeof(P)));
      if (!p) std::abort();
      ++pages;
    }
    return p;
  }
  void clear() {
    for (auto& [r, l2] : regions) {
      for (size_t i = 0; i < (size_t{1} << kL2Bits); ++i) std::free(l2[i]);
      std::free(l2);
    }
    regions.clear();
    last_region = ~uintptr_t{0};
    last = nullptr;
    pages = 0;
  }
  size_t pages = 0;
};

// The running fiber, read on every access (trivial: no TLS wrapper call).
struct Thread {
  bool on;
  uint32_t tag;
  uint32_t warp;
  uintptr_t stack_lo, stack_bytes;
};
thread_local Thread g_thread;

struct Launch {
  bool checking = false;
  const char* kernel = "";
  dim3 grid, block;
  uint64_t gen = 0;
  uint32_t serial = 0;  // the running block's
  uint32_t iv = 0;      // the interval counter
  uint32_t bar_mark = 0;
  std::vector<uint32_t> warp_iv;
  uintptr_t dyn_lo = 0, dyn_bytes = 0;
  uintptr_t sh_lo = 0, sh_bytes = 0;
  std::string first;
  bool first_is_race = false;
  uint64_t findings = 0;
};

bool g_instrumented = false;  // an instrumented translation unit called __tsan_init
int g_enabled = -1;           // -1: BARATA_EMU_RACECHECK decides (default on)
thread_local Launch g_launch_rc;
thread_local Table<Page> g_shadow;
Table<InitPage> g_init;  // allocations outlive launches and threads
constexpr size_t kShadowPagesKept = 4096;  // 256 MiB of shadow kept between launches

std::string coords(unsigned v, const dim3& d) {
  return "(" + std::to_string(v % d.x) + "," + std::to_string(v / d.x % d.y) + "," +
         std::to_string(v / (d.x * d.y)) + ")";
}
std::string who(uint32_t tag) {
  const Launch& L = g_launch_rc;
  const uint32_t t = tag - 1;
  return "block " + coords(t >> 10, L.grid) + " thread " + coords(t & 1023u, L.block);
}

// "file:line" of a code address, by addr2line (the binary's own debug info).
std::string source_of(const void* pc) {
  struct Find {
    uintptr_t pc, bias = 0;
    std::string file;
    bool found = false;
  } f;
  f.pc = reinterpret_cast<uintptr_t>(pc);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* f = static_cast<Find*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (f->pc >= lo && f->pc < lo + ph.p_memsz) {
            f->bias = info->dlpi_addr;
            if (info->dlpi_name && *info->dlpi_name) {
              f->file = info->dlpi_name;
            } else {  // the executable ("/proc/self/exe" would be addr2line's own)
              char buf[4096];
              const ssize_t k = readlink("/proc/self/exe", buf, sizeof buf - 1);
              f->file = k > 0 ? std::string(buf, static_cast<size_t>(k)) : std::string();
            }
            f->found = true;
            return 1;
          }
        }
        return 0;
      },
      &f);
  char addr[32];
  std::snprintf(addr, sizeof addr, "0x%zx", static_cast<size_t>(f.pc - f.bias));
  if (!f.found) return std::string("pc ") + addr;
  const std::string cmd = "addr2line -C -f -i -e '" + f.file + "' " + addr + " 2>/dev/null";
  std::string out, fn;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char line[512];
    int n = 0;
    while (std::fgets(line, sizeof line, p)) {
      std::string s(line);
      while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
      if (n++ % 2 == 1) {  // addr2line -f -i: function, file:line, (inlined) function, ...
        if (const size_t slash = s.rfind('/'); slash != std::string::npos) s = s.substr(slash + 1);
        if (s.find('?') != std::string::npos) s = "no line information";
        out += (out.empty() ? "" : "; inlined into ") + fn + " (" + s + ")";
      } else {
        for (size_t k; (k = s.find("(anonymous namespace)::")) != std::string::npos;)
          s.erase(k, 23);
        fn = s.substr(0, s.find('('));  // the name without its parameters
      }
      if (n >= 6) break;
    }
    pclose(p);
  }
  return out.empty() || out.find("??") == 0 ? std::string("pc ") + addr : out;
}

void report(const char* what, uintptr_t a, bool shared, uint32_t other, bool other_write,
            bool multi, bool write, const void* pc) {
  Launch& L = g_launch_rc;
  ++L.findings;
  // A race first: an uninitialized read is often its symptom (a thread read
  // before the one that writes ran), the race names both threads.
  const bool race = other != 0;
  if (!(L.first.empty() || (race && !L.first_is_race))) return;
  L.first_is_race = race;
  std::string place;
  char hexa[32];
  std::snprintf(hexa, sizeof hexa, "0x%zx", static_cast<size_t>(a));
  if (a - L.dyn_lo < L.dyn_bytes)
    place = "dynamic shared memory, byte " + std::to_string(a - L.dyn_lo);
  else if (shared)
    place = std::string("static shared memory at ") + hexa;
  else
    place = std::string("global memory at ") + hexa;
  std::string msg = std::string("emu: ") + what + " in " + L.kernel + ": " + place + ": " +
                    (write ? "written" : "read") + " by " + who(g_thread.tag);
  if (other)
    msg += std::string(", ") + (other_write ? "written" : "read") + " by " + who(other) +
           (multi ? " (and other threads)" : "") + " with no barrier between";
  msg += " (at " + source_of(pc) + ")";
  L.first = msg;
}

inline uint32_t block_of(uint32_t tag) {
  return (tag - 1) >> 10;
}
inline uint32_t warp_of(uint32_t tag) {
  return ((tag - 1) & 1023u) >> 5;
}

// Whether an access (tag, interval) happened before the running thread's
// present one: same block, and a block barrier since, or a barrier of the
// whole warp since when both are in one warp.
inline bool ordered(uint32_t tag, uint32_t iv_flags, const Launch& L) {
  if (block_of(tag) != L.serial) return false;
  const uint32_t iv = iv_flags & kIvMask;
  if (!(iv_flags & kCrossWarp) && warp_of(tag) == g_thread.warp)
    return iv < L.warp_iv[g_thread.warp];
  return iv < L.bar_mark;
}

void access(uintptr_t a, unsigned size, bool write, const void* pc) {
  Launch& L = g_launch_rc;
  const uint32_t me = g_thread.tag;
  const uint32_t my_iv = L.warp_iv[g_thread.warp];
  const bool shared = a - L.sh_lo < L.sh_bytes || a - L.dyn_lo < L.dyn_bytes;
  for (unsigned i = 0; i < size;) {
    const uintptr_t b = a + i;
    Page* p = g_shadow.find(b, true);
    if (p->gen != L.gen) {
      std::memset(p->cells, 0, sizeof p->cells);
      p->gen = L.gen;
    }
    const unsigned off = static_cast<unsigned>(b & (kPageBytes - 1));
    const unsigned n = std::min<unsigned>(size - i, static_cast<unsigned>(kPageBytes - off));
    for (unsigned j = 0; j < n; ++j) {
      Cell& c = p->cells[off + j];
      if (shared && c.w && block_of(c.w) != L.serial) c = Cell{};  // another block's shared memory
      if (shared && c.r && block_of(c.r) != L.serial) c.r = c.riv = 0;
      if (c.w && c.w != me && !ordered(c.w, c.wiv, L)) {
        report(shared ? "shared memory race" : "global memory race", b, shared, c.w, true, false,
               write, pc);
        c.w = 0;  // one report per byte
      }
      if (write) {
        if (c.r && (c.r != me || (c.riv & kMulti)) && !ordered(c.r, c.riv, L)) {
          report(shared ? "shared memory race" : "global memory race", b, shared, c.r, false,
                 (c.riv & kMulti) != 0, write, pc);
        }
        c.w = me;
        c.wiv = my_iv;
        c.r = c.riv = 0;
      } else {
        if (shared && !c.w) {
          report("uninitialized shared memory read", b, true, 0, false, false, false, pc);
          *reinterpret_cast<unsigned char*>(b) = 0xa5;  // garbage, as on a GPU (the load follows)
          c.w = me;  // once
          c.wiv = 0;
        }
        if (!c.r || ordered(c.r, c.riv, L)) {
          c.r = me;
          c.riv = my_iv;
        } else if (c.r != me) {
          uint32_t flags = c.riv | kMulti;
          if (warp_of(c.r) != g_thread.warp) flags |= kCrossWarp;
          c.r = me;
          c.riv = flags;
        }
      }
    }
    i += n;
  }
  if (shared) return;
  // cudaMalloc'd memory: written since its allocation?
  for (unsigned i = 0; i < size;) {
    const uintptr_t b = a + i;
    const unsigned off = static_cast<unsigned>(b & (kPageBytes - 1));
    const unsigned n = std::min<unsigned>(size - i, static_cast<unsigned>(kPageBytes - off));
    if (InitPage* ip = g_init.find(b, false)) {
      for (unsigned j = off; j < off + n; ++j) {
        const uint64_t bit = uint64_t{1} << (j & 63);
        if (!(ip->tracked[j >> 6] & bit)) continue;
        if (write) {
          ip->init[j >> 6] |= bit;
        } else if (!(ip->init[j >> 6] & bit)) {
          report("uninitialized global memory read (cudaMalloc'd, never written)", b - off + j,
                 false, 0, false, false, false, pc);
          ip->init[j >> 6] |= bit;  // once
        }
      }
    }
    i += n;
  }
}

inline void hook(void* addr, unsigned size, bool write, const void* pc) {
  if (!g_thread.on) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (a - g_thread.stack_lo < g_thread.stack_bytes) return;  // the thread's own stack
  access(a, size, write, pc);
}

// What happens to a range of cudaMalloc'd bytes: allocated (tracked, not
// written), freed (neither), written (by a copy, a set or the GEMM).
enum class InitOp { kAllocate, kFree, kWrite };
void set_bits(uintptr_t a, size_t n, InitOp op) {
  while (n) {
    const unsigned off = static_cast<unsigned>(a & (kPageBytes - 1));
    const size_t k = std::min<size_t>(n, kPageBytes - off);
    if (InitPage* ip = g_init.find(a, op == InitOp::kAllocate)) {
      for (unsigned j = off; j < off + k;) {
        const unsigned lo = j & 63, cnt = std::min<unsigned>(64 - lo, static_cast<unsigned>(off + k - j));
        const uint64_t bits = (cnt == 64 ? ~uint64_t{0} : ((uint64_t{1} << cnt) - 1)) << lo;
        uint64_t &tracked = ip->tracked[j >> 6], &init = ip->init[j >> 6];
        if (op == InitOp::kWrite) {
          init |= bits;
        } else {
          tracked = op == InitOp::kAllocate ? tracked | bits : tracked & ~bits;
          init &= ~bits;
        }
        j += cnt;
      }
    }
    a += k;
    n -= k;
  }
}

}  // namespace

bool checking() {
  return g_launch_rc.checking;
}

bool instrumented() {
  return g_instrumented;
}

bool enabled() {
  if (g_enabled < 0) {
    const char* e = std::getenv("BARATA_EMU_RACECHECK");
    g_enabled = !(e && (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0));
  }
  return g_enabled && g_instrumented;
}

void launch_begin(const char* kernel, dim3 grid, dim3 block, const unsigned char* dyn,
                  size_t dyn_bytes) {
  Launch& L = g_launch_rc;
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  L.checking = enabled() && blocks < (uint64_t{1} << 22);
  if (!L.checking) return;
  L.kernel = kernel;
  L.grid = grid;
  L.block = block;
  ++L.gen;
  L.iv = 0;
  L.first.clear();
  L.first_is_race = false;
  L.findings = 0;
  L.warp_iv.assign((uint64_t{block.x} * block.y * block.z + 31) / 32, 0);
  L.dyn_lo = reinterpret_cast<uintptr_t>(dyn);
  L.dyn_bytes = dyn ? dyn_bytes : 0;
  L.sh_lo = reinterpret_cast<uintptr_t>(__data_start);
  L.sh_bytes = __data_start && _end ? static_cast<uintptr_t>(_end - __data_start) : 0;
}

void block_begin(uint32_t serial) {
  Launch& L = g_launch_rc;
  if (!L.checking) return;
  L.serial = serial;
  block_barrier_done();
}

void block_barrier_done() {
  Launch& L = g_launch_rc;
  if (!L.checking) return;
  if (++L.iv > kIvMask - 2) L.checking = false;  // (a billion barriers: stop checking)
  L.bar_mark = L.iv;
  for (uint32_t& w : L.warp_iv) w = L.iv;
}

void warp_barrier_done(unsigned warp) {
  Launch& L = g_launch_rc;
  if (!L.checking) return;
  if (++L.iv > kIvMask - 2) L.checking = false;
  L.warp_iv[warp] = L.iv;
}

void enter_thread(unsigned linear, const void* stack, size_t stack_bytes) {
  Launch& L = g_launch_rc;
  g_thread.on = L.checking;
  if (!L.checking) return;
  g_thread.tag = (L.serial << 10 | linear) + 1;
  g_thread.warp = linear / 32;
  g_thread.stack_lo = reinterpret_cast<uintptr_t>(stack);
  g_thread.stack_bytes = stack_bytes;
}

void leave_thread() {
  g_thread.on = false;
}

std::string launch_end() {
  Launch& L = g_launch_rc;
  g_thread.on = false;
  if (!L.checking) return {};
  L.checking = false;
  if (g_shadow.pages > kShadowPagesKept) g_shadow.clear();
  if (!L.findings) return {};
  std::string msg = L.first;
  if (L.findings > 1) msg += " [and " + std::to_string(L.findings - 1) + " more findings]";
  return msg;
}

void track_alloc(const void* p, size_t n) {
  if (!g_instrumented) return;
  set_bits(reinterpret_cast<uintptr_t>(p), n, InitOp::kAllocate);
}
void untrack_alloc(const void* p, size_t n) {
  if (!g_instrumented) return;
  set_bits(reinterpret_cast<uintptr_t>(p), n, InitOp::kFree);
}
void mark_written(const void* p, size_t n) {
  if (!g_instrumented || !n) return;
  set_bits(reinterpret_cast<uintptr_t>(p), n, InitOp::kWrite);
}

}  // namespace detail::rc

void set_racecheck(bool on) {
  detail::rc::g_enabled = on ? 1 : 0;
}
bool racecheck_enabled() {
  return detail::rc::enabled();
}
bool racecheck_available() {
  return detail::rc::g_instrumented;
}

}  // namespace barata_emu

// ---- the instrumentation's entry points (GCC -fsanitize=thread's ABI) ----
// Only in a build whose own code is not under ThreadSanitizer, whose runtime
// defines them.
#if !defined(__SANITIZE_THREAD__)
using barata_emu::detail::rc::hook;
#define BARATA_RC_PC __builtin_extract_return_addr(__builtin_return_address(0))
extern "C" {
void __tsan_init() {
  barata_emu::detail::rc::g_instrumented = true;
}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
#define BARATA_RC_RW(n)                                    \
  void __tsan_read##n(void* a) {                           \
    hook(a, n, false, BARATA_RC_PC);                       \
  }                                                        \
  void __tsan_write##n(void* a) {                          \
    hook(a, n, true, BARATA_RC_PC);                        \
  }                                                        \
  void __tsan_unaligned_read##n(void* a) {                 \
    hook(a, n, false, BARATA_RC_PC);                       \
  }                                                        \
  void __tsan_unaligned_write##n(void* a) {                \
    hook(a, n, true, BARATA_RC_PC);                        \
  }                                                        \
  void __tsan_volatile_read##n(void* a) {                  \
    hook(a, n, false, BARATA_RC_PC);                       \
  }                                                        \
  void __tsan_volatile_write##n(void* a) {                 \
    hook(a, n, true, BARATA_RC_PC);                        \
  }
BARATA_RC_RW(1)
BARATA_RC_RW(2)
BARATA_RC_RW(4)
BARATA_RC_RW(8)
BARATA_RC_RW(16)
#undef BARATA_RC_RW
void __tsan_read_range(void* a, unsigned long n) {
  hook(a, static_cast<unsigned>(n), false, BARATA_RC_PC);
}
void __tsan_write_range(void* a, unsigned long n) {
  hook(a, static_cast<unsigned>(n), true, BARATA_RC_PC);
}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
// Atomics in the instrumented code (std::function's and shared_ptr's counts
// in the launch template, not kernels): done, sequentially consistent.
#define BARATA_RC_ATOMIC(n, T)                                                                 \
  T __tsan_atomic##n##_load(const volatile T* a, int) {                                       \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                              \
  }                                                                                           \
  void __tsan_atomic##n##_store(volatile T* a, T v, int) {                                    \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                 \
  }                                                                                           \
  T __tsan_atomic##n##_exchange(volatile T* a, T v, int) {                                    \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                       \
  }                                                                                           \
  T __tsan_atomic##n##_fetch_add(volatile T* a, T v, int) {                                   \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                        \
  }                                                                                           \
  T __tsan_atomic##n##_fetch_sub(volatile T* a, T v, int) {                                   \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                        \
  }                                                                                           \
  T __tsan_atomic##n##_fetch_and(volatile T* a, T v, int) {                                   \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                        \
  }                                                                                           \
  T __tsan_atomic##n##_fetch_or(volatile T* a, T v, int) {                                    \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                         \
  }                                                                                           \
  int __tsan_atomic##n##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {        \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);   \
  }                                                                                           \
  int __tsan_atomic##n##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {          \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);   \
  }                                                                                           \
  T __tsan_atomic##n##_compare_exchange_val(volatile T* a, T c, T v, int, int) {              \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);         \
    return c;                                                                                 \
  }
BARATA_RC_ATOMIC(8, unsigned char)
BARATA_RC_ATOMIC(16, unsigned short)
BARATA_RC_ATOMIC(32, int)
BARATA_RC_ATOMIC(64, long)
#undef BARATA_RC_ATOMIC
void __tsan_atomic_thread_fence(int) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
void __tsan_atomic_signal_fence(int) {}
}
#endif
