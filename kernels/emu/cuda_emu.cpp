// The fiber scheduler behind kernels/emu/cuda_emu.h (docs/cuda-emulation.md).
#include "cuda_emu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define BARATA_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BARATA_EMU_ASAN 1
#endif
#endif
#ifdef BARATA_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// Switching between fibers. glibc's swapcontext saves and restores the signal
// mask with a system call on every switch, which was about nine tenths of an
// emulated kernel's time (every barrier switches every thread). On x86-64 the
// switch is ours: the callee-saved registers, MXCSR and the x87 control word
// pushed on the old stack, the stack pointer swapped, the same popped from the
// new one (the System V ABI's callee-saved state; the signal mask never changes
// in a kernel). Elsewhere, ucontext.
#if defined(__x86_64__) && !defined(BARATA_EMU_UCONTEXT)
#define BARATA_EMU_FAST_SWITCH 1
extern "C" void barata_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl barata_emu_switch
  .hidden barata_emu_switch
  .type barata_emu_switch, @function
  .p2align 4
barata_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size barata_emu_switch, .-barata_emu_switch
)");
#else
#include <ucontext.h>
#endif

namespace barata_emu {
namespace detail {

namespace {

#ifdef BARATA_EMU_ASAN
constexpr size_t kStackBytes = 512 * 1024;  // ASan's redzones make frames larger
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif
constexpr unsigned kMaxThreads = 1024;
constexpr size_t kDefaultMaxDynSmem = 48 * 1024;
constexpr size_t kOptInMaxDynSmem = 227 * 1024;  // sm_90

enum class State { kReady, kWarp, kBlock, kDone };

const char* warp_op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kSync:
      return "__syncwarp";
    case WarpOp::kShflIdx:
      return "__shfl_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kAll:
      return "__all_sync";
  }
  return "?";
}

}  // namespace

struct Fiber {
#ifdef BARATA_EMU_FAST_SWITCH
  void* sp = nullptr;  // saved stack pointer while switched out
#else
  ucontext_t ctx;
#endif
  unsigned char* mem = nullptr;  // guard page + stack
  unsigned char* stack = nullptr;
  size_t stack_bytes = 0;
  bool fresh = true;  // needs makecontext (new, or abandoned after a fault)
  void* fake_stack = nullptr;
  uint3 tid;
  unsigned linear = 0;
  State state = State::kDone;
  // the barrier it waits at
  WarpOp op = WarpOp::kSync;
  BlockOp bop = BlockOp::kSync;
  unsigned mask = 0;
  int param = 0, width = 32;
  uint64_t value = 0, result = 0;
  int pred = 0, bresult = 0;
  std::string fault;  // an exception that escaped the kernel

  ~Fiber() {
    if (mem) munmap(mem, stack_bytes + static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  }
};

thread_local Fiber* g_current = nullptr;
thread_local LaunchState g_launch;

namespace {

struct Scheduler {
  std::vector<std::unique_ptr<Fiber>> pool;  // reused by every block of every launch
  unsigned n = 0;                            // threads of the running block
#ifdef BARATA_EMU_FAST_SWITCH
  void* main_sp = nullptr;
#else
  ucontext_t main_ctx;
#endif
  void* main_fake_stack = nullptr;
  const void* main_bottom = nullptr;
  size_t main_size = 0;
  const char* kernel = "";
  Invoke invoke = nullptr;
  void* ctx = nullptr;
  bool running = false;
};

thread_local Scheduler g_sched;
thread_local cudaError_t g_last_error = cudaSuccess;
FaultMode g_fault_mode = FaultMode::kAbort;
bool g_report_refusals = true;  // a refused launch says why on stderr
std::map<const void*, size_t> g_max_dyn_smem;  // per kernel, set by cudaFuncSetAttribute

[[noreturn]] void die(const std::string& msg);

// ---- switching, with AddressSanitizer told about every stack change ----
void to_fiber(Fiber* f) {
  Scheduler& s = g_sched;
  g_current = f;
  rc::enter_thread(f->linear, f->stack, f->stack_bytes);
#ifdef BARATA_EMU_ASAN
  __sanitizer_start_switch_fiber(&s.main_fake_stack, f->stack, f->stack_bytes);
#endif
#ifdef BARATA_EMU_FAST_SWITCH
  barata_emu_switch(&s.main_sp, f->sp);
#else
  swapcontext(&s.main_ctx, &f->ctx);
#endif
#ifdef BARATA_EMU_ASAN
  __sanitizer_finish_switch_fiber(s.main_fake_stack, nullptr, nullptr);
#endif
  rc::leave_thread();
  g_current = nullptr;
}

void to_scheduler(Fiber* f) {
  Scheduler& s = g_sched;
#ifdef BARATA_EMU_ASAN
  __sanitizer_start_switch_fiber(&f->fake_stack, s.main_bottom, s.main_size);
#endif
#ifdef BARATA_EMU_FAST_SWITCH
  barata_emu_switch(&f->sp, s.main_sp);
#else
  swapcontext(&f->ctx, &s.main_ctx);
#endif
#ifdef BARATA_EMU_ASAN
  __sanitizer_finish_switch_fiber(f->fake_stack, &s.main_bottom, &s.main_size);
#endif
}

void fiber_main() {
  Scheduler& s = g_sched;
#ifdef BARATA_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &s.main_bottom, &s.main_size);
#endif
  for (;;) {
    Fiber* f = g_current;
    try {
      s.invoke(s.ctx);
    } catch (const std::exception& e) {
      f->fault = e.what();
    } catch (...) {
      f->fault = "unknown exception";
    }
    f->state = State::kDone;
    to_scheduler(f);  // resumed here for the next block
  }
}

void init_fiber(Fiber* f) {
  if (!f->mem) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) die("emu: cannot map a fiber stack");
    f->mem = static_cast<unsigned char*>(m);
    mprotect(f->mem, page, PROT_NONE);  // a stack overflow faults instead of corrupting
    f->stack = f->mem + page;
    f->stack_bytes = kStackBytes;
  }
#ifdef BARATA_EMU_ASAN
  // An abandoned fiber's frames may have left redzones poisoned.
  __asan_unpoison_memory_region(f->stack, f->stack_bytes);
#endif
#ifdef BARATA_EMU_FAST_SWITCH
  // The frame barata_emu_switch pops, from the lowest address: MXCSR and the
  // x87 control word (this thread's), r15, r14, r13, r12, rbx, rbp (zero),
  // the return address (fiber_main), then fiber_main's own return address (a
  // zero it never uses) at a stack pointer of 8 mod 16, as after a call.
  auto* top = reinterpret_cast<uint64_t*>(f->stack + f->stack_bytes);  // 16-aligned
  uint64_t* sp = top - 1 - 8;
  uint32_t csr[2] = {0, 0};
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
  std::memcpy(&sp[0], csr, 8);
  for (int i = 1; i <= 6; ++i) sp[i] = 0;
  sp[7] = reinterpret_cast<uint64_t>(&fiber_main);
  sp[8] = 0;
  f->sp = sp;
#else
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = f->stack_bytes;
  f->ctx.uc_link = nullptr;
  makecontext(&f->ctx, fiber_main, 0);
#endif
  f->fresh = false;
}

std::string block_name() {
  const uint3& b = g_launch.block_idx;
  return "block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) +
         ")";
}

std::string thread_name(const Fiber& f) {
  return "thread (" + std::to_string(f.tid.x) + "," + std::to_string(f.tid.y) + "," +
         std::to_string(f.tid.z) + ")";
}

std::string hex(unsigned m) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", m);
  return buf;
}

std::string where(const Fiber& f) {
  switch (f.state) {
    case State::kReady:
      return "running";
    case State::kDone:
      return "exited";
    case State::kBlock:
      return "at __syncthreads";
    case State::kWarp:
      return std::string("at ") + warp_op_name(f.op) + "(mask " + hex(f.mask) + ")";
  }
  return "?";
}

// Forget the block (its fibers are abandoned mid-kernel and re-made later).
void abandon_block() {
  Scheduler& s = g_sched;
  for (unsigned i = 0; i < s.n; ++i) {
    s.pool[i]->fresh = true;
    s.pool[i]->state = State::kDone;
  }
  s.running = false;
  g_current = nullptr;
  g_launch = LaunchState{};
}

[[noreturn]] void die(const std::string& msg) {
  if (g_fault_mode == FaultMode::kThrow && !g_current) {
    if (g_sched.running) abandon_block();
    throw Fault(msg);
  }
  std::fprintf(stderr, "%s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

[[noreturn]] void deadlock(const std::string& why) {
  die(std::string("emu: deadlock/divergent __syncthreads in ") + g_sched.kernel + ", " +
      block_name() + ": " + why);
}

unsigned warp_lanes(unsigned warp) {  // lanes that exist in this warp
  const unsigned n = g_sched.n, first = warp * 32;
  const unsigned k = n - first >= 32 ? 32 : n - first;
  return k == 32 ? 0xffffffffu : ((1u << k) - 1u);
}

// The lane a shuffle reads, or -1 for its own value.
int shfl_source(const Fiber& f) {
  const int lane = static_cast<int>(f.linear % 32), w = f.width;
  const int base = lane & ~(w - 1);
  switch (f.op) {
    case WarpOp::kShflIdx:
      return base + (f.param & (w - 1));
    case WarpOp::kShflUp:
      return lane - f.param >= base ? lane - f.param : lane;
    case WarpOp::kShflDown:
      return (lane & (w - 1)) + f.param < w ? lane + f.param : lane;
    case WarpOp::kShflXor: {
      const int src = lane ^ f.param;
      return src < base + w ? src : lane;
    }
    default:
      return lane;
  }
}

// Completes every warp barrier whose lanes have all arrived; true if any did.
bool release_warps() {
  Scheduler& s = g_sched;
  bool any = false;
  for (unsigned w = 0; w * 32 < s.n; ++w) {
    const unsigned exist = warp_lanes(w);
    for (unsigned l = 0; l < 32; ++l) {
      if (!(exist >> l & 1u)) break;
      Fiber& f = *s.pool[w * 32 + l];
      if (f.state != State::kWarp) continue;
      const unsigned mask = f.mask & exist;
      bool complete = true;
      for (unsigned m = 0; m < 32; ++m) {
        if (!(mask >> m & 1u)) continue;
        const Fiber& g = *s.pool[w * 32 + m];
        if (g.state == State::kDone)
          deadlock("lane " + std::to_string(m) + " of warp " + std::to_string(w) +
                   " has exited, but " + thread_name(f) + " waits for it " + where(f));
        if (g.state != State::kWarp || g.mask != f.mask || g.op != f.op) complete = false;
      }
      if (!complete) continue;
      // every lane of the mask is here: exchange
      uint64_t vote = 0;
      for (unsigned m = 0; m < 32; ++m)
        if (mask >> m & 1u && s.pool[w * 32 + m]->value) vote |= 1ull << m;
      for (unsigned m = 0; m < 32; ++m) {
        if (!(mask >> m & 1u)) continue;
        Fiber& g = *s.pool[w * 32 + m];
        switch (g.op) {
          case WarpOp::kSync:
            g.result = 0;
            break;
          case WarpOp::kBallot:
            g.result = vote;
            break;
          case WarpOp::kAny:
            g.result = vote != 0;
            break;
          case WarpOp::kAll:
            g.result = vote == mask;
            break;
          default: {
            const int src = shfl_source(g);
            // A lane outside the mask (or past the block's end) holds no
            // defined value: poison it, so that a result that uses it shows.
            g.result = (mask >> src & 1u) ? s.pool[w * 32 + static_cast<unsigned>(src)]->value
                                          : ~uint64_t{0};
          }
        }
        g.state = State::kReady;
      }
      // A barrier of every lane still running orders their memory accesses
      // (the race checker's view; a partial one orders nothing there).
      if (rc::checking()) {
        unsigned live = 0;
        for (unsigned m = 0; m < 32; ++m)
          if (exist >> m & 1u && s.pool[w * 32 + m]->state != State::kDone) live |= 1u << m;
        if ((live & ~mask) == 0) rc::warp_barrier_done(w);
      }
      any = true;
    }
  }
  return any;
}

bool release_block_or_fail() {
  Scheduler& s = g_sched;
  unsigned waiting = 0, done = 0;
  const Fiber* first_done = nullptr;
  const Fiber* first_warp = nullptr;
  const Fiber* first_block = nullptr;
  for (unsigned i = 0; i < s.n; ++i) {
    const Fiber& f = *s.pool[i];
    if (f.state == State::kBlock) {
      ++waiting;
      if (!first_block) first_block = &f;
    } else if (f.state == State::kDone) {
      ++done;
      if (!first_done) first_done = &f;
    } else if (f.state == State::kWarp && !first_warp) {
      first_warp = &f;
    }
  }
  if (waiting == s.n) {
    int count = 0;
    for (unsigned i = 0; i < s.n; ++i) count += s.pool[i]->pred != 0;
    for (unsigned i = 0; i < s.n; ++i) {
      Fiber& f = *s.pool[i];
      switch (f.bop) {
        case BlockOp::kSync:
          f.bresult = 0;
          break;
        case BlockOp::kCount:
          f.bresult = count;
          break;
        case BlockOp::kAnd:
          f.bresult = count == static_cast<int>(s.n);
          break;
        case BlockOp::kOr:
          f.bresult = count != 0;
          break;
      }
      f.state = State::kReady;
    }
    rc::block_barrier_done();
    return true;
  }
  if (first_block && first_warp)
    deadlock(thread_name(*first_block) + " waits " + where(*first_block) + " while " +
             thread_name(*first_warp) + " waits " + where(*first_warp));
  if (first_block && first_done)
    deadlock(std::to_string(waiting) + " of " + std::to_string(s.n) +
             " threads wait at __syncthreads, but " + std::to_string(done) + " have exited (" +
             thread_name(*first_done) + ")");
  if (first_warp) {
    // warp lanes wait for each other with different masks or operations
    const unsigned base = first_warp->linear / 32 * 32;
    std::string lanes;
    for (unsigned m = 0; m < 32 && base + m < s.n; ++m) {
      const Fiber& g = *s.pool[base + m];
      if (g.state == State::kWarp && (first_warp->mask >> m & 1u))
        lanes += " lane " + std::to_string(m) + " " + where(g) + ";";
    }
    deadlock("warp " + std::to_string(base / 32) + " cannot complete " + where(*first_warp) + ":" +
             lanes);
  }
  deadlock("no thread can proceed");
}

void run_block() {
  Scheduler& s = g_sched;
  for (unsigned i = 0; i < s.n; ++i) s.pool[i]->state = State::kReady;
  for (;;) {
    for (unsigned i = 0; i < s.n; ++i) {
      Fiber* f = s.pool[i].get();
      if (f->state != State::kReady) continue;
      to_fiber(f);
      if (!f->fault.empty()) {
        const std::string what = f->fault;
        f->fault.clear();
        die(std::string("emu: kernel ") + s.kernel + " threw in " + block_name() + ", " +
            thread_name(*f) + ": " + what);
      }
    }
    bool all_done = true;
    for (unsigned i = 0; i < s.n; ++i) all_done &= s.pool[i]->state == State::kDone;
    if (all_done) return;
    if (release_warps()) continue;
    release_block_or_fail();
  }
}

Fiber& current_or_die(const char* what) {
  if (!g_current) {
    std::fprintf(stderr, "emu: %s used outside a kernel\n", what);
    std::abort();
  }
  return *g_current;
}

}  // namespace

const uint3& thread_idx() {
  return current_or_die("threadIdx").tid;
}

const LaunchState& launch_state() {
  current_or_die("blockIdx/blockDim/gridDim");
  return g_launch;
}

unsigned char* dynamic_smem() {
  current_or_die("dynamic shared memory");
  return g_launch.dyn_smem;
}

unsigned lane_id() {
  return current_or_die("lane id").linear % 32;
}

unsigned active_mask() {
  const Fiber& f = current_or_die("__activemask");
  const unsigned base = f.linear / 32 * 32;
  unsigned m = 0;
  for (unsigned l = 0; l < 32 && base + l < g_sched.n; ++l)
    if (g_sched.pool[base + l]->state != State::kDone) m |= 1u << l;
  return m;
}

uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t value, int param, int width) {
  Fiber& f = current_or_die(warp_op_name(op));
  const unsigned lane = f.linear % 32;
  // Errors of the calling lane: thrown in its fiber, which fails the launch
  // ("emu: kernel K threw in block ..., thread ...: ...").
  if (!(mask >> lane & 1u))
    throw std::runtime_error(std::string(warp_op_name(op)) + " with mask " + hex(mask) +
                             ", which omits the calling lane " + std::to_string(lane) +
                             " (every calling lane must be in the mask)");
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
    throw std::runtime_error(std::string(warp_op_name(op)) + ": width " + std::to_string(width) +
                             " is not a power of two <= 32");
  f.op = op;
  f.mask = mask;
  f.value = value;
  f.param = param;
  f.width = width;
  f.state = State::kWarp;
  to_scheduler(&f);
  return f.result;
}

int block_barrier(BlockOp op, int pred) {
  Fiber& f = current_or_die("__syncthreads");
  f.bop = op;
  f.pred = pred;
  f.state = State::kBlock;
  to_scheduler(&f);
  return f.bresult;
}

cudaError_t set_max_dynamic_smem(const void* kernel, int bytes) {
  if (bytes < 0 || static_cast<size_t>(bytes) > kOptInMaxDynSmem) return cudaErrorInvalidValue;
  g_max_dyn_smem[kernel] = static_cast<size_t>(bytes);
  return cudaSuccess;
}

bool launch_config_ok(const char* name, const void* kernel, dim3 grid, dim3 block,
                      size_t smem_bytes) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  size_t max_smem = kDefaultMaxDynSmem;
  if (auto it = g_max_dyn_smem.find(kernel); it != g_max_dyn_smem.end()) max_smem = it->second;
  auto refuse = [&](cudaError_t e, const std::string& why) {
    g_last_error = e;
    if (g_report_refusals)
      std::fprintf(stderr, "emu: the launch of %s is refused (%s): %s\n", name, cudaGetErrorName(e),
                   why.c_str());
    return false;
  };
  auto cfg = [&] {  // (only for a refusal's message)
    return "grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
           std::to_string(grid.z) + "), block (" + std::to_string(block.x) + "," +
           std::to_string(block.y) + "," + std::to_string(block.z) + ")";
  };
  // sm_90's limits (CUDA C++ Programming Guide, "Technical Specifications per
  // Compute Capability"): 1024 threads a block, block x/y <= 1024, z <= 64;
  // grid x < 2^31, y and z <= 65535.
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > kMaxThreads ||
      block.x > 1024 || block.y > 1024 || block.z > 64 || grid.y > 65535 || grid.z > 65535 ||
      grid.x > 0x7fffffffu)
    return refuse(cudaErrorInvalidConfiguration, cfg() + " is outside sm_90's launch limits");
  if (smem_bytes > max_smem)
    return refuse(cudaErrorInvalidValue,
                  std::to_string(smem_bytes) + " bytes of dynamic shared memory, above " +
                      (max_smem == kDefaultMaxDynSmem
                           ? std::string("48 KiB without cudaFuncAttributeMaxDynamicSharedMemorySize")
                           : "the " + std::to_string(max_smem) + " bytes the kernel opted in to"));
  // What ptxas allotted the kernel (sm90_limits.cpp): its __launch_bounds__,
  // and its registers, allocated per warp in units of 256 from the SM's 65,536.
  const KernelLimits lim = kernel_limits(name);
  if (lim.max_threads > 0 && threads > static_cast<uint64_t>(lim.max_threads))
    return refuse(cudaErrorLaunchOutOfResources,
                  cfg() + ": " + std::to_string(threads) + " threads, above the kernel's " +
                      "__launch_bounds__ of " + std::to_string(lim.max_threads));
  if (lim.registers > 0) {
    const uint64_t per_warp = (uint64_t(lim.registers) * 32 + 255) / 256 * 256;
    const uint64_t regs = per_warp * ((threads + 31) / 32);
    if (regs > 65536)
      return refuse(cudaErrorLaunchOutOfResources,
                    cfg() + ": " + std::to_string(lim.registers) + " registers a thread (ptxas, " +
                        "sm_90) need " + std::to_string(regs) + " of the SM's 65536");
  }
  return true;
}

void run_grid(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem_bytes,
              Invoke invoke, void* ctx) {
  Scheduler& s = g_sched;
  if (g_current || s.running) die(std::string("emu: ") + name + " launched from inside a kernel");
  if (!launch_config_ok(name, kernel, grid, block, smem_bytes)) return;
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  log_launch(name);
  if (dry_launches()) return;
  while (s.pool.size() < threads) s.pool.push_back(std::make_unique<Fiber>());
  s.n = static_cast<unsigned>(threads);
  for (unsigned i = 0; i < s.n; ++i) {
    Fiber& f = *s.pool[i];
    if (f.fresh) init_fiber(&f);
    f.linear = i;
    f.tid = uint3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
  }
  // Dynamic shared memory holds garbage on a GPU: a pattern here (0xa5 bytes
  // read as a float are -2.9e-16, as an int negative), sized exactly, so that
  // ASan catches a kernel that indexes past what the launch asked for.
  struct Free16 {
    void operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{16}); }
  };
  std::unique_ptr<unsigned char[], Free16> smem;
  if (smem_bytes) {
    smem.reset(static_cast<unsigned char*>(::operator new[](smem_bytes, std::align_val_t{16})));
    std::memset(smem.get(), 0xa5, smem_bytes);
  }
  s.kernel = name;
  s.invoke = invoke;
  s.ctx = ctx;
  s.running = true;
  g_launch.grid_dim = grid;
  g_launch.block_dim = block;
  g_launch.dyn_smem = smem.get();
  g_launch.dyn_smem_bytes = smem_bytes;
  rc::launch_begin(name, grid, block, smem.get(), smem_bytes);
  uint32_t serial = 0;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        g_launch.block_idx = uint3{x, y, z};
        rc::block_begin(serial++);
        run_block();
      }
  s.running = false;
  g_launch = LaunchState{};
  const std::string findings = rc::launch_end();
  if (!findings.empty()) die(findings);
}

std::vector<std::string> g_launch_log;
bool g_logging_launches = false;
bool g_dry_launches = false;

struct Capture {
  bool open = false, invalid = false;
  std::vector<GraphNode> nodes;
  std::vector<std::string> names;  // one a node (last_capture)
};
thread_local Capture g_capture;
thread_local std::vector<std::string> g_last_capture;

bool capturing() {
  return g_capture.open;
}
void record(GraphNode node, const char* what) {
  if (g_capture.invalid) return;
  g_capture.nodes.push_back(std::move(node));
  g_capture.names.emplace_back(what);
}
cudaError_t capture_begin() {
  if (g_capture.open) return cudaErrorIllegalState;
  g_capture = Capture{};
  g_capture.open = true;
  return cudaSuccess;
}
cudaError_t capture_end(std::vector<GraphNode>* nodes) {
  if (!g_capture.open) return cudaErrorIllegalState;
  const bool invalid = g_capture.invalid;
  *nodes = std::move(g_capture.nodes);
  g_last_capture = std::move(g_capture.names);
  g_capture = Capture{};
  if (invalid) {
    nodes->clear();
    g_last_capture.clear();
  }
  return invalid ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
}
cudaError_t refuse_in_capture(const char*) {
  g_capture.invalid = true;
  g_capture.nodes.clear();
  g_capture.names.clear();
  return cudaErrorStreamCaptureUnsupported;
}

bool dry_launches() {
  return g_dry_launches;
}

void log_launch(const char* name) {
  if (g_logging_launches) g_launch_log.emplace_back(name);
}

}  // namespace detail

void start_launch_log() {
  detail::g_launch_log.clear();
  detail::g_logging_launches = true;
}
void stop_launch_log() {
  detail::g_logging_launches = false;
}
const std::vector<std::string>& launch_log() {
  return detail::g_launch_log;
}
const std::vector<std::string>& last_capture() {
  return detail::g_last_capture;
}
void set_dry_launches(bool dry) {
  detail::g_dry_launches = dry;
}

void set_fault_mode(FaultMode m) {
  detail::g_fault_mode = m;
}
FaultMode fault_mode() {
  return detail::g_fault_mode;
}

}  // namespace barata_emu

// ---- the runtime API ---------------------------------------------------------------

cudaError_t cudaGetLastError() {
  const cudaError_t e = barata_emu::detail::g_last_error;
  barata_emu::detail::g_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  return barata_emu::detail::g_last_error;
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
  }
  return "unknown error";
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
  }
  return "cudaErrorUnknown";
}

using barata_emu::detail::capturing;
using barata_emu::detail::refuse_in_capture;

namespace {
std::map<void*, size_t> g_allocations;  // cudaMalloc'd: pointer -> bytes
}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return cudaErrorInvalidValue;
  if (capturing()) return refuse_in_capture("cudaMalloc");
  *p = ::operator new (bytes ? bytes : 1, std::align_val_t{256}, std::nothrow);
  if (!*p) return cudaErrorMemoryAllocation;
  // Garbage, as a GPU's fresh allocation holds; the race checker reports a
  // kernel's read of a byte nothing wrote since.
  std::memset(*p, 0xa5, bytes);
  barata_emu::detail::rc::track_alloc(*p, bytes);
  g_allocations[*p] = bytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (capturing()) return refuse_in_capture("cudaFree");
  if (!p) return cudaSuccess;
  auto it = g_allocations.find(p);
  if (it == g_allocations.end()) return cudaErrorInvalidValue;
  barata_emu::detail::rc::untrack_alloc(p, it->second);
  g_allocations.erase(it);
  ::operator delete (p, std::align_val_t{256});
  return cudaSuccess;
}

namespace {
void copy_now(void* dst, const void* src, size_t n) {
  if (!n) return;
  std::memmove(dst, src, n);
  barata_emu::detail::rc::mark_written(dst, n);
}
void set_now(void* p, int value, size_t n) {
  if (!n) return;
  std::memset(p, value, n);
  barata_emu::detail::rc::mark_written(p, n);
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  if (capturing()) return refuse_in_capture("cudaMemcpy");
  copy_now(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t) {
  const char* what = kind == cudaMemcpyHostToDevice     ? "cudaMemcpyAsync HostToDevice"
                     : kind == cudaMemcpyDeviceToHost   ? "cudaMemcpyAsync DeviceToHost"
                     : kind == cudaMemcpyDeviceToDevice ? "cudaMemcpyAsync DeviceToDevice"
                                                        : "cudaMemcpyAsync Default";
  barata_emu::detail::run_or_record([=] { copy_now(dst, src, n); }, what);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t n) {
  if (capturing()) return refuse_in_capture("cudaMemset");
  set_now(p, value, n);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t) {
  barata_emu::detail::run_or_record([=] { set_now(p, value, n); }, "cudaMemsetAsync");
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) {
  if (capturing()) return refuse_in_capture("cudaStreamSynchronize");
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (capturing()) return refuse_in_capture("cudaDeviceSynchronize");
  return cudaSuccess;
}
