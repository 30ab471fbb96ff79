// Batched decode matmul for every weight type, and the row dequantizer that
// feeds cuBLAS beyond it.
//
// Decode reads all of W once per step whatever the batch width B, so the
// kernel's job is to read each weight block once for all B activation rows:
//
// * A CTA owns R consecutive output rows; its 4 warps split the row length
//   (thread i takes elements 4i..4i+3 of every 512-element step, so a warp's
//   weight and activation loads are contiguous runs). Per step a thread
//   decodes its 4 weights of each of the R rows once (qdecode.cuh, the
//   reference's arithmetic to the bit), then, token by token, loads 4
//   activations (one float4) and does R x 4 FMAs into acc[r][t]. Registers
//   bound R x T at 64: R = 4 up to T = 16, 2 at 32, 1 at 64.
// * Widths are padded to T in {1, 2, 4, 8, 16, 32, 64}; the padded tokens load
//   nothing and write nothing (their FMAs run on zeros).
// * acc is reduced across the warp with the reduce-scatter of warp_reduce.cuh
//   and across the 4 warps through shared memory, in a fixed order.
// * Code books (NF4, IQ4_NL) sit in shared memory: one word per entry, so a
//   warp's 32 lookups hit distinct banks or broadcast.
//
// Error: a thread sums 4 ceil(k / 512) products with FMA, then 5 butterfly
// levels, 3 cross-warp adds and the scale: |y - scale * dot| <= ~(4 ceil(k/512)
// + 9) * 2^-24 * |scale| * sum |w_j x_j| (tests/test_emu_qmm.cpp doubles it:
// the emulation rounds a * b + c twice).
#include "qmm.cuh"

#include <string>

#include "common.cuh"
#include "qdecode.cuh"
#include "warp_reduce.cuh"

namespace barata::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kStep = 4 * kThreads;  // elements per CTA step

__device__ __forceinline__ float fma_acc(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return a * b + c;
#endif
}

template <DType TY, int R, int T>
__global__ void __launch_bounds__(kThreads)
    qmm_kernel(const unsigned char* __restrict__ w, size_t row_bytes, int k, int n_rows,
               float scale, const float* __restrict__ x, int n_tok, int x_vec,
               float* __restrict__ y, int64_t ldy) {
  using F = qdec::QFmt<TY>;
  constexpr int kN = R * T;
  __shared__ float lut[16];
  __shared__ float red[kWarps * kN];
  if constexpr (F::kLut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = F::lut_entry(static_cast<int>(threadIdx.x));
    __syncthreads();
  }
  const unsigned lane = threadIdx.x & 31u;
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int row0 = static_cast<int>(blockIdx.x) * R;
  const int n_here = n_rows - row0 < R ? n_rows - row0 : R;

  float acc[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) acc[i] = 0.0f;

  for (int e = 4 * static_cast<int>(threadIdx.x); e < k; e += kStep) {
    float wv[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < n_here) {
        F::decode4(w + static_cast<size_t>(row0 + r) * row_bytes, k, e, lut, wv[r]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) wv[r][j] = 0.0f;
      }
    }
    const bool whole = x_vec && e + 4 <= k;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float xv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (t < n_tok) {
        const float* xp = x + static_cast<size_t>(t) * k + e;
        if (whole) {
          const float4 v = __ldg(reinterpret_cast<const float4*>(xp));
          xv[0] = v.x;
          xv[1] = v.y;
          xv[2] = v.z;
          xv[3] = v.w;
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) xv[j] = e + j < k ? __ldg(xp + j) : 0.0f;
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[r * T + t] = fma_acc(wv[r][j], xv[j], acc[r * T + t]);
      }
    }
  }

  int base = 0;
  Scatter<kN, 16>::run(acc, lane, base);
  if ((lane & Scatter<kN, 16>::kWholeMask) == 0) {
#pragma unroll
    for (int i = 0; i < Scatter<kN, 16>::kFinal; ++i) red[(base + i) * kWarps + warp] = acc[i];
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < kN; idx += kThreads) {
    const int r = idx / T, t = idx % T;
    if (r < n_here && t < n_tok) {
      float s = red[idx * kWarps];
#pragma unroll
      for (int i = 1; i < kWarps; ++i) s += red[idx * kWarps + i];
      y[t * ldy + row0 + r] = scale * s;
    }
  }
}

struct Args {
  const unsigned char* w;
  size_t row_bytes;
  int k, n_rows;
  float scale;
  const float* x;
  int n_tok, x_vec;
  float* y;
  int64_t ldy;
};

template <DType TY, int R, int T>
void launch_rt(const Args& a, cudaStream_t stream) {
  BARATA_LAUNCH((qmm_kernel<TY, R, T>), dim3(ceil_div(a.n_rows, R)), dim3(kThreads), 0, stream, a.w,
                a.row_bytes, a.k, a.n_rows, a.scale, a.x, a.n_tok, a.x_vec, a.y, a.ldy);
  BARATA_CUDA_CHECK_LAUNCH();
}

// The padded width of n tokens, and the rows per CTA that go with it.
int padded_tokens(int64_t n) {
  int t = 1;
  while (t < n) t *= 2;
  return t;
}
int rows_for(int t) {
  return t <= 16 ? 4 : 64 / t;
}

template <DType TY>
void launch_type(const Args& a, cudaStream_t stream) {
  switch (padded_tokens(a.n_tok)) {
    case 1:
      return launch_rt<TY, 4, 1>(a, stream);
    case 2:
      return launch_rt<TY, 4, 2>(a, stream);
    case 4:
      return launch_rt<TY, 4, 4>(a, stream);
    case 8:
      return launch_rt<TY, 4, 8>(a, stream);
    case 16:
      return launch_rt<TY, 4, 16>(a, stream);
    case 32:
      return launch_rt<TY, 2, 32>(a, stream);
    default:
      return launch_rt<TY, 1, 64>(a, stream);
  }
}

// ---- rows to fp16 -------------------------------------------------------------------
constexpr int kDqThreads = 256;

template <DType TY>
__global__ void __launch_bounds__(kDqThreads)
    dequant_rows_kernel(const unsigned char* __restrict__ w, size_t row_bytes, int k,
                        unsigned short* __restrict__ dst) {
  using F = qdec::QFmt<TY>;
  __shared__ float lut[16];
  if constexpr (F::kLut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = F::lut_entry(static_cast<int>(threadIdx.x));
    __syncthreads();
  }
  const int64_t r = blockIdx.y;
  const int e = 4 * static_cast<int>(blockIdx.x * kDqThreads + threadIdx.x);
  if (e >= k) return;
  float v[4];
  F::decode4(w + static_cast<size_t>(r) * row_bytes, k, e, lut, v);
  unsigned short* out = dst + r * k + e;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (e + j < k) out[j] = __half_as_ushort(float_to_half_rn(v[j]));
}

template <DType TY>
void launch_dq(const unsigned char* w, size_t row_bytes, int k, int64_t n_rows, uint16_t* dst,
               cudaStream_t stream) {
  const dim3 grid(ceil_div(ceil_div(k, 4), kDqThreads), static_cast<unsigned>(n_rows));
  BARATA_LAUNCH(dequant_rows_kernel<TY>, grid, dim3(kDqThreads), 0, stream, w, row_bytes, k,
                reinterpret_cast<unsigned short*>(dst));
  BARATA_CUDA_CHECK_LAUNCH();
}

[[noreturn]] void bad(const char* fn, const std::string& what) {
  throw Error(std::string(fn) + ": " + what);
}

// The checks both entry points share; returns the bytes one row needs.
size_t check_rows(const char* fn, DType type, size_t row_bytes, int64_t k, int64_t n_rows) {
  const DTypeTraits& tr = dtype_traits(type);
  if (!qmm_supported(type)) bad(fn, std::string("no kernel for ") + tr.name + " weights");
  if (k < 1 || k > (int64_t{1} << 28) || k % tr.block_size != 0)
    bad(fn, "row length " + std::to_string(k) + " is not a positive whole number of " + tr.name +
                " blocks (at most 2^28 elements)");
  if (n_rows < 0 || n_rows > 65535 * int64_t{4096})
    bad(fn, std::to_string(n_rows) + " rows (0..2^28)");
  const size_t need = barata::row_bytes(type, k);
  if (row_bytes < need)
    bad(fn, "row stride " + std::to_string(row_bytes) + " bytes is below one " + tr.name +
                " row of " + std::to_string(k) + " (" + std::to_string(need) + " bytes)");
  if (row_bytes > (size_t{1} << 40) / static_cast<size_t>(n_rows > 0 ? n_rows : 1))
    bad(fn, "row stride " + std::to_string(row_bytes) + " bytes times " + std::to_string(n_rows) +
                " rows is beyond 2^40 bytes");
  return need;
}

}  // namespace

bool qmm_supported(DType type) {
  switch (type) {
#define BARATA_QMM_CASE(T) case DType::T:
    BARATA_QFMT_TYPES(BARATA_QMM_CASE)
#undef BARATA_QMM_CASE
    return true;
  }
  return false;
}

std::string qmm_variant(DType type, int64_t n_tok) {
  const int t = padded_tokens(n_tok < 1 ? 1 : n_tok);
  return std::string("qmm<") + dtype_name(type) + ", " + std::to_string(rows_for(t)) + " rows x " +
         std::to_string(t) + " tokens>";
}

void launch_qmm(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows, float scale,
                const float* x, int64_t n_tok, float* y, int64_t ldy, cudaStream_t stream) {
  check_rows("qmm", type, row_bytes, k, n_rows);
  if (n_tok < 1 || n_tok > kQmmMaxTokens)
    bad("qmm",
        std::to_string(n_tok) + " activation rows (1.." + std::to_string(kQmmMaxTokens) + ")");
  if (n_tok > 1 && ldy < n_rows)
    bad("qmm", "output stride " + std::to_string(ldy) + " is below the row count " +
                   std::to_string(n_rows));
  if (n_rows == 0) return;
  if (w == nullptr || x == nullptr || y == nullptr) bad("qmm", "null weight, activation or output");
  Args a;
  a.w = static_cast<const unsigned char*>(w);
  a.row_bytes = row_bytes;
  a.k = static_cast<int>(k);
  a.n_rows = static_cast<int>(n_rows);
  a.scale = scale;
  a.x = x;
  a.n_tok = static_cast<int>(n_tok);
  a.x_vec = k % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  a.y = y;
  a.ldy = ldy;
  switch (type) {
#define BARATA_QMM_CASE(T) \
  case DType::T:           \
    return launch_type<DType::T>(a, stream);
    BARATA_QFMT_TYPES(BARATA_QMM_CASE)
#undef BARATA_QMM_CASE
  }
}

void launch_dequant_rows_f16(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows,
                             uint16_t* dst, cudaStream_t stream) {
  check_rows("dequant rows", type, row_bytes, k, n_rows);
  if (n_rows > 65535) bad("dequant rows", std::to_string(n_rows) + " rows in one call (<= 65535)");
  if (n_rows == 0) return;
  if (w == nullptr || dst == nullptr) bad("dequant rows", "null weight or output");
  if ((reinterpret_cast<uintptr_t>(dst) & 1) != 0) bad("dequant rows", "misaligned output");
  const auto* p = static_cast<const unsigned char*>(w);
  const int ki = static_cast<int>(k);
  switch (type) {
#define BARATA_QMM_CASE(T) \
  case DType::T:           \
    return launch_dq<DType::T>(p, row_bytes, ki, n_rows, dst, stream);
    BARATA_QFMT_TYPES(BARATA_QMM_CASE)
#undef BARATA_QMM_CASE
  }
}

}  // namespace barata::cuda
