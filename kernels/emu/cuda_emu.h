// A host emulation of the CUDA execution model, so that the kernel sources
// (kernels/*.cu) also compile as plain C++ and run on the CPU in CI, where no
// GPU exists (docs/cuda-emulation.md). Selected by BARATA_CUDA_EMU; needs no
// CUDA toolkit.
//
// Each block of a launch runs its threads as fibers on the calling
// OS thread, one at a time, switching only at barriers: __syncthreads is a
// block barrier, every warp intrinsic a barrier of the lanes its mask names,
// with an exchange buffer. A barrier that cannot complete (a thread exited or
// waits elsewhere) is reported as "emu: deadlock/divergent __syncthreads in
// <kernel>: ..." instead of hanging. Blocks of a launch run one after another,
// so `static` storage is one block's shared memory. "Device memory" is host
// memory: tests pass host pointers to the launchers.
//
// Launch with BARATA_LAUNCH(kernel, grid, block, smem_bytes, stream, args...)
// (kernel<<<...>>>(args...) under nvcc, see common.cuh). A template kernel
// whose name has a comma goes in parentheses: BARATA_LAUNCH((k<A, B>), ...).
// Dynamic shared memory: BARATA_DYNAMIC_SMEM(float, buf); declares float* buf.
#pragma once

#if defined(__CUDACC__)
#error "kernels/emu/cuda_emu.h is the host emulation: do not include it under nvcc"
#endif

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>  // (these before __noinline__ is defined: libstdc++ uses the name)
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>
#include <utility>

// ---- qualifiers ---------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// libstdc++ spells __attribute__((__noinline__)) in <memory> (included above,
// so its guard keeps it from being read again with this macro defined).
#define __noinline__ __attribute__((noinline))
// Blocks run one after another on one OS thread: a function-local static is
// the shared memory of the block that is running (not zeroed per block; the
// content a block finds is what the previous block left, as on a GPU; the
// race checker makes a read of a byte this block never wrote garbage).
#define __shared__ static
// __restrict__ is a GCC/Clang keyword already.

#define BARATA_CUDA_EMU_ACTIVE 1

// ---- vector types -------------------------------------------------------------
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define BARATA_EMU_VEC2(name, T, al)         \
  struct __attribute__((aligned(al))) name { \
    T x, y;                                  \
  };
#define BARATA_EMU_VEC4(name, T, al)         \
  struct __attribute__((aligned(al))) name { \
    T x, y, z, w;                            \
  };
BARATA_EMU_VEC2(float2, float, 8)
BARATA_EMU_VEC4(float4, float, 16)
BARATA_EMU_VEC2(int2, int, 8)
BARATA_EMU_VEC4(int4, int, 16)
BARATA_EMU_VEC2(uint2, unsigned, 8)
BARATA_EMU_VEC4(uint4, unsigned, 16)
BARATA_EMU_VEC2(ushort2, unsigned short, 4)
BARATA_EMU_VEC4(ushort4, unsigned short, 8)
BARATA_EMU_VEC4(uchar4, unsigned char, 4)
BARATA_EMU_VEC4(char4, signed char, 4)
#undef BARATA_EMU_VEC2
#undef BARATA_EMU_VEC4
inline float2 make_float2(float x, float y) {
  return {x, y};
}
inline float4 make_float4(float x, float y, float z, float w) {
  return {x, y, z, w};
}
inline int2 make_int2(int x, int y) {
  return {x, y};
}
inline int4 make_int4(int x, int y, int z, int w) {
  return {x, y, z, w};
}
inline uint2 make_uint2(unsigned x, unsigned y) {
  return {x, y};
}
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return {x, y, z, w};
}

// ---- runtime types --------------------------------------------------------------
// Names of their own (not cudaError / CUstream_st), so that an emulated
// launcher never has the mangled name of the real one.
enum barata_emu_error_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorNoDevice = 100,
  cudaErrorIllegalState = 401,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
};
using cudaError_t = barata_emu_error_t;
struct barata_emu_stream_st;
using cudaStream_t = barata_emu_stream_st*;
enum cudaMemcpyKind : int {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute : int { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

cudaError_t cudaGetLastError();  // returns and clears this OS thread's last error
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
// Host memory standing in for device memory (256-byte aligned, like cudaMalloc).
cudaError_t cudaMalloc(void** p, size_t bytes);
template <typename T>
cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* p, int value, size_t n);
cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream = nullptr);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);  // launches are synchronous
cudaError_t cudaDeviceSynchronize();
namespace barata_emu::detail {
cudaError_t set_max_dynamic_smem(const void* kernel, int bytes);

// Stream capture (CUDA graphs, thread-local mode). While a capture is open on
// this OS thread, launches, asynchronous copies and sets and the emulated
// cuBLAS GEMM are recorded as nodes instead of run, with their arguments as
// they were at capture (as a graph holds them); a replay runs the nodes in
// order. What a capturing stream refuses on a GPU (a synchronize, a
// synchronous copy or set, an allocation) is refused here the same way
// (cudaErrorStreamCaptureUnsupported) and invalidates the capture, whose end
// then fails with cudaErrorStreamCaptureInvalidated.
using GraphNode = std::function<void()>;
bool capturing();
// `what` names the node in barata_emu::last_capture().
void record(GraphNode node, const char* what);
cudaError_t capture_begin();
cudaError_t capture_end(std::vector<GraphNode>* nodes);
// What a capturing stream refuses: invalidates the capture and returns the error.
cudaError_t refuse_in_capture(const char* what);
// Stream work: a node of the open capture, or run now.
inline void run_or_record(GraphNode node, const char* what) {
  if (capturing())
    record(std::move(node), what);
  else
    node();
}
}  // namespace barata_emu::detail
// Only the dynamic shared memory limit (above 48 KiB needs it, as on a GPU).
template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return barata_emu::detail::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), value);
}

// ---- fp16 / bf16 ----------------------------------------------------------------
struct __half {
  unsigned short __x;
};
struct __attribute__((aligned(4))) __half2 {
  __half x, y;
};
struct __nv_bfloat16 {
  unsigned short __x;
};
using half = __half;
using half2 = __half2;

namespace barata_emu::detail {
inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Exact widening, written here (not taken from barata/half.h) so that the
// emulation checks the kernels against an independent implementation.
inline float half_bits_to_float(unsigned short h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return u2f(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return u2f(sign | ((exp + 112u) << 23) | (mant << 13));
  // zero or subnormal: mant * 2^-24, exact in fp32
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}
// cvt.rn.f16.f32: nearest even, overflow to inf, NaN to the canonical 0x7fff.
inline unsigned short float_to_half_bits_rn(float f) {
  const uint32_t x = f2u(f);
  const unsigned short sign = static_cast<unsigned short>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return 0x7fffu;
  if (ax >= 0x477ff000u) return static_cast<unsigned short>(sign | 0x7c00u);
  if (ax < 0x38800000u) {                        // subnormal result: round ax * 2^24 to an integer
    const float scaled = u2f(ax) * 16777216.0f;  // exact (power of two)
    const float r = std::nearbyint(scaled);      // default rounding mode: nearest even
    return static_cast<unsigned short>(sign | static_cast<unsigned short>(r));
  }
  uint32_t r = ax - 0x38000000u;
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<unsigned short>(sign | r);
}
inline unsigned short float_to_bf16_bits_rn(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<unsigned short>(x >> 16);
}
}  // namespace barata_emu::detail

inline float __half2float(__half h) {
  return barata_emu::detail::half_bits_to_float(h.__x);
}
inline __half __float2half_rn(float f) {
  return {barata_emu::detail::float_to_half_bits_rn(f)};
}
inline __half __float2half(float f) {
  return __float2half_rn(f);
}
inline __half __ushort_as_half(unsigned short u) {
  return {u};
}
inline unsigned short __half_as_ushort(__half h) {
  return h.__x;
}
inline __half2 __halves2half2(__half a, __half b) {
  return {a, b};
}
inline __half2 __floats2half2_rn(float a, float b) {
  return {__float2half_rn(a), __float2half_rn(b)};
}
inline __half2 __float2half2_rn(float a) {
  return __floats2half2_rn(a, a);
}
inline float __low2float(__half2 h) {
  return __half2float(h.x);
}
inline float __high2float(__half2 h) {
  return __half2float(h.y);
}
inline float2 __half22float2(__half2 h) {
  return {__half2float(h.x), __half2float(h.y)};
}
inline float __bfloat162float(__nv_bfloat16 h) {
  return barata_emu::detail::u2f(static_cast<uint32_t>(h.__x) << 16);
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return {barata_emu::detail::float_to_bf16_bits_rn(f)};
}
inline __nv_bfloat16 __float2bfloat16(float f) {
  return __float2bfloat16_rn(f);
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  return {u};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) {
  return h.__x;
}

// ---- arithmetic intrinsics ----------------------------------------------------------
// IEEE operations round like the hardware's; the fast approximations (__expf,
// __logf, __fdividef, rsqrtf) are computed exactly here, so their results can
// differ from a GPU's in the last bits (docs/cuda-emulation.md).
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
inline float __fmaf_rn(float a, float b, float c) {
  return std::fma(a, b, c);
}
inline float __frcp_rn(float a) {
  return 1.0f / a;
}
inline float __fsqrt_rn(float a) {
  return std::sqrt(a);
}
inline float __expf(float a) {
  return std::exp(a);
}
inline float __logf(float a) {
  return std::log(a);
}
inline float __powf(float a, float b) {
  return std::pow(a, b);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float __saturatef(float a) {
  return a < 0.0f ? 0.0f : (a > 1.0f ? 1.0f : a);
}
inline float rsqrtf(float a) {
  return 1.0f / std::sqrt(a);
}
inline float __int_as_float(int i) {
  return barata_emu::detail::u2f(static_cast<uint32_t>(i));
}
inline int __float_as_int(float f) {
  return static_cast<int>(barata_emu::detail::f2u(f));
}
inline float __uint_as_float(unsigned u) {
  return barata_emu::detail::u2f(u);
}
inline unsigned __float_as_uint(float f) {
  return barata_emu::detail::f2u(f);
}
// Four signed byte products summed into c (sm_61+'s dp4a).
inline int __dp4a(int a, int b, int c) {
  for (int j = 0; j < 4; ++j)
    c += static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * j))) *
         static_cast<int>(static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * j)));
  return c;
}
inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
inline int __popcll(unsigned long long x) {
  return __builtin_popcountll(x);
}
inline int __clz(unsigned x) {
  return x ? __builtin_clz(x) : 32;
}
inline int __ffs(unsigned x) {
  return __builtin_ffs(static_cast<int>(x));
}
// expf, sqrtf, fmaxf, fabsf, ... are the C library's (<math.h>).
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
// Fibers run one at a time and switch only at barriers: plain read-modify-write
// is atomic here.
template <typename T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  if (v > old) *p = v;
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
template <typename T>
inline T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <typename T>
inline T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
inline void __threadfence() {}
inline void __threadfence_block() {}

// ---- the execution model ------------------------------------------------------------
inline constexpr int warpSize = 32;

namespace barata_emu {

// How a broken barrier or a kernel fault is reported: print the message and
// abort (the default: a test that hits it dies with the message), or throw
// Fault from the launch (for tests of the emulator itself).
enum class FaultMode { kAbort, kThrow };
void set_fault_mode(FaultMode m);
FaultMode fault_mode();
class Fault : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The launches from start_launch_log() to stop_launch_log(), by kernel name
// (and "cublasGemmEx" for each GEMM of the emulated cuBLAS): a test counts the
// kernels one forward launches with it, the nodes a CUDA graph of that step
// would hold. Off unless started.
void start_launch_log();
void stop_launch_log();
const std::vector<std::string>& launch_log();
// What the last capture ended on this OS thread recorded, one name a node,
// in order: a kernel by the name the launch log gives it, "cublasGemmEx",
// "cudaMemcpyAsync HostToDevice" (DeviceToHost, DeviceToDevice, Default),
// "cudaMemsetAsync"; empty if that capture was invalidated. A test compares
// it with the launch log of the same work run uncaptured.
const std::vector<std::string>& last_capture();
// The race and initialization checker (kernels/emu/racecheck.cpp): on in
// kernels compiled with its instrumentation (racecheck_available()) unless
// BARATA_EMU_RACECHECK=0 or set_racecheck(false). A launch with a finding
// fails at its end like a broken barrier (abort, or Fault in kThrow mode).
void set_racecheck(bool on);
bool racecheck_enabled();
bool racecheck_available();

// Dry launches: a launch's configuration is checked and logged, and its
// threads are not run (nor is an emulated GEMM computed): for a test that
// counts launches, whose results it does not read. Off by default.
void set_dry_launches(bool dry);

namespace detail {

namespace rc {  // the checker's side of the scheduler and the runtime
bool enabled();
void launch_begin(const char* kernel, dim3 grid, dim3 block, const unsigned char* dyn,
                  size_t dyn_bytes);
void block_begin(uint32_t serial);
void block_barrier_done();
bool checking();  // the running launch is being checked
void warp_barrier_done(unsigned warp);  // a barrier of every live lane of the warp
void enter_thread(unsigned linear, const void* stack, size_t stack_bytes);
void leave_thread();
std::string launch_end();  // the findings, or ""
// cudaMalloc'd memory: tracked from allocation to free; written by a copy, a
// set or the emulated GEMM (kernels' writes are seen by the instrumentation).
void track_alloc(const void* p, size_t n);
void untrack_alloc(const void* p, size_t n);
void mark_written(const void* p, size_t n);
}  // namespace rc

void log_launch(const char* name);
bool dry_launches();

struct Fiber;
struct LaunchState {
  uint3 block_idx;
  dim3 block_dim, grid_dim;
  unsigned char* dyn_smem = nullptr;
  size_t dyn_smem_bytes = 0;
};
extern thread_local Fiber* g_current;  // the running emulated thread, or null
extern thread_local LaunchState g_launch;

const uint3& thread_idx();  // of the running fiber; aborts outside a kernel
const LaunchState& launch_state();
unsigned char* dynamic_smem();

enum class WarpOp : int { kSync, kShflIdx, kShflUp, kShflDown, kShflXor, kBallot, kAny, kAll };
enum class BlockOp : int { kSync, kCount, kAnd, kOr };
// One lane's part in a warp-level barrier: waits for every lane of `mask`,
// then returns the value exchanged (the source lane's, or the vote).
uint64_t warp_exchange(WarpOp op, unsigned mask, uint64_t value, int param, int width);
int block_barrier(BlockOp op, int pred);
unsigned active_mask();
unsigned lane_id();

using Invoke = void (*)(void* ctx);
// Whether the configuration is one a GPU launches; if not, sets the sticky
// error (cudaGetLastError) as a refused launch does.
bool launch_config_ok(const char* name, const void* kernel, dim3 grid, dim3 block,
                      size_t smem_bytes);
// What ptxas reports of a kernel family for sm_90 (kernels/emu/sm90_limits.cpp):
// the most registers per thread over its instantiations and its
// __launch_bounds__ (0 where unknown). `launch_name` is BARATA_LAUNCH's
// spelling of the kernel ("(qmm_kernel<T, R, C>)"): the family is the name
// before '<' or '('.
struct KernelLimits {
  int registers = 0;
  int max_threads = 0;
};
KernelLimits kernel_limits(const char* launch_name);
void run_grid(const char* name, const void* kernel, dim3 grid, dim3 block, size_t smem_bytes,
              Invoke invoke, void* ctx);

template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "emu: shuffled types must be trivially copyable and at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace detail

// The emulated launch: arguments are converted to the kernel's parameter
// types once (as <<<>>> does) and every thread gets its own copy.
template <typename... P, typename... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem_bytes,
            cudaStream_t /*stream*/, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "emu: wrong number of kernel arguments");
  using Args = std::tuple<std::decay_t<P>...>;
  struct Ctx {
    void (*k)(P...);
    Args args;
  };
  constexpr detail::Invoke invoke = [](void* p) {
    Ctx* c = static_cast<Ctx*>(p);
    Args copy = c->args;
    std::apply(c->k, std::move(copy));
  };
  const void* kp = reinterpret_cast<const void*>(kernel);
  if (detail::capturing()) {  // a graph node: checked now, run at each replay
    if (!detail::launch_config_ok(name, kp, grid, block, smem_bytes)) return;
    auto ctx = std::make_shared<Ctx>(Ctx{kernel, Args(std::forward<A>(args)...)});
    detail::record([=] { detail::run_grid(name, kp, grid, block, smem_bytes, invoke, ctx.get()); },
                   name);
    return;
  }
  Ctx ctx{kernel, Args(std::forward<A>(args)...)};
  detail::run_grid(name, kp, grid, block, smem_bytes, invoke, &ctx);
}

}  // namespace barata_emu

#define threadIdx (::barata_emu::detail::thread_idx())
#define blockIdx (::barata_emu::detail::launch_state().block_idx)
#define blockDim (::barata_emu::detail::launch_state().block_dim)
#define gridDim (::barata_emu::detail::launch_state().grid_dim)

#define BARATA_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  ::barata_emu::launch(#kernel, kernel, grid, block, smem_bytes, stream __VA_OPT__(, ) __VA_ARGS__)
// Dynamic shared memory of the launch (16-byte aligned), as a T*.
#define BARATA_DYNAMIC_SMEM(T, name) \
  T* const name = reinterpret_cast<T*>(::barata_emu::detail::dynamic_smem())

inline void __syncthreads() {
  barata_emu::detail::block_barrier(barata_emu::detail::BlockOp::kSync, 0);
}
inline int __syncthreads_count(int pred) {
  return barata_emu::detail::block_barrier(barata_emu::detail::BlockOp::kCount, pred);
}
inline int __syncthreads_and(int pred) {
  return barata_emu::detail::block_barrier(barata_emu::detail::BlockOp::kAnd, pred);
}
inline int __syncthreads_or(int pred) {
  return barata_emu::detail::block_barrier(barata_emu::detail::BlockOp::kOr, pred);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  barata_emu::detail::warp_exchange(barata_emu::detail::WarpOp::kSync, mask, 0, 0, warpSize);
}
// The lanes of the warp that have not exited (a GPU may report fewer after
// divergence; code must not rely on more).
inline unsigned __activemask() {
  return barata_emu::detail::active_mask();
}

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  using namespace barata_emu::detail;
  return from_bits<T>(warp_exchange(WarpOp::kShflIdx, mask, to_bits(var), src_lane, width));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using namespace barata_emu::detail;
  return from_bits<T>(
      warp_exchange(WarpOp::kShflUp, mask, to_bits(var), static_cast<int>(delta), width));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using namespace barata_emu::detail;
  return from_bits<T>(
      warp_exchange(WarpOp::kShflDown, mask, to_bits(var), static_cast<int>(delta), width));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  using namespace barata_emu::detail;
  return from_bits<T>(warp_exchange(WarpOp::kShflXor, mask, to_bits(var), lane_mask, width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  using namespace barata_emu::detail;
  return static_cast<unsigned>(warp_exchange(WarpOp::kBallot, mask, pred != 0, 0, warpSize));
}
inline int __any_sync(unsigned mask, int pred) {
  using namespace barata_emu::detail;
  return static_cast<int>(warp_exchange(WarpOp::kAny, mask, pred != 0, 0, warpSize));
}
inline int __all_sync(unsigned mask, int pred) {
  using namespace barata_emu::detail;
  return static_cast<int>(warp_exchange(WarpOp::kAll, mask, pred != 0, 0, warpSize));
}
