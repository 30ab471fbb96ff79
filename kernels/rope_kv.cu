#include "rope_kv.cuh"

#include <string>

#include "common.cuh"
#include "kv_codec.cuh"

namespace barata::cuda {
namespace {

constexpr int kThreads = 128;

// One CTA per batch row. Phase 1: threads over the rotation pairs of every
// q and k head (n_head + n_head_kv heads x rope_dims/2 pairs), in place, with
// the CPU's arithmetic: x0*c - x1*s, x0*s + x1*c, each product rounded on its
// own (__fmul_rn keeps nvcc from contracting them into FMAs, which the
// reference, built with -ffp-contract=off, never does). Phase 2, after the
// barrier that makes this CTA's writes to k visible to all its threads:
// threads over kv_dim store k and v into the row's cache slot as fp16, in
// coalesced runs; a quantized type takes a thread per block of 32 values
// (kv_codec.cuh). An outlier-aware K type first subtracts the keys' offset
// (kv.k_offset) from k, a scaled one divides k's channels by kv.k_scale and
// multiplies q's by it, and a rotated one then rotates every q and k head by the
// Walsh-Hadamard butterflies (stride 1, 2, 4, ... as the CPU's
// hadamard_transform), a barrier between strides, and scales q by 1/head_dim.
__global__ void __launch_bounds__(kThreads)
    rope_kv_kernel(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                   const BatchRowMeta* __restrict__ rows, RopeArgs a, KvDeviceView kv) {
  const int64_t r = blockIdx.x;
  const BatchRowMeta meta = rows[r];
  const int half = a.rope_dims / 2;
  const int64_t q_dim = static_cast<int64_t>(a.n_head) * a.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(a.n_head_kv) * a.head_dim;
  float* qr = q + r * q_dim;
  float* kr = k + r * kv_dim;
  const float* cs = a.cos + static_cast<int64_t>(meta.pos) * half;
  const float* sn = a.sin + static_cast<int64_t>(meta.pos) * half;

  const int64_t n_pairs = static_cast<int64_t>(a.n_head + a.n_head_kv) * half;
  for (int64_t p = threadIdx.x; p < n_pairs; p += kThreads) {
    const int64_t h = p / half;
    const int i = static_cast<int>(p % half);
    float* vec = h < a.n_head ? qr + h * a.head_dim : kr + (h - a.n_head) * a.head_dim;
    const int ia = a.neox ? i : 2 * i, ib = a.neox ? i + half : 2 * i + 1;
    const float x0 = vec[ia], x1 = vec[ib];
    const float c = __ldg(cs + i), s = __ldg(sn + i);
    vec[ia] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    vec[ib] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
  __syncthreads();

  if (kv.k_offset != nullptr) {  // the keys' constant part (kv_types.h)
    for (int64_t i = threadIdx.x; i < kv_dim; i += kThreads)
      kr[i] = __fsub_rn(kr[i], __ldg(kv.k_offset + i));
    __syncthreads();
  }
  if (kv.k_scale != nullptr) {  // k / s and q * s per channel, exact (powers of two)
    const int64_t group_dim = static_cast<int64_t>(a.n_head / a.n_head_kv) * a.head_dim;
    for (int64_t i = threadIdx.x; i < kv_dim; i += kThreads)
      kr[i] = __fdiv_rn(kr[i], __ldg(kv.k_scale + i));
    for (int64_t i = threadIdx.x; i < q_dim; i += kThreads) {
      const int64_t kv_head = i / group_dim, c = i % a.head_dim;
      qr[i] = __fmul_rn(qr[i], __ldg(kv.k_scale + kv_head * a.head_dim + c));
    }
    __syncthreads();
  }
  if (kv.rotate_k) {
    const int hd = a.head_dim;
    const int64_t n_half = static_cast<int64_t>(a.n_head + a.n_head_kv) * (hd / 2);
    for (int h = 1; h < hd; h *= 2) {
      for (int64_t p = threadIdx.x; p < n_half; p += kThreads) {
        const int64_t head = p / (hd / 2);
        const int i = static_cast<int>(p % (hd / 2));
        float* vec = head < a.n_head ? qr + head * hd : kr + (head - a.n_head) * hd;
        const int j = (i / h) * 2 * h + i % h;  // the butterfly (j, j + h)
        const float x0 = vec[j], x1 = vec[j + h];
        vec[j] = __fadd_rn(x0, x1);
        vec[j + h] = __fsub_rn(x0, x1);
      }
      __syncthreads();
    }
    const float inv = 1.0f / static_cast<float>(hd);
    for (int64_t i = threadIdx.x; i < q_dim; i += kThreads) qr[i] = __fmul_rn(qr[i], inv);
    __syncthreads();
  }

  // The slot in this layer's group (kv.block_tables is the group's).
  const int64_t slot = kv_slot(kv, meta.table, meta.pos);
  uint8_t* kc = kv.pool + kv_offset(kv, slot, 0);
  uint8_t* vc = kv.pool + kv_offset(kv, slot, 1);
  const float* vr = v + r * kv_dim;
  if (kv.k_type == KvType::kF16) {
    uint16_t* k16 = reinterpret_cast<uint16_t*>(kc);
    for (int64_t i = threadIdx.x; i < kv_dim; i += kThreads)
      k16[i] = __half_as_ushort(float_to_half_rn(kr[i]));
  } else {
    const int bb = kv_block_bytes(kv.k_type);
    for (int64_t b = threadIdx.x; b < kv_dim / 32; b += kThreads)
      kv_encode_block(kv.k_type, kr + 32 * b, kc + bb * b);
  }
  if (kv.v_type == KvType::kF16) {
    uint16_t* v16 = reinterpret_cast<uint16_t*>(vc);
    for (int64_t i = threadIdx.x; i < kv_dim; i += kThreads)
      v16[i] = __half_as_ushort(float_to_half_rn(__ldg(vr + i)));
  } else {
    const int bb = kv_block_bytes(kv.v_type);
    for (int64_t b = threadIdx.x; b < kv_dim / 32; b += kThreads)
      kv_encode_block(kv.v_type, vr + 32 * b, vc + bb * b);
  }
}

}  // namespace

void launch_rope_kv(float* q, float* k, const float* v, const BatchRowMeta* rows, int64_t n_rows,
                    const RopeArgs& rope, const KvDeviceView& kv, cudaStream_t stream) {
  const RopeArgs& a = rope;
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.head_dim <= 0 || a.rope_dims < 0 ||
      a.rope_dims % 2 != 0 || a.rope_dims > a.head_dim)
    throw Error("cuda rope_kv: bad heads " + std::to_string(a.n_head) + "/" +
                std::to_string(a.n_head_kv) + " x " + std::to_string(a.head_dim) + ", rope dims " +
                std::to_string(a.rope_dims));
  if (kv.kv_dim != a.n_head_kv * a.head_dim || kv.block_tokens <= 0 || kv.layer < 0 ||
      kv.k_row <= 0 || kv.v_row <= 0 ||
      kv.block_bytes < static_cast<int64_t>(kv.layer + 1) * kv.block_tokens * (kv.k_row + kv.v_row))
    throw Error("cuda rope_kv: KV view does not fit the heads (kv_dim " +
                std::to_string(kv.kv_dim) + ", layer " + std::to_string(kv.layer) + ")");
  if (n_rows < 0 || n_rows > 0x7fffffff)
    throw Error("cuda rope_kv: bad row count " + std::to_string(n_rows));
  if (n_rows == 0) return;
  if (a.rope_dims > 0 && (!a.cos || !a.sin)) throw Error("cuda rope_kv: no cos/sin tables");
  if ((kv.k_type != KvType::kF16 || kv.v_type != KvType::kF16) && a.head_dim % 32 != 0)
    throw Error("cuda rope_kv: a quantized cache needs head_dim a multiple of 32, not " +
                std::to_string(a.head_dim));
  if (kv.rotate_k && (a.head_dim & (a.head_dim - 1)) != 0)
    throw Error("cuda rope_kv: a rotated K needs a power-of-two head_dim, not " +
                std::to_string(a.head_dim));
  BARATA_LAUNCH(rope_kv_kernel, static_cast<unsigned>(n_rows), kThreads, 0, stream, q, k, v, rows,
                a, kv);
  BARATA_CUDA_CHECK_LAUNCH();
}

}  // namespace barata::cuda
