#include "rmsnorm.cuh"

#include <string>

#include "common.cuh"
#include "q8_act.cuh"

namespace barata::cuda {
namespace {

constexpr int kMaxThreads = 256;

// One CTA per output row: the sum of squares in fp32 (the CPU sums in
// double; the difference is within a few ulp of the scale), reduced with warp
// shuffles and one shared-memory step, then y = (x * scale) * w as the CPU
// multiplies. Rows are read with 16-byte loads when d and the pointers allow.
__global__ void __launch_bounds__(kMaxThreads)
    rmsnorm_kernel(const float* x, const float* __restrict__ w, float* y, int64_t d, float eps,
                   const int32_t* __restrict__ row_index, Q8Out q8) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t src = row_index ? row_index[row] : row;
  const float* xr = x + src * d;
  float* yr = y + row * d;
  const bool vec = d % 4 == 0 && (reinterpret_cast<uintptr_t>(xr) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(yr) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(w) & 15) == 0;
  float ss = 0.0f;
  if (vec) {
    for (int64_t i = threadIdx.x; i < d / 4; i += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(xr)[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  }
  ss = block_sum(ss, scratch);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(d) + eps);
  if (vec) {
    for (int64_t i = threadIdx.x; i < d / 4; i += blockDim.x) {
      const float4 v = reinterpret_cast<const float4*>(xr)[i];
      const float4 g = __ldg(reinterpret_cast<const float4*>(w) + i);
      reinterpret_cast<float4*>(yr)[i] =
          make_float4(__fmul_rn(__fmul_rn(v.x, scale), g.x), __fmul_rn(__fmul_rn(v.y, scale), g.y),
                      __fmul_rn(__fmul_rn(v.z, scale), g.z), __fmul_rn(__fmul_rn(v.w, scale), g.w));
    }
  } else {
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
      yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), __ldg(w + i));
  }
  if (q8.xq == nullptr) return;
  // The row's 8-bit copy, one warp per 32 of the values just written (a
  // CTA's global writes are visible to it after the barrier).
  __syncthreads();
  const unsigned lane = threadIdx.x & 31u;
  const int64_t kb = d / 32;
  for (int64_t b = threadIdx.x >> 5; b < kb; b += blockDim.x >> 5)
    quantize_block_q8(yr[32 * b + lane], lane, q8.xq + row * d + 32 * b, q8.xd + row * kb + b);
}

}  // namespace

void launch_rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t d, float eps,
                    const int32_t* row_index, cudaStream_t stream, const Q8Out& q8) {
  if (n_rows < 0 || d <= 0)
    throw Error("cuda rmsnorm: bad shape " + std::to_string(n_rows) + " x " + std::to_string(d));
  if (n_rows > 0x7fffffff) throw Error("cuda rmsnorm: too many rows");
  if (row_index && x == y) throw Error("cuda rmsnorm: in place with a row index");
  if (q8.xq && (d % 32 != 0 || q8.xd == nullptr || (reinterpret_cast<uintptr_t>(q8.xq) & 3) != 0))
    throw Error(
        "cuda rmsnorm: an 8-bit copy needs rows of whole 32-element blocks and aligned "
        "outputs (d " +
        std::to_string(d) + ")");
  if (n_rows == 0) return;
  // Enough warps for the row, at most kMaxThreads (a whole number of warps).
  const int64_t want = (d >= 4 * kMaxThreads ? kMaxThreads : (d + 3) / 4);
  const int threads = static_cast<int>((want + 31) / 32 * 32);
  BARATA_LAUNCH(rmsnorm_kernel, static_cast<unsigned>(n_rows), threads, 0, stream, x, w, y, d, eps,
                row_index, q8);
  BARATA_CUDA_CHECK_LAUNCH();
}

}  // namespace barata::cuda
