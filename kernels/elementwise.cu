#include "elementwise.cuh"

#include <algorithm>
#include <string>

#include "common.cuh"
#include "q8_act.cuh"

namespace barata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;  // grid-stride beyond 2M threads

// Memory-bound: grid-stride loops over 16-byte vectors when every pointer is
// 16-byte aligned (cudaMalloc memory and offsets that are multiples of 4
// floats), a scalar tail, scalar loads otherwise; consecutive threads touch
// consecutive elements, so every warp access is coalesced.
__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}
__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

__global__ void __launch_bounds__(kThreads)
    add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
  int64_t done = 0;
  if (aligned16(x) && aligned16(y)) {
    const int64_t n4 = n / 4;
    for (int64_t i = first_index(); i < n4; i += stride()) {
      float4 a = reinterpret_cast<float4*>(x)[i];
      const float4 b = __ldg(reinterpret_cast<const float4*>(y) + i);
      a.x += b.x, a.y += b.y, a.z += b.z, a.w += b.w;
      reinterpret_cast<float4*>(x)[i] = a;
    }
    done = n4 * 4;
  }
  for (int64_t i = done + first_index(); i < n; i += stride()) x[i] += __ldg(y + i);
}

__global__ void __launch_bounds__(kThreads)
    add_bias_kernel(float* __restrict__ y, const float* __restrict__ b, int64_t n, int64_t width) {
  for (int64_t i = first_index(); i < n; i += stride()) y[i] += __ldg(b + i % width);
}

// silu(g) * up = g / (1 + exp(-g)) * up, in the CPU's order. expf is the
// accurate one (a few ulp on a GPU), not the __expf approximation.
__device__ __forceinline__ float swiglu(float g, float u) {
  return __fmul_rn(g / (1.0f + expf(-g)), u);
}

// GELU, tanh form, times up (the CPU's gelu_tanh: the same operations).
__device__ __forceinline__ float geglu(float g, float u) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  const float t = tanhf(__fmul_rn(__fmul_rn(kSqrt2OverPi, g),
                                  __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, g), g))));
  return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, t)), u);
}

// The gated activation of the FFN: kGelu picks GeGLU over SwiGLU.
template <bool kGelu>
__device__ __forceinline__ float glu(float g, float u) {
  if constexpr (kGelu) {
    return geglu(g, u);
  } else {
    return swiglu(g, u);
  }
}

template <bool kGelu>
__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(float* __restrict__ gate, const float* __restrict__ up, int64_t n) {
  int64_t done = 0;
  if (aligned16(gate) && aligned16(up)) {
    const int64_t n4 = n / 4;
    for (int64_t i = first_index(); i < n4; i += stride()) {
      float4 g = reinterpret_cast<float4*>(gate)[i];
      const float4 u = __ldg(reinterpret_cast<const float4*>(up) + i);
      g = make_float4(glu<kGelu>(g.x, u.x), glu<kGelu>(g.y, u.y), glu<kGelu>(g.z, u.z),
                      glu<kGelu>(g.w, u.w));
      reinterpret_cast<float4*>(gate)[i] = g;
    }
    done = n4 * 4;
  }
  for (int64_t i = done + first_index(); i < n; i += stride())
    gate[i] = glu<kGelu>(gate[i], __ldg(up + i));
}

// swiglu and its 8-bit copy: one warp per 32 elements (grid-stride over
// the blocks), the swiglu kernel's arithmetic, then quantize_block_q8.
template <bool kGelu>
__global__ void __launch_bounds__(kThreads)
    swiglu_q8_kernel(float* __restrict__ gate, const float* __restrict__ up, int64_t n_blocks,
                     signed char* __restrict__ xq, float* __restrict__ xd) {
  const unsigned lane = threadIdx.x & 31u;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t b = first_index() >> 5; b < n_blocks; b += warps) {
    const int64_t i = 32 * b + lane;
    const float g = glu<kGelu>(gate[i], __ldg(up + i));
    gate[i] = g;
    quantize_block_q8(g, lane, xq + 32 * b, xd + b);
  }
}

__global__ void __launch_bounds__(kThreads)
    f32_to_f16_kernel(const float* __restrict__ x, uint16_t* __restrict__ y, int64_t n) {
  int64_t done = 0;
  if (aligned16(x) && (reinterpret_cast<uintptr_t>(y) & 7) == 0) {
    const int64_t n4 = n / 4;
    for (int64_t i = first_index(); i < n4; i += stride()) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(x) + i);
      uint2 h;
      h.x = static_cast<uint32_t>(__half_as_ushort(float_to_half_rn(v.x))) |
            (static_cast<uint32_t>(__half_as_ushort(float_to_half_rn(v.y))) << 16);
      h.y = static_cast<uint32_t>(__half_as_ushort(float_to_half_rn(v.z))) |
            (static_cast<uint32_t>(__half_as_ushort(float_to_half_rn(v.w))) << 16);
      reinterpret_cast<uint2*>(y)[i] = h;
    }
    done = n4 * 4;
  }
  for (int64_t i = done + first_index(); i < n; i += stride())
    y[i] = __half_as_ushort(float_to_half_rn(__ldg(x + i)));
}

unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + 4 * kThreads - 1) / (4 * kThreads);
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

void check_n(const char* op, int64_t n) {
  if (n < 0) throw Error(std::string("cuda ") + op + ": negative length " + std::to_string(n));
}

}  // namespace

void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  check_n("add", n);
  if (n == 0) return;
  BARATA_LAUNCH(add_kernel, grid_for(n), kThreads, 0, stream, x, y, n);
  BARATA_CUDA_CHECK_LAUNCH();
}

void launch_add_bias(float* y, const float* b, int64_t n_rows, int64_t width, cudaStream_t stream) {
  if (n_rows < 0 || width <= 0)
    throw Error("cuda add_bias: bad shape " + std::to_string(n_rows) + " x " +
                std::to_string(width));
  const int64_t n = n_rows * width;
  if (n == 0) return;
  BARATA_LAUNCH(add_bias_kernel, grid_for(n), kThreads, 0, stream, y, b, n, width);
  BARATA_CUDA_CHECK_LAUNCH();
}

void launch_swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream, bool gelu) {
  check_n("swiglu", n);
  if (n == 0) return;
  if (gelu) {
    BARATA_LAUNCH(swiglu_kernel<true>, grid_for(n), kThreads, 0, stream, gate, up, n);
  } else {
    BARATA_LAUNCH(swiglu_kernel<false>, grid_for(n), kThreads, 0, stream, gate, up, n);
  }
  BARATA_CUDA_CHECK_LAUNCH();
}

void launch_swiglu_q8(float* gate, const float* up, int64_t n, const Q8Out& q8, cudaStream_t stream,
                      bool gelu) {
  check_n("swiglu", n);
  if (n % 32 != 0 || q8.xq == nullptr || q8.xd == nullptr ||
      (reinterpret_cast<uintptr_t>(q8.xq) & 3) != 0)
    throw Error("cuda swiglu: an 8-bit copy needs whole 32-element blocks (" + std::to_string(n) +
                " values) and aligned outputs");
  if (n == 0) return;
  const int64_t blocks = n / 32;
  const int64_t ctas =
      std::min<int64_t>(kMaxBlocks, (blocks + kThreads / 32 - 1) / (kThreads / 32));
  if (gelu) {
    BARATA_LAUNCH(swiglu_q8_kernel<true>, static_cast<unsigned>(ctas), kThreads, 0, stream, gate,
                  up, blocks, q8.xq, q8.xd);
  } else {
    BARATA_LAUNCH(swiglu_q8_kernel<false>, static_cast<unsigned>(ctas), kThreads, 0, stream, gate,
                  up, blocks, q8.xq, q8.xd);
  }
  BARATA_CUDA_CHECK_LAUNCH();
}

void launch_f32_to_f16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  check_n("f32_to_f16", n);
  if (n == 0) return;
  BARATA_LAUNCH(f32_to_f16_kernel, grid_for(n), kThreads, 0, stream, x, y, n);
  BARATA_CUDA_CHECK_LAUNCH();
}

}  // namespace barata::cuda
