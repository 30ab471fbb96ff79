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
#include "q8_act.cuh"
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

// The type's 16-entry code book into shared memory (NF4, IQ4_NL; a no-op
// for the others), before any thread decodes.
template <typename F>
__device__ __forceinline__ void load_code_book(float* lut) {
  if constexpr (F::kLut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = F::lut_entry(static_cast<int>(threadIdx.x));
    __syncthreads();
  }
}

// acc[r * T + t] of every thread summed across the warp (reduce-scatter)
// and the 4 warps (shared memory, fixed order); y = scale * sum.
template <int R, int T>
__device__ __forceinline__ void reduce_store(float (&acc)[R * T], float* red, unsigned lane,
                                             int warp, int n_here, int n_tok, int row0, float scale,
                                             float* __restrict__ y, int64_t ldy,
                                             const Epilogue& ep) {
  constexpr int kN = R * T;
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
      store_out(y, t * ldy + row0 + r, row0 + r, scale * s, ep);
    }
  }
}

template <DType TY, int R, int T>
__global__ void __launch_bounds__(kThreads)
    qmm_kernel(const unsigned char* __restrict__ w, size_t row_bytes, int k, int n_rows,
               float scale, const float* __restrict__ x, int n_tok, int x_vec,
               float* __restrict__ y, int64_t ldy, Epilogue ep) {
  using F = qdec::QFmt<TY>;
  constexpr int kN = R * T;
  __shared__ float lut[16];
  __shared__ float red[kWarps * kN];
  load_code_book<F>(lut);
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

  reduce_store<R, T>(acc, red, lane, warp, n_here, n_tok, row0, scale, y, ldy, ep);
}

// ---- 8-bit activations ----------------------------------------------------------
// The same CTA layout, with the activations quantized per 32 elements as the
// CPU does (quantize_q8_kernel below): per step a thread decodes its 4 codes
// of each row as int8 (QFmt<T>::decode4_q8), then per token loads one word of
// 4 int8 activations and their block scale and does, per row, one __dp4a and
// one FMA (a second pair for the types with an offset): 4x fewer activation
// bytes and FMAs than the fp32 form.
template <DType TY, int R, int T>
__global__ void __launch_bounds__(kThreads)
    qmm_q8_kernel(const unsigned char* __restrict__ w, size_t row_bytes, int k, int n_rows,
                  float scale, const int* __restrict__ xq, const float* __restrict__ xd, int n_tok,
                  float* __restrict__ y, int64_t ldy, Epilogue ep) {
  using F = qdec::QFmt<TY>;
  constexpr int kN = R * T;
  __shared__ float lut[16];
  __shared__ float red[kWarps * kN];
  load_code_book<F>(lut);
  const unsigned lane = threadIdx.x & 31u;
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int row0 = static_cast<int>(blockIdx.x) * R;
  const int n_here = n_rows - row0 < R ? n_rows - row0 : R;
  const int kw = k / 4, kb = k / 32;

  float acc[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) acc[i] = 0.0f;

  for (int e = 4 * static_cast<int>(threadIdx.x); e < k; e += kStep) {
    uint32_t wq[R];
    float ws[R], wo[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < n_here) {
        F::decode4_q8(w + static_cast<size_t>(row0 + r) * row_bytes, k, e, lut, wq[r], ws[r],
                      wo[r]);
      } else {
        wq[r] = 0;
        ws[r] = wo[r] = 0.0f;
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      if (t < n_tok) {
        const int xv = __ldg(xq + static_cast<size_t>(t) * kw + e / 4);
        const float dx = __ldg(xd + static_cast<size_t>(t) * kb + e / 32);
        int sx = 0;
        if constexpr (F::kOff) sx = __dp4a(xv, 0x01010101, 0);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int d = __dp4a(static_cast<int>(wq[r]), xv, 0);
          acc[r * T + t] = fma_acc(__fmul_rn(ws[r], dx), static_cast<float>(d), acc[r * T + t]);
          if constexpr (F::kOff)
            acc[r * T + t] = fma_acc(__fmul_rn(wo[r], dx), static_cast<float>(sx), acc[r * T + t]);
        }
      }
    }
  }
  reduce_store<R, T>(acc, red, lane, warp, n_here, n_tok, row0, scale, y, ldy, ep);
}

// One warp per 32-element block of one token: amax across the warp (a NaN
// counts as 0), d = amax / 127, q = nearest-even of x / d clamped to +-127 (a
// NaN or Inf gives +-127): the bits of the CPU's quantize_row_q8_act.
constexpr int kQ8Warps = 8;
__global__ void __launch_bounds__(32 * kQ8Warps)
    quantize_q8_kernel(const float* __restrict__ x, int k, signed char* __restrict__ xq,
                       float* __restrict__ xd) {
  const int kb = k / 32;
  const int b = static_cast<int>(blockIdx.x) * kQ8Warps + static_cast<int>(threadIdx.x >> 5);
  if (b >= kb) return;
  const unsigned lane = threadIdx.x & 31u;
  const size_t t = blockIdx.y;
  quantize_block_q8(x[t * k + 32 * b + lane], lane, xq + t * k + 32 * b, xd + t * kb + b);
}

struct Q8Args {
  const unsigned char* w;
  size_t row_bytes;
  int k, n_rows;
  float scale;
  const int* xq;
  const float* xd;
  int n_tok;
  float* y;
  int64_t ldy;
  Epilogue ep;
};

template <DType TY, int R, int T>
void launch_q8_rt(const Q8Args& a, cudaStream_t stream) {
  BARATA_LAUNCH((qmm_q8_kernel<TY, R, T>), dim3(ceil_div(a.n_rows, R)), dim3(kThreads), 0, stream,
                a.w, a.row_bytes, a.k, a.n_rows, a.scale, a.xq, a.xd, a.n_tok, a.y, a.ldy, a.ep);
  BARATA_CUDA_CHECK_LAUNCH();
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
  Epilogue ep;
};

template <DType TY, int R, int T>
void launch_rt(const Args& a, cudaStream_t stream) {
  BARATA_LAUNCH((qmm_kernel<TY, R, T>), dim3(ceil_div(a.n_rows, R)), dim3(kThreads), 0, stream, a.w,
                a.row_bytes, a.k, a.n_rows, a.scale, a.x, a.n_tok, a.x_vec, a.y, a.ldy, a.ep);
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

// Calls f.template operator()<R, T>() with the padded width T of n tokens and
// its rows per CTA R.
template <typename F>
void by_width(int n_tok, F&& f) {
  switch (padded_tokens(n_tok)) {
    case 1:
      return f.template operator()<4, 1>();
    case 2:
      return f.template operator()<4, 2>();
    case 4:
      return f.template operator()<4, 4>();
    case 8:
      return f.template operator()<4, 8>();
    case 16:
      return f.template operator()<4, 16>();
    case 32:
      return f.template operator()<2, 32>();
    default:
      return f.template operator()<1, 64>();
  }
}

template <DType TY>
void launch_type(const Args& a, cudaStream_t stream) {
  by_width(a.n_tok, [&]<int R, int T>() { launch_rt<TY, R, T>(a, stream); });
}

template <DType TY>
void launch_q8_type(const Q8Args& a, cudaStream_t stream) {
  if constexpr (qdec::QFmt<TY>::kQ8)
    by_width(a.n_tok, [&]<int R, int T>() { launch_q8_rt<TY, R, T>(a, stream); });
}

// ---- rows to fp16 -------------------------------------------------------------------
constexpr int kDqThreads = 256;

template <DType TY>
__global__ void __launch_bounds__(kDqThreads)
    dequant_rows_kernel(const unsigned char* __restrict__ w, size_t row_bytes, int k,
                        unsigned short* __restrict__ dst) {
  using F = qdec::QFmt<TY>;
  __shared__ float lut[16];
  load_code_book<F>(lut);
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

// "qmm<Q4_K, 4 rows x 8 tokens>": the kernel a width runs, for bench -v.
std::string variant(const char* name, DType type, int64_t n_tok) {
  const int t = padded_tokens(n_tok < 1 ? 1 : n_tok);
  return std::string(name) + "<" + dtype_name(type) + ", " + std::to_string(rows_for(t)) +
         " rows x " + std::to_string(t) + " tokens>";
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
  return variant("qmm", type, n_tok);
}

void launch_qmm(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows, float scale,
                const float* x, int64_t n_tok, float* y, int64_t ldy, cudaStream_t stream,
                const Epilogue& ep) {
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
  a.ep = ep;
  switch (type) {
#define BARATA_QMM_CASE(T) \
  case DType::T:           \
    return launch_type<DType::T>(a, stream);
    BARATA_QFMT_TYPES(BARATA_QMM_CASE)
#undef BARATA_QMM_CASE
  }
}

bool qmm_q8_supported(DType type) {
  switch (type) {
#define BARATA_QMM_CASE(T) \
  case DType::T:           \
    return qdec::QFmt<DType::T>::kQ8;
    BARATA_QFMT_TYPES(BARATA_QMM_CASE)
#undef BARATA_QMM_CASE
  }
  return false;
}

std::string qmm_q8_variant(DType type, int64_t n_tok) {
  return variant("qmm_q8", type, n_tok);
}

void launch_quantize_q8(const float* x, int64_t n_tok, int64_t k, void* xq, float* xd,
                        cudaStream_t stream) {
  if (k < 32 || k % 32 != 0 || k > (int64_t{1} << 28))
    bad("quantize q8", "row length " + std::to_string(k) + " is not a positive multiple of 32");
  if (n_tok < 0 || n_tok > 65535) bad("quantize q8", std::to_string(n_tok) + " rows (0..65535)");
  if (n_tok == 0) return;
  if (x == nullptr || xq == nullptr || xd == nullptr) bad("quantize q8", "null input or output");
  const dim3 grid(ceil_div(static_cast<int>(k / 32), kQ8Warps), static_cast<unsigned>(n_tok));
  BARATA_LAUNCH(quantize_q8_kernel, grid, dim3(32 * kQ8Warps), 0, stream, x, static_cast<int>(k),
                static_cast<signed char*>(xq), xd);
  BARATA_CUDA_CHECK_LAUNCH();
}

void launch_qmm_q8(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows,
                   float scale, const void* xq, const float* xd, int64_t n_tok, float* y,
                   int64_t ldy, cudaStream_t stream, const Epilogue& ep) {
  check_rows("qmm q8", type, row_bytes, k, n_rows);
  if (!qmm_q8_supported(type))
    bad("qmm q8", std::string("no 8-bit-activation kernel for ") + dtype_name(type) + " weights");
  if (k % 32 != 0)
    bad("qmm q8",
        "row length " + std::to_string(k) + " is not a multiple of 32 (the activations' block)");
  if (n_tok < 1 || n_tok > kQmmMaxTokens)
    bad("qmm q8",
        std::to_string(n_tok) + " activation rows (1.." + std::to_string(kQmmMaxTokens) + ")");
  if (n_tok > 1 && ldy < n_rows)
    bad("qmm q8", "output stride " + std::to_string(ldy) + " is below the row count " +
                      std::to_string(n_rows));
  if (n_rows == 0) return;
  if (w == nullptr || xq == nullptr || xd == nullptr || y == nullptr)
    bad("qmm q8", "null weight, activation or output");
  if ((reinterpret_cast<uintptr_t>(xq) & 3) != 0) bad("qmm q8", "misaligned activations");
  Q8Args a;
  a.w = static_cast<const unsigned char*>(w);
  a.row_bytes = row_bytes;
  a.k = static_cast<int>(k);
  a.n_rows = static_cast<int>(n_rows);
  a.scale = scale;
  a.xq = static_cast<const int*>(xq);
  a.xd = xd;
  a.n_tok = static_cast<int>(n_tok);
  a.y = y;
  a.ldy = ldy;
  a.ep = ep;
  switch (type) {
#define BARATA_QMM_CASE(T) \
  case DType::T:           \
    return launch_q8_type<DType::T>(a, stream);
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
