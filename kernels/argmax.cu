#include "argmax.cuh"

#include <string>

#include "common.cuh"

namespace barata::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int32_t kNone = 0x7fffffff;  // no candidate yet (every value NaN so far)

// (value, index) b beats a: larger, or equal and earlier; NaN never compares
// larger, so it never wins. The order does not matter for the result.
__device__ __forceinline__ void take_better(float& v, int32_t& i, float bv, int32_t bi) {
  if (bi != kNone && (i == kNone || bv > v || (bv == v && bi < i))) {
    v = bv;
    i = bi;
  }
}

// One CTA per row: each thread scans a strided slice (coalesced), then the
// warp and the block reduce (value, index) pairs with shuffles and shared memory.
__global__ void __launch_bounds__(kThreads)
    argmax_kernel(const float* __restrict__ logits, int64_t n_vocab, int32_t* __restrict__ out) {
  __shared__ float s_val[32];
  __shared__ int32_t s_idx[32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * n_vocab;
  float v = 0.0f;
  int32_t idx = kNone;
  for (int64_t j = threadIdx.x; j < n_vocab; j += kThreads) {
    const float x = __ldg(row + j);
    if (x == x) take_better(v, idx, x, static_cast<int32_t>(j));  // skips NaN
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    take_better(v, idx, ov, oi);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    s_val[warp] = v;
    s_idx[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    v = 0.0f;
    idx = kNone;
    if (lane < kThreads / 32) {
      v = s_val[lane];
      idx = s_idx[lane];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
      take_better(v, idx, ov, oi);
    }
    if (lane == 0) out[blockIdx.x] = idx == kNone ? 0 : idx;  // an all-NaN row: 0
  }
}

}  // namespace

void launch_argmax(const float* logits, int64_t n_rows, int64_t n_vocab, int32_t* out,
                   cudaStream_t stream) {
  if (n_rows < 0 || n_rows > 0x7fffffff || n_vocab <= 0 || n_vocab > 0x7fffffff)
    throw Error("cuda argmax: bad shape " + std::to_string(n_rows) + " x " +
                std::to_string(n_vocab));
  if (n_rows == 0) return;
  BARATA_LAUNCH(argmax_kernel, static_cast<unsigned>(n_rows), kThreads, 0, stream, logits, n_vocab,
                out);
  BARATA_CUDA_CHECK_LAUNCH();
}

}  // namespace barata::cuda
