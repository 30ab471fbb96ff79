#include "rope_kv.cuh"

#include <string>

#include "common.cuh"

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
// coalesced runs.
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

  // The slot in this layer's group (kv.block_tables is the group's).
  const int64_t slot = kv_slot(kv, meta.table, meta.pos);
  uint16_t* kc = kv.pool + kv_offset(kv, slot, 0);
  uint16_t* vc = kv.pool + kv_offset(kv, slot, 1);
  const float* vr = v + r * kv_dim;
  for (int64_t i = threadIdx.x; i < kv_dim; i += kThreads) {
    kc[i] = __half_as_ushort(float_to_half_rn(kr[i]));
    vc[i] = __half_as_ushort(float_to_half_rn(__ldg(vr + i)));
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
      kv.block_elems < 2 * static_cast<int64_t>(kv.layer + 1) * kv.block_tokens * kv.kv_dim)
    throw Error("cuda rope_kv: KV view does not fit the heads (kv_dim " +
                std::to_string(kv.kv_dim) + ", layer " + std::to_string(kv.layer) + ")");
  if (n_rows < 0 || n_rows > 0x7fffffff)
    throw Error("cuda rope_kv: bad row count " + std::to_string(n_rows));
  if (n_rows == 0) return;
  if (a.rope_dims > 0 && (!a.cos || !a.sin)) throw Error("cuda rope_kv: no cos/sin tables");
  BARATA_LAUNCH(rope_kv_kernel, static_cast<unsigned>(n_rows), kThreads, 0, stream, q, k, v, rows,
                a, kv);
  BARATA_CUDA_CHECK_LAUNCH();
}

}  // namespace barata::cuda
