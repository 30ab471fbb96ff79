// Decode matmul y = scale * W x for 1..8 activation rows, reading W in its
// stored type.
//
// Decode is bound by the bytes of W: each weight is used n_tok times, so the
// kernel's job is to keep enough of W in flight and to spend few instructions
// per byte. The design:
//
// * A CTA owns kRows = 4 consecutive output rows and has 1..4 warps, which
//   split the row length k into segments (warp w takes segments w, w + n_warps,
//   ...); their partial sums meet in shared memory at the end. Long rows thus
//   get 4 warps' worth of loads in flight per row group, short ones one warp
//   (more CTAs per SM instead). The launcher picks n_warps = min(4, segments).
// * Staging: a warp copies the segment of each of its 4 rows, as raw bytes,
//   into its own shared-memory buffer with 16-byte loads of the aligned chunks
//   that cover it (up to 2 per lane and row, all issued before any store):
//   fully coalesced whatever the row's byte alignment, which for 18-, 20- and
//   34-byte blocks is anything. A chunk that would reach outside the matrix's
//   bytes (its first or last chunk, when misaligned) is read byte by byte.
//   Segments are ~1 KB of weights per row (kSteps steps of 128 elements).
// * Compute: in each step lane l takes elements 4l..4l+3 of a 128-element
//   slice, so the activations are read as one coalesced float4 per token (L1
//   serves them to every warp), and those T float4 stay in registers for the
//   4 rows. Per row the lane assembles the words it needs from shared memory
//   (the block scale and one qs word for the 4-bit types; an unaligned word is
//   two loads and a funnel shift) and decodes 4 weights with block_decode.cuh,
//   bit-equal to the reference dequantization, then fp32 FMAs into
//   acc[row][token]. Nothing is quantized on the activation side.
// * Reduction: acc (4 x T values per lane) is reduced across the warp with a
//   reduce-scatter (a halving xor butterfly: 31 shuffles for 32 values
//   instead of 160), so each total ends up in some lane, which writes it (or
//   its share, through shared memory, when several warps split k).
//
// Error: each lane sums its 4 * ceil(k / 128) products in order with FMA, the
// butterfly adds 5 levels, the cross-warp sum <= 3 more and the scale one
// rounding; the weights themselves are exact. So |y - scale * dot| <=
// ~(4 ceil(k/128) + 9) * 2^-24 * |scale| * sum |w_j x_j| (test_emu_gemv.cpp).
#include "gemv.cuh"

#include <cstdint>
#include <string>

#include "barata/quant_blocks.h"
#include "block_decode.cuh"
#include "common.cuh"
#include "device_types.cuh"
#include "warp_reduce.cuh"

namespace barata::cuda {
namespace {

constexpr int kRows = 4;         // output rows per CTA (all warps of a CTA share them)
constexpr int kMaxWarps = 4;     // warps per CTA, splitting k
constexpr int kStepElems = 128;  // one float4 of activations per lane and token
constexpr int kBufChunks = 64;   // 16-byte chunks of one row's staging buffer

__device__ __forceinline__ float fma_acc(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return a * b + c;  // two roundings on the host: still inside the test's bound
#endif
}

// The word at byte offset `off` of a staging buffer. kAligned: off % 4 == 0.
template <bool kAligned>
__device__ __forceinline__ uint32_t read_word(const uint32_t* buf, uint32_t off) {
  if constexpr (kAligned) {
    return buf[off >> 2];
  } else {
    const uint32_t i = off >> 2;
    return funnel_word(buf[i], buf[i + 1], off & 3u);
  }
}

// One format per weight type: block geometry, steps per segment (so that a
// segment plus the misalignment slack fits kBufChunks), and load4: the four
// weights el..el+3 of the staged segment (el % 4 == 0, el counted from the
// segment's start, whose byte lies at `shift` in the buffer). kAligned (only
// where kHasAlignedPath) means shift % 16 == 0, so every offset used is 4-
// (F16/BF16: 8-, F32: 16-) aligned and plain loads do.
struct FmtQ4_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 18, kSteps = 13;
  static constexpr bool kHasAlignedPath = false;  // blocks alternate 2 mod 4
  template <bool kAligned>
  __device__ static void load4(const uint32_t* buf, uint32_t shift, int el, float w[4]) {
    const uint32_t off = shift + kBlockBytes * static_cast<uint32_t>(el >> 5);
    const int c = (el >> 2) & 7;  // quarter-block index: c < 4 low nibbles, else high
    const float d = half_bits_as_float(read_word<false>(buf, off));
    q4_0_decode4(read_word<false>(buf, off + 2 + 4 * (c & 3)), c >= 4, d, w);
  }
};

struct FmtQ4_1 {
  static constexpr int kBlockElems = 32, kBlockBytes = 20, kSteps = 12;
  static constexpr bool kHasAlignedPath = true;
  template <bool kAligned>
  __device__ static void load4(const uint32_t* buf, uint32_t shift, int el, float w[4]) {
    const uint32_t off = shift + kBlockBytes * static_cast<uint32_t>(el >> 5);
    const int c = (el >> 2) & 7;
    const uint32_t dm = read_word<kAligned>(buf, off);
    q4_1_decode4(read_word<kAligned>(buf, off + 4 + 4 * (c & 3)), c >= 4,
                 half_bits_as_float(dm & 0xffffu), half_bits_as_float(dm >> 16), w);
  }
};

struct FmtQ8_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 34, kSteps = 7;
  static constexpr bool kHasAlignedPath = false;
  template <bool kAligned>
  __device__ static void load4(const uint32_t* buf, uint32_t shift, int el, float w[4]) {
    const uint32_t off = shift + kBlockBytes * static_cast<uint32_t>(el >> 5);
    const float d = half_bits_as_float(read_word<false>(buf, off));
    q8_0_decode4(read_word<false>(buf, off + 2 + 4 * ((el >> 2) & 7)), d, w);
  }
};

template <bool kBf16>
struct FmtHalf {
  static constexpr int kBlockElems = 1, kBlockBytes = 2, kSteps = 3;
  static constexpr bool kHasAlignedPath = true;
  template <bool kAligned>
  __device__ static void load4(const uint32_t* buf, uint32_t shift, int el, float w[4]) {
    const uint32_t off = shift + 2u * static_cast<uint32_t>(el);
    uint32_t lo, hi;
    if constexpr (kAligned) {
      const uint2 v = reinterpret_cast<const uint2*>(buf)[off >> 3];
      lo = v.x;
      hi = v.y;
    } else {
      lo = read_word<false>(buf, off);
      hi = read_word<false>(buf, off + 4);
    }
    if constexpr (kBf16) {
      bf16_decode2(lo, w);
      bf16_decode2(hi, w + 2);
    } else {
      f16_decode2(lo, w);
      f16_decode2(hi, w + 2);
    }
  }
};

struct FmtF32 {
  static constexpr int kBlockElems = 1, kBlockBytes = 4, kSteps = 1;
  static constexpr bool kHasAlignedPath = true;
  template <bool kAligned>
  __device__ static void load4(const uint32_t* buf, uint32_t shift, int el, float w[4]) {
    const uint32_t off = shift + 4u * static_cast<uint32_t>(el);
    if constexpr (kAligned) {
      const uint4 v = reinterpret_cast<const uint4*>(buf)[off >> 4];
      w[0] = bits_as_float(v.x);
      w[1] = bits_as_float(v.y);
      w[2] = bits_as_float(v.z);
      w[3] = bits_as_float(v.w);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = bits_as_float(read_word<false>(buf, off + 4 * j));
    }
  }
};

template <class F>
constexpr int seg_elems() {
  return F::kSteps * kStepElems;
}
template <class F>
constexpr int seg_bytes() {
  return seg_elems<F>() / F::kBlockElems * F::kBlockBytes;
}
// Chunks covering a segment at the worst misalignment, plus the zeroed chunk
// after it (read by funnel shifts and the last partial group of a float row).
template <class F>
constexpr bool fits_buffer() {
  return (15 + seg_bytes<F>() + 15) / 16 + 1 <= kBufChunks && seg_elems<F>() % F::kBlockElems == 0;
}
static_assert(fits_buffer<FmtQ4_0>() && fits_buffer<FmtQ4_1>() && fits_buffer<FmtQ8_0>() &&
              fits_buffer<FmtHalf<false>>() && fits_buffer<FmtF32>());

// The bytes of the 16-byte chunk at `a` that lie inside [lo, hi), the rest
// zero: the first and last chunk of a misaligned matrix. A rolled loop, so
// that the hot code stays small (out of line, it cost ~30 registers at T = 1).
__device__ __forceinline__ uint4 load_chunk_edge(uintptr_t a, uintptr_t lo, uintptr_t hi) {
  uint32_t word[4] = {0, 0, 0, 0};
#pragma unroll 1
  for (int i = 0; i < 16; ++i) {
    if (a + i >= lo && a + i < hi) {
      const uint32_t b = *reinterpret_cast<const unsigned char*>(a + i);
      word[i >> 2] |= b << (8 * (i & 3));
    }
  }
  return make_uint4(word[0], word[1], word[2], word[3]);
}

// The 16 bytes at `a` (16-aligned), without reading outside the matrix [lo, hi).
__device__ __forceinline__ uint4 load_chunk(uintptr_t a, uintptr_t lo, uintptr_t hi) {
  if (a >= lo && a + 16 <= hi) return __ldg(reinterpret_cast<const uint4*>(a));
  return load_chunk_edge(a, lo, hi);
}

// ---- the kernel ---------------------------------------------------------------------
// groups non-null: blockIdx.y picks a group (a matrix of the same type and
// shape at its own address, its rows of x and y, at most T of them); w_end
// is then the offset of the end of a matrix's bytes from its start.
template <class F, int T>
__global__ void __launch_bounds__(kMaxWarps * 32)
    gemv_kernel(const unsigned char* __restrict__ w, size_t row_bytes, uintptr_t w_end, int k,
                int n_rows, float scale, const float* __restrict__ x, int x_vec,
                float* __restrict__ y, int64_t ldy, Epilogue ep,
                const GemvGroup* __restrict__ groups) {
  constexpr int kSegElems = seg_elems<F>();
  constexpr int kN = kRows * T;
  BARATA_DYNAMIC_SMEM(uint4, smem);
  int n_tok = T;
  if (groups != nullptr) {
    const GemvGroup g = groups[blockIdx.y];
    w = static_cast<const unsigned char*>(g.w);
    w_end += reinterpret_cast<uintptr_t>(w);
    x += static_cast<int64_t>(g.x_row) * k;
    y += static_cast<int64_t>(g.y_row) * ldy;
    n_tok = g.n_tok;
  }

  const unsigned lane = threadIdx.x & 31u;
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int n_warps = static_cast<int>(blockDim.x >> 5);
  const int row0 = static_cast<int>(blockIdx.x) * kRows;
  const int n_here = n_rows - row0 < kRows ? n_rows - row0 : kRows;
  uint4* const stage = smem + warp * kRows * kBufChunks;
  const uintptr_t w_begin = reinterpret_cast<uintptr_t>(w);

  float acc[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) acc[i] = 0.0f;

  for (int e0 = warp * kSegElems; e0 < k; e0 += n_warps * kSegElems) {
    const int ne = k - e0 < kSegElems ? k - e0 : kSegElems;
    const size_t seg_off = static_cast<size_t>(e0 / F::kBlockElems) * F::kBlockBytes;
    const int seg_len = ne / F::kBlockElems * F::kBlockBytes;

    // Stage: every load first, then the stores.
    uint32_t shift[kRows];
    int n_chunks[kRows];
    uint4 chunk[kRows][2];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      shift[r] = 0;
      n_chunks[r] = 0;
      if (r < n_here) {
        const uintptr_t p = w_begin + static_cast<size_t>(row0 + r) * row_bytes + seg_off;
        const uintptr_t a0 = p & ~static_cast<uintptr_t>(15);
        shift[r] = static_cast<uint32_t>(p - a0);
        n_chunks[r] = static_cast<int>((shift[r] + seg_len + 15) >> 4);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = static_cast<int>(lane) + 32 * h;
          if (c < n_chunks[r]) chunk[r][h] = load_chunk(a0 + 16u * c, w_begin, w_end);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      uint4* buf = stage + r * kBufChunks;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = static_cast<int>(lane) + 32 * h;
        if (c < n_chunks[r]) buf[c] = chunk[r][h];
        if (c == n_chunks[r] && r < n_here) buf[c] = make_uint4(0, 0, 0, 0);
      }
    }
    __syncwarp();

    for (int st = 0; st < F::kSteps; ++st) {
      const int el = st * kStepElems + 4 * static_cast<int>(lane);  // within the segment
      if (el >= ne) break;
      const int e = e0 + el;
      const int n_valid = ne - el;  // < 4 only in the last group of a float row

      float xv[T][4];
      if (x_vec) {
#pragma unroll
        for (int t = 0; t < T; ++t) {
          const float4 v = t < n_tok ? __ldg(reinterpret_cast<const float4*>(x + t * k + e))
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          xv[t][0] = v.x;
          xv[t][1] = v.y;
          xv[t][2] = v.z;
          xv[t][3] = v.w;
        }
      } else {
#pragma unroll
        for (int t = 0; t < T; ++t) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            xv[t][j] = j < n_valid && t < n_tok ? __ldg(x + t * k + e + j) : 0.0f;
        }
      }

#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r >= n_here) continue;
        const uint32_t* buf = reinterpret_cast<const uint32_t*>(stage + r * kBufChunks);
        float wv[4];
        if (F::kHasAlignedPath && (shift[r] & 15u) == 0)
          F::template load4<true>(buf, shift[r], el, wv);
        else
          F::template load4<false>(buf, shift[r], el, wv);
        if constexpr (F::kBlockElems == 1) {
          // Past the row's end the buffer holds the next row's bytes or zeros.
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (j >= n_valid) wv[j] = 0.0f;
        }
#pragma unroll
        for (int t = 0; t < T; ++t) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[r * T + t] = fma_acc(wv[j], xv[t][j], acc[r * T + t]);
        }
      }
    }
    __syncwarp();  // the buffer is rewritten by the next segment
  }

  int base = 0;
  Scatter<kN, 16>::run(acc, lane, base);
  constexpr int kFinal = Scatter<kN, 16>::kFinal;
  const bool writer = (lane & Scatter<kN, 16>::kWholeMask) == 0;

  if (n_warps == 1) {
    if (writer) {
#pragma unroll
      for (int i = 0; i < kFinal; ++i) {
        const int idx = base + i, r = idx / T, t = idx % T;
        if (r < n_here && t < n_tok) store_out(y, t * ldy + row0 + r, row0 + r, scale * acc[i], ep);
      }
    }
    return;
  }
  float* red = reinterpret_cast<float*>(smem + n_warps * kRows * kBufChunks);
  if (writer) {
#pragma unroll
    for (int i = 0; i < kFinal; ++i) red[(base + i) * n_warps + warp] = acc[i];
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < kN) {
    const int idx = static_cast<int>(threadIdx.x), r = idx / T, t = idx % T;
    if (r < n_here && t < n_tok) {
      float s = red[idx * n_warps];
      for (int i = 1; i < n_warps; ++i) s += red[idx * n_warps + i];
      store_out(y, t * ldy + row0 + r, row0 + r, scale * s, ep);
    }
  }
}

struct Args {
  const unsigned char* w;
  size_t row_bytes;
  uintptr_t w_end;
  int k, n_rows;
  float scale;
  const float* x;
  int x_vec;
  float* y;
  int64_t ldy;
  Epilogue ep;
  const GemvGroup* groups = nullptr;
  int n_groups = 1;
};

template <class F, int T>
void launch_t(const Args& a, cudaStream_t stream) {
  const int n_seg = (a.k + seg_elems<F>() - 1) / seg_elems<F>();
  const int n_warps = n_seg < kMaxWarps ? n_seg : kMaxWarps;
  const size_t smem = static_cast<size_t>(n_warps) * kRows * kBufChunks * 16 +
                      static_cast<size_t>(kRows) * T * n_warps * sizeof(float);
  const unsigned grid = ceil_div(a.n_rows, kRows);
  BARATA_LAUNCH((gemv_kernel<F, T>), dim3(grid, static_cast<unsigned>(a.n_groups)),
                dim3(32 * n_warps), smem, stream, a.w, a.row_bytes, a.w_end, a.k, a.n_rows, a.scale,
                a.x, a.x_vec, a.y, a.ldy, a.ep, a.groups);
  BARATA_CUDA_CHECK_LAUNCH();
}

template <class F>
void launch_f(const Args& a, int64_t n_tok, cudaStream_t stream) {
  switch (n_tok) {
    case 1:
      return launch_t<F, 1>(a, stream);
    case 2:
      return launch_t<F, 2>(a, stream);
    case 3:
      return launch_t<F, 3>(a, stream);
    case 4:
      return launch_t<F, 4>(a, stream);
    case 5:
      return launch_t<F, 5>(a, stream);
    case 6:
      return launch_t<F, 6>(a, stream);
    case 7:
      return launch_t<F, 7>(a, stream);
    default:
      return launch_t<F, 8>(a, stream);
  }
}

// The kernel of the weight type (gemv_supported types only).
void launch_type(DType type, const Args& a, int64_t n_tok, cudaStream_t stream) {
  switch (type) {
    case DType::F32:
      return launch_f<FmtF32>(a, n_tok, stream);
    case DType::F16:
      return launch_f<FmtHalf<false>>(a, n_tok, stream);
    case DType::BF16:
      return launch_f<FmtHalf<true>>(a, n_tok, stream);
    case DType::Q8_0:
      return launch_f<FmtQ8_0>(a, n_tok, stream);
    case DType::Q4_0:
      return launch_f<FmtQ4_0>(a, n_tok, stream);
    default:
      return launch_f<FmtQ4_1>(a, n_tok, stream);
  }
}

[[noreturn]] void bad(const std::string& what) {
  throw Error("gemv: " + what);
}

}  // namespace

bool gemv_supported(DType type) {
  return device_reads_type(type);
}

void launch_gemv(DType type, const void* w, size_t row_bytes, int64_t k, int64_t n_rows,
                 float scale, const float* x, int64_t n_tok, float* y, int64_t ldy,
                 cudaStream_t stream, const Epilogue& ep) {
  const DTypeTraits& tr = dtype_traits(type);
  if (!gemv_supported(type)) bad(std::string("no kernel for ") + tr.name + " weights");
  if (n_tok < 1 || n_tok > kGemvMaxTokens)
    bad(std::to_string(n_tok) + " activation rows (1.." + std::to_string(kGemvMaxTokens) + ")");
  // k * n_tok and row indices stay in int; 2^28 is far beyond any model's rows.
  if (k < 1 || k > (int64_t{1} << 28) || k % tr.block_size != 0)
    bad("row length " + std::to_string(k) + " is not a positive whole number of " + tr.name +
        " blocks (at most 2^28 elements)");
  if (n_rows < 0 || n_rows > (int64_t{1} << 30)) bad(std::to_string(n_rows) + " rows (0..2^30)");
  const size_t need = static_cast<size_t>(k / tr.block_size) * tr.bytes_per_block;
  if (row_bytes < need)
    bad("row stride " + std::to_string(row_bytes) + " bytes is below one " + tr.name + " row of " +
        std::to_string(k) + " (" + std::to_string(need) + " bytes)");
  if (row_bytes > (size_t{1} << 40) / static_cast<size_t>(n_rows > 0 ? n_rows : 1))
    bad("row stride " + std::to_string(row_bytes) + " bytes times " + std::to_string(n_rows) +
        " rows is beyond 2^40 bytes");
  if (n_tok > 1 && ldy < n_rows)
    bad("output stride " + std::to_string(ldy) + " is below the row count " +
        std::to_string(n_rows));
  if (n_rows == 0) return;
  if (w == nullptr || x == nullptr || y == nullptr) bad("null weight, activation or output");

  Args a;
  a.w = static_cast<const unsigned char*>(w);
  a.row_bytes = row_bytes;
  a.w_end = reinterpret_cast<uintptr_t>(w) + static_cast<size_t>(n_rows - 1) * row_bytes + need;
  a.k = static_cast<int>(k);
  a.n_rows = static_cast<int>(n_rows);
  a.scale = scale;
  a.x = x;
  a.x_vec = k % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  a.y = y;
  a.ldy = ldy;
  a.ep = ep;
  launch_type(type, a, n_tok, stream);
}

void launch_gemv_grouped(DType type, const GemvGroup* groups, int n_groups, int64_t max_tok,
                         size_t row_bytes, int64_t k, int64_t n_rows, float scale, const float* x,
                         float* y, int64_t ldy, cudaStream_t stream) {
  const DTypeTraits& tr = dtype_traits(type);
  if (!gemv_supported(type)) bad(std::string("no kernel for ") + tr.name + " weights");
  if (max_tok < 1 || max_tok > kGemvMaxTokens)
    bad(std::to_string(max_tok) + " activation rows a group (1.." + std::to_string(kGemvMaxTokens) +
        ")");
  if (n_groups < 0 || n_groups > 65535) bad(std::to_string(n_groups) + " groups (0..65535)");
  if (k < 1 || k > (int64_t{1} << 28) || k % tr.block_size != 0 || n_rows < 1 ||
      n_rows > (int64_t{1} << 30) || ldy < n_rows)
    bad("grouped shape " + std::to_string(n_rows) + " x " + std::to_string(k) + ", ldy " +
        std::to_string(ldy));
  const size_t need = static_cast<size_t>(k / tr.block_size) * tr.bytes_per_block;
  if (row_bytes < need) bad("row stride below one row");
  if (n_groups == 0) return;
  if (groups == nullptr || x == nullptr || y == nullptr) bad("null groups, activation or output");
  Args a;
  a.w = nullptr;
  a.row_bytes = row_bytes;
  a.w_end = static_cast<size_t>(n_rows - 1) * row_bytes + need;  // from each group's matrix
  a.k = static_cast<int>(k);
  a.n_rows = static_cast<int>(n_rows);
  a.scale = scale;
  a.x = x;
  a.x_vec = k % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  a.y = y;
  a.ldy = ldy;
  a.groups = groups;
  a.n_groups = n_groups;
  launch_type(type, a, max_tok, stream);
}

}  // namespace barata::cuda
