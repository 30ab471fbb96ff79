#include "moe.cuh"

#include <algorithm>

#include "common.cuh"

namespace barata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

int grid_for(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min(kMaxBlocks, (n + kThreads - 1) / kThreads)));
}

__global__ void __launch_bounds__(kThreads)
    gather_kernel(const float* __restrict__ x, int64_t d, const int32_t* __restrict__ token,
                  int64_t n, float* __restrict__ out) {
  const int64_t total = n * d;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = i / d, c = i % d;
    out[i] = x[static_cast<int64_t>(token[g]) * d + c];
  }
}

__global__ void __launch_bounds__(kThreads)
    combine_kernel(float* __restrict__ acc, const float* __restrict__ y,
                   const int32_t* __restrict__ slot_at, const float* __restrict__ w,
                   int64_t n_tokens, int64_t k, int64_t d) {
  const int64_t total = n_tokens * d;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / d, c = i % d;
    float s = __fmul_rn(y[static_cast<int64_t>(slot_at[t * k]) * d + c], w[t * k]);
    for (int64_t j = 1; j < k; ++j)
      s = __fadd_rn(s,
                    __fmul_rn(y[static_cast<int64_t>(slot_at[t * k + j]) * d + c], w[t * k + j]));
    acc[i] = __fadd_rn(acc[i], s);
  }
}

}  // namespace

void launch_moe_gather(const float* x, int64_t d, const int32_t* token, int64_t n, float* out,
                       cudaStream_t stream) {
  if (n * d == 0) return;
  BARATA_LAUNCH(gather_kernel, grid_for(n * d), kThreads, 0, stream, x, d, token, n, out);
  BARATA_CUDA_CHECK_LAUNCH();
}

void launch_moe_combine(float* acc, const float* y, const int32_t* slot_at, const float* weights,
                        int64_t n_tokens, int64_t k, int64_t d, cudaStream_t stream) {
  if (n_tokens * d == 0) return;
  BARATA_LAUNCH(combine_kernel, grid_for(n_tokens * d), kThreads, 0, stream, acc, y, slot_at,
                weights, n_tokens, k, d);
  BARATA_CUDA_CHECK_LAUNCH();
}

}  // namespace barata::cuda
