#include "dequant.cuh"

#include <cstring>
#include <string>

#include "barata/quant_blocks.h"
#include "common.cuh"
#include "device_types.cuh"

namespace barata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kOutPerThread = 8;  // 8 halves = one 16-byte store
constexpr int kBlockElems = 32;   // every type here
constexpr int kBlocksPerTile = kThreads * kOutPerThread / kBlockElems;  // 64 per CTA
static_assert(kQK8_0 == kBlockElems && kQK4_0 == kBlockElems && kQK4_1 == kBlockElems);

// Elements [8 * part, 8 * part + 8) of one block, in fp32 exactly as the CPU
// reference computes them. __fmul_rn/__fadd_rn keep nvcc from fusing d*q + m
// into an FMA, which the reference (built with -ffp-contract=off) never does.
__device__ __forceinline__ void dequant_part(const BlockQ8_0& b, int part, float* y) {
  const float d = fp16_bits_to_float(b.d);
#pragma unroll
  for (int k = 0; k < 8; ++k) y[k] = __fmul_rn(d, static_cast<float>(b.qs[8 * part + k]));
}

__device__ __forceinline__ void dequant_part(const BlockQ4_0& b, int part, float* y) {
  const float d = fp16_bits_to_float(b.d);
  const int shift = part >= 2 ? 4 : 0;  // parts 2 and 3 are the high nibbles
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int q = (b.qs[(8 * part + k) & 15] >> shift) & 0xf;
    y[k] = __fmul_rn(d, static_cast<float>(q - 8));
  }
}

__device__ __forceinline__ void dequant_part(const BlockQ4_1& b, int part, float* y) {
  const float d = fp16_bits_to_float(b.d);
  const float m = fp16_bits_to_float(b.m);
  const int shift = part >= 2 ? 4 : 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int q = (b.qs[(8 * part + k) & 15] >> shift) & 0xf;
    y[k] = __fadd_rn(__fmul_rn(d, static_cast<float>(q)), m);
  }
}

// One CTA turns 64 blocks into 2048 halves. Blocks are 18, 20 or 34 bytes, so
// a thread cannot load its own block with wide aligned loads; but 64 blocks
// span a multiple of 16 bytes, so the CTA first copies its whole tile into
// shared memory with coalesced 16-byte loads, then each thread dequantizes a
// quarter block from there and writes it back as one 16-byte store, which
// makes every warp's stores a contiguous, fully coalesced 512-byte run.
template <typename Block>
__global__ void __launch_bounds__(kThreads)
    dequant_to_f16_kernel(const unsigned char* __restrict__ src, uint4* __restrict__ dst,
                          int64_t n_blocks) {
  static_assert(kBlocksPerTile * sizeof(Block) % 16 == 0);
  __shared__ __align__(16) unsigned char tile[kBlocksPerTile * sizeof(Block)];

  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBlocksPerTile;
  const int64_t rest = n_blocks - first;
  const int n_here = rest < kBlocksPerTile ? static_cast<int>(rest) : kBlocksPerTile;
  const unsigned char* tile_src = src + first * static_cast<int64_t>(sizeof(Block));
  const int bytes = n_here * static_cast<int>(sizeof(Block));

  // A misaligned source (a tensor at an odd offset) falls back to byte loads.
  int copied = 0;
  if ((reinterpret_cast<uintptr_t>(tile_src) & 15) == 0) {
    const int n_vec = bytes / 16;
    for (int i = threadIdx.x; i < n_vec; i += kThreads)
      reinterpret_cast<uint4*>(tile)[i] = __ldg(reinterpret_cast<const uint4*>(tile_src) + i);
    copied = n_vec * 16;
  }
  for (int i = copied + threadIdx.x; i < bytes; i += kThreads) tile[i] = __ldg(tile_src + i);
  __syncthreads();

  const int b = threadIdx.x / 4;
  if (b >= n_here) return;
  float y[8];
  dequant_part(reinterpret_cast<const Block*>(tile)[b], threadIdx.x % 4, y);

  uint4 out;
  uint32_t* w = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const __half lo = float_to_half_rn(y[2 * k]);
    const __half hi = float_to_half_rn(y[2 * k + 1]);
    w[k] = static_cast<uint32_t>(__half_as_ushort(lo)) |
           (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
  }
  dst[first * 4 + threadIdx.x] = out;
}

// Plain float sources (F32, F16, BF16): each thread turns 8 consecutive
// elements into one 16-byte store; the loads are 16-byte vectors when the
// source allows it, byte-exact scalar loads otherwise, and the last group of
// fewer than 8 elements is stored one half at a time.
enum class FloatSrc { kF32, kF16, kBF16 };

template <FloatSrc S>
__device__ __forceinline__ float load_float(const unsigned char* src, int64_t i) {
  if constexpr (S == FloatSrc::kF32) {
    float v;
    memcpy(&v, src + 4 * i, 4);
    return v;
  } else {
    uint16_t h;
    memcpy(&h, src + 2 * i, 2);
    if constexpr (S == FloatSrc::kF16) return fp16_bits_to_float(h);
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
  }
}

template <FloatSrc S>
__global__ void __launch_bounds__(kThreads)
    float_to_f16_kernel(const unsigned char* __restrict__ src, uint16_t* __restrict__ dst,
                        int64_t n) {
  constexpr int kSrcBytes = S == FloatSrc::kF32 ? 4 : 2;
  const int64_t n_groups = (n + 7) / 8;
  const bool vec_src = (reinterpret_cast<uintptr_t>(src) & 15) == 0;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; g < n_groups;
       g += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t i0 = g * 8;
    if (i0 + 8 > n) {  // the tail
      for (int64_t i = i0; i < n; ++i)
        dst[i] = __half_as_ushort(float_to_half_rn(load_float<S>(src, i)));
      continue;
    }
    uint4 out;
    if constexpr (S == FloatSrc::kF16) {
      if (vec_src) {
        out = __ldg(reinterpret_cast<const uint4*>(src) + g);  // already fp16: a copy
        reinterpret_cast<uint4*>(dst)[g] = out;
        continue;
      }
    }
    float y[8];
    if (vec_src) {
      if constexpr (kSrcBytes == 4) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(src) + 2 * g);
        const float4 b = __ldg(reinterpret_cast<const float4*>(src) + 2 * g + 1);
        y[0] = a.x, y[1] = a.y, y[2] = a.z, y[3] = a.w;
        y[4] = b.x, y[5] = b.y, y[6] = b.z, y[7] = b.w;
      } else {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(src) + g);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          y[2 * k] = __uint_as_float(w[k] << 16);  // bf16: the high half of a float
          y[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) y[k] = load_float<S>(src, i0 + k);
    }
    uint32_t* w = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      w[k] = static_cast<uint32_t>(__half_as_ushort(float_to_half_rn(y[2 * k]))) |
             (static_cast<uint32_t>(__half_as_ushort(float_to_half_rn(y[2 * k + 1]))) << 16);
    reinterpret_cast<uint4*>(dst)[g] = out;
  }
}

template <FloatSrc S>
void launch_float(const void* src, void* dst, int64_t n, cudaStream_t stream) {
  const int64_t groups = (n + 7) / 8;
  const unsigned grid =
      ceil_div(groups < int64_t{kThreads} * 8192 ? groups : int64_t{kThreads} * 8192, kThreads);
  BARATA_LAUNCH(float_to_f16_kernel<S>, grid, kThreads, 0, stream,
                static_cast<const unsigned char*>(src), static_cast<uint16_t*>(dst), n);
  BARATA_CUDA_CHECK_LAUNCH();
}

template <typename Block>
void launch(const void* src, void* dst, int64_t n_blocks, cudaStream_t stream) {
  const unsigned grid = ceil_div(n_blocks, kBlocksPerTile);
  BARATA_LAUNCH(dequant_to_f16_kernel<Block>, grid, kThreads, 0, stream,
                static_cast<const unsigned char*>(src), static_cast<uint4*>(dst), n_blocks);
  BARATA_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool dequant_f16_supported(DType type) {
  return device_reads_type(type);
}

void cuda_dequantize_to_f16(DType type, const void* d_src, void* d_dst_f16, int64_t n,
                            cudaStream_t stream) {
  const DTypeTraits& tr = dtype_traits(type);
  if (n < 0 || n % tr.block_size != 0)
    throw Error("cuda dequantize: " + std::to_string(n) + " elements is not a whole number of " +
                tr.name + " blocks");
  if ((reinterpret_cast<uintptr_t>(d_dst_f16) & 15) != 0)
    throw Error("cuda dequantize: fp16 destination is not 16-byte aligned");
  const int64_t n_blocks = n / tr.block_size;
  if (n_blocks == 0) return;
  switch (type) {
    case DType::F32:
      return launch_float<FloatSrc::kF32>(d_src, d_dst_f16, n, stream);
    case DType::F16:
      return launch_float<FloatSrc::kF16>(d_src, d_dst_f16, n, stream);
    case DType::BF16:
      return launch_float<FloatSrc::kBF16>(d_src, d_dst_f16, n, stream);
    case DType::Q8_0:
      return launch<BlockQ8_0>(d_src, d_dst_f16, n_blocks, stream);
    case DType::Q4_0:
      return launch<BlockQ4_0>(d_src, d_dst_f16, n_blocks, stream);
    case DType::Q4_1:
      return launch<BlockQ4_1>(d_src, d_dst_f16, n_blocks, stream);
    default:
      throw Error(std::string("cuda dequantize: no fp16 kernel for ") + tr.name + " yet");
  }
}

}  // namespace barata::cuda
