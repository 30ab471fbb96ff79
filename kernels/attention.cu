// Paged attention: scalar fp32 arithmetic on fp16 K/V tiles in shared memory.
//
// Both kernels are built from one piece, attend_tile: a warp owns one "item"
// (one query row of one query head) and folds a tile of 16 keys into the
// item's online-softmax state (m, l, acc). Within the warp, lane (j, h) with
// j = lane % 16 and h = lane / 16 computes the dot product of key j with the
// query over the dimensions of parity h; one shuffle adds the two halves, four
// more give the tile's max and sum. For P.V, lane owns dimensions lane + 32c
// and takes the 16 probabilities from lanes 0..15 by shuffle.
//
// A CTA holds the queries of up to kWarps * kIpw items in shared memory, all
// of one KV head, and loops over key tiles: the K and V tile (16 tokens x
// head_dim, found through the block table, widened to fp32) is loaded once per
// CTA and used by every item, so the query heads of a GQA group and the rows
// of a prefill tile share it.
//
// Prefill: grid (tiles, n_head_kv, chunks), where a chunk is up to kWarps*kIpw
// (head in group, row in tile) items of one tile; the CTA reads keys up to the
// largest position among its items, and each item skips tiles past its own
// position and masks keys past it inside the last one.
//
// Decode: grid (rows * n_head_kv * chunks, n_splits), a chunk being the query
// heads of the group the CTA computes. A CTA reads keys [split * split_tokens,
// min((split + 1) * split_tokens, pos + 1)) and writes its unnormalised
// (m, l, acc) partial to the workspace, then attention_merge_kernel combines
// the partials of each (row, head). With one split the decode CTA writes the
// normalised output itself and needs no workspace.
#include "attention.cuh"

#include <cmath>
#include <cstdint>
#include <string>

#include "common.cuh"
#include "kv_codec.cuh"
#include "softmax_merge.cuh"

namespace barata::cuda {
namespace {

constexpr int kKeyTile = 16;  // keys per shared-memory tile (half a warp)
constexpr int kWarps = 8;     // most warps per CTA
constexpr unsigned kFullMask = 0xffffffffu;

// Items per warp, by the head-dim class: the accumulators (kMaxHd / 32 per
// item and lane) stay in registers, and the queries of kWarps * kIpw items fit
// in shared memory with the K/V tiles (sizes in the static_asserts below).
template <int kMaxHd>
struct TileCfg;
template <>
struct TileCfg<64> {
  static constexpr int kIpw = 8;
};
template <>
struct TileCfg<128> {
  static constexpr int kIpw = 4;
};
template <>
struct TileCfg<256> {
  static constexpr int kIpw = 1;
};

template <int kMaxHd>
struct Smem {
  // Row stride of the K/V tiles in floats: = 2 (mod 32), so the 32 lanes
  // reading K[lane % 16][2i + lane / 16] hit 32 different banks.
  static constexpr int kStride = kMaxHd + 2;
  static constexpr int kItems = kWarps * TileCfg<kMaxHd>::kIpw;
  float q[kItems * kMaxHd];
  float k[kKeyTile * kStride];
  float v[kKeyTile * kStride];
  int64_t tok[kKeyTile];   // pool byte offset of each tile token's K (head included); -1: none
  int64_t tokv[kKeyTile];  // and of its V
};
static_assert(sizeof(Smem<64>) <= 48 * 1024);
static_assert(sizeof(Smem<128>) <= 48 * 1024);
static_assert(sizeof(Smem<256>) <= 48 * 1024);

// The state of one item: running max, running sum, and this lane's share of
// the unnormalised output (dimensions lane + 32c).
template <int kMaxHd>
struct ItemState {
  float m, l;
  float acc[kMaxHd / 32];
};

// Loads the K and V tile of positions [b0, b0 + 16) of KV head kvh, zeros past
// `last`. Called by the whole CTA after the previous tile was consumed. An
// fp16 cache is read in 16-byte (or 4-byte) words; a quantized one a group
// of 8 values per thread, decoded with kv_codec.cuh (the CPU's values).
template <int kMaxHd>
__device__ __forceinline__ void load_kv_tile(Smem<kMaxHd>& sm, const KvDeviceView& kv,
                                             int32_t table, int kvh, int hd, int b0, int last) {
  constexpr int kStride = Smem<kMaxHd>::kStride;
  if (threadIdx.x < kKeyTile) {
    const int p = b0 + static_cast<int>(threadIdx.x);
    const int64_t slot = p <= last ? kv_slot(kv, table, p) : -1;
    // The head's bytes: hd values of the row's type.
    sm.tok[threadIdx.x] = slot >= 0 ? kv_offset(kv, slot, 0) +
                                          static_cast<int64_t>(kvh) * kv_head_bytes(kv.k_type, hd)
                                    : -1;
    sm.tokv[threadIdx.x] = slot >= 0 ? kv_offset(kv, slot, 1) +
                                           static_cast<int64_t>(kvh) * kv_head_bytes(kv.v_type, hd)
                                     : -1;
  }
  __syncthreads();
  const uint8_t* pool = kv.pool;
  if (kv.k_type != KvType::kF16 || kv.v_type != KvType::kF16) {
    const int units = hd / 8;
    for (int i = threadIdx.x; i < 2 * kKeyTile * units; i += blockDim.x) {
      const int is_v = i >= kKeyTile * units;
      const int r = i - is_v * kKeyTile * units;
      const int t = r / units, u = r - t * units;
      const int64_t off = is_v ? sm.tokv[t] : sm.tok[t];
      float* dst = (is_v ? sm.v : sm.k) + t * kStride + 8 * u;
      if (off < 0) {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = 0.0f;
        continue;
      }
      kv_decode8(is_v ? kv.v_type : kv.k_type, pool + off, 8 * u, dst);
    }
  } else if (hd % 8 == 0 && (reinterpret_cast<uintptr_t>(pool) & 15) == 0) {
    // 16-byte loads: every offset is a multiple of 16 bytes when hd is of 8 halves.
    const int units = hd / 8;
    for (int i = threadIdx.x; i < kKeyTile * units; i += blockDim.x) {
      const int t = i / units, u = i - t * units;
      const int64_t off = sm.tok[t], offv = sm.tokv[t];
      float* kd = sm.k + t * kStride + 8 * u;
      float* vd = sm.v + t * kStride + 8 * u;
      if (off < 0) {
#pragma unroll
        for (int e = 0; e < 8; ++e) kd[e] = vd[e] = 0.0f;
        continue;
      }
      const uint4 kw = *reinterpret_cast<const uint4*>(pool + off + 16 * u);
      const uint4 vw = *reinterpret_cast<const uint4*>(pool + offv + 16 * u);
      const uint32_t kk[4] = {kw.x, kw.y, kw.z, kw.w};
      const uint32_t vv[4] = {vw.x, vw.y, vw.z, vw.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        kd[2 * e] = fp16_bits_to_float(static_cast<uint16_t>(kk[e] & 0xffffu));
        kd[2 * e + 1] = fp16_bits_to_float(static_cast<uint16_t>(kk[e] >> 16));
        vd[2 * e] = fp16_bits_to_float(static_cast<uint16_t>(vv[e] & 0xffffu));
        vd[2 * e + 1] = fp16_bits_to_float(static_cast<uint16_t>(vv[e] >> 16));
      }
    }
  } else {
    // 4-byte loads: hd is even, and so is every offset in halves.
    const int units = hd / 2;
    for (int i = threadIdx.x; i < kKeyTile * units; i += blockDim.x) {
      const int t = i / units, u = i - t * units;
      const int64_t off = sm.tok[t], offv = sm.tokv[t];
      float* kd = sm.k + t * kStride + 2 * u;
      float* vd = sm.v + t * kStride + 2 * u;
      if (off < 0) {
        kd[0] = kd[1] = vd[0] = vd[1] = 0.0f;
        continue;
      }
      const uint32_t kw = *reinterpret_cast<const uint32_t*>(pool + off + 4 * u);
      const uint32_t vw = *reinterpret_cast<const uint32_t*>(pool + offv + 4 * u);
      kd[0] = fp16_bits_to_float(static_cast<uint16_t>(kw & 0xffffu));
      kd[1] = fp16_bits_to_float(static_cast<uint16_t>(kw >> 16));
      vd[0] = fp16_bits_to_float(static_cast<uint16_t>(vw & 0xffffu));
      vd[1] = fp16_bits_to_float(static_cast<uint16_t>(vw >> 16));
    }
  }
  __syncthreads();
}

// Folds the keys first <= b0 + j <= last of the tile in shared memory into
// one item's state; qs is the item's query. Called by all 32 lanes of the
// warp, for a tile holding at least one such key (so the new max is finite).
template <int kMaxHd>
__device__ __forceinline__ void attend_tile(const float* qs, const Smem<kMaxHd>& sm, int hd,
                                            float scale, int b0, int first, int last, int lane,
                                            ItemState<kMaxHd>& st) {
  constexpr int kStride = Smem<kMaxHd>::kStride;
  constexpr int kPer = kMaxHd / 32;
  const int j = lane & 15, par = lane >> 4;
  const float* kj = sm.k + j * kStride;
  float s0 = 0.0f, s1 = 0.0f;
  int i = par;
  for (; i + 2 < hd; i += 4) {
    s0 += qs[i] * kj[i];
    s1 += qs[i + 2] * kj[i + 2];
  }
  if (i < hd) s0 += qs[i] * kj[i];
  float s = s0 + s1;
  s += __shfl_xor_sync(kFullMask, s, 16);
  s = b0 + j <= last && b0 + j >= first ? s * scale : -INFINITY;

  // Lanes j and j + 16 hold the same score: reduce within each half.
  float mt = s;
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(kFullMask, mt, off));
  const float m_new = fmaxf(st.m, mt);
  const float alpha = softmax_rescale(st.m, m_new);
  const float p = expf(s - m_new);  // 0 for a masked key
  float ps = p;
#pragma unroll
  for (int off = 8; off > 0; off >>= 1) ps += __shfl_xor_sync(kFullMask, ps, off);
  st.m = m_new;
  st.l = st.l * alpha + ps;

#pragma unroll
  for (int c = 0; c < kPer; ++c) st.acc[c] *= alpha;
#pragma unroll 4
  for (int t = 0; t < kKeyTile; ++t) {
    const float pt = __shfl_sync(kFullMask, p, t);
    const float* vt = sm.v + t * kStride + lane;
#pragma unroll
    for (int c = 0; c < kPer; ++c) st.acc[c] += pt * vt[32 * c];  // zeros past hd
  }
}

// Zeroes the K/V tiles once, so that the dimensions in [hd, kMaxHd) that the
// loader never writes read as 0 in attend_tile's P.V loop.
template <int kMaxHd>
__device__ __forceinline__ void zero_kv_tiles(Smem<kMaxHd>& sm) {
  for (int i = threadIdx.x; i < kKeyTile * Smem<kMaxHd>::kStride; i += blockDim.x)
    sm.k[i] = sm.v[i] = 0.0f;
}

// Int keys (kv_types.h, kv_int_keys: q8_0, q4_0, iq4_nl): the CPU's
// attention meets them with the query rounded to 8 bits per block of 32
// (kv_quantize_query), so the device rounds its queries in shared memory the
// same way, to d * code, and its float dot then computes the same scores up
// to the order of the sums. One warp per block of 32, a value per lane;
// items [0, n_items) of the CTA, the others never read.
template <int kMaxHd>
__device__ __forceinline__ void round_queries(Smem<kMaxHd>& sm, int n_items, int hd) {
  __syncthreads();
  const int n_warps = static_cast<int>(blockDim.x) / 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int nb = hd / 32;
  for (int w = warp; w < n_items * nb; w += n_warps) {
    float* x = sm.q + (w / nb) * kMaxHd + 32 * (w % nb);
    const float v = x[lane];
    float amax = fabsf(v);
    int finite = isfinite(v) ? 1 : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      finite &= __shfl_xor_sync(0xffffffffu, finite, o);
    }
    const float id = finite && amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const float d = finite ? __fdiv_rn(amax, 127.0f) : NAN;
    const float code = finite ? rintf(__fmul_rn(v, id)) : 0.0f;
    x[lane] = __fmul_rn(d, code);
  }
  __syncthreads();
}

template <int kMaxHd>
__global__ void __launch_bounds__(kWarps * 32)
    attention_prefill_kernel(const float* __restrict__ q, float* __restrict__ out,
                             const BatchRowMeta* __restrict__ rows,
                             const PrefillTile* __restrict__ tiles, AttnArgs a, KvDeviceView kv) {
  constexpr int kIpw = TileCfg<kMaxHd>::kIpw;
  constexpr int kPer = kMaxHd / 32;
  __shared__ Smem<kMaxHd> sm;

  const PrefillTile tile = tiles[blockIdx.x];
  const int kvh = static_cast<int>(blockIdx.y);
  const int group = a.n_head / a.n_head_kv, hd = a.head_dim;
  const int64_t q_dim = static_cast<int64_t>(a.n_head) * hd;
  const int n_warps = static_cast<int>(blockDim.x) / 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int per_cta = n_warps * kIpw;
  const int n_items = tile.n_rows * group;  // item g: head g / n_rows of the group, row g % n_rows
  const int g0 = static_cast<int>(blockIdx.z) * per_cta;
  if (g0 >= n_items) return;  // the whole CTA: a short tile needs fewer chunks

  for (int i = threadIdx.x; i < per_cta * hd; i += blockDim.x) {
    const int it = i / hd, d = i - it * hd, g = g0 + it;
    if (g >= n_items) continue;
    const int64_t row = tile.row0 + g % tile.n_rows;
    const int h = kvh * group + g / tile.n_rows;
    sm.q[it * kMaxHd + d] = q[row * q_dim + static_cast<int64_t>(h) * hd + d];
  }
  if (kv_int_keys(kv.k_type))
    round_queries(sm, n_items - g0 < per_cta ? n_items - g0 : per_cta, hd);
  zero_kv_tiles(sm);

  int last = -1;            // the largest position among the CTA's items
  int lowest = 0x7fffffff;  // and the smallest
  for (int g = g0; g < g0 + per_cta && g < n_items; ++g) {
    const int pg = rows[tile.row0 + g % tile.n_rows].pos;
    last = pg > last ? pg : last;
    lowest = pg < lowest ? pg : lowest;
  }
  // The first key any item sees (windowed: the lowest item's window start).
  const int b_first =
      a.window > 0 && lowest - a.window + 1 > 0 ? (lowest - a.window + 1) / kKeyTile * kKeyTile : 0;

  int pos[kIpw];
  ItemState<kMaxHd> st[kIpw];
#pragma unroll
  for (int k = 0; k < kIpw; ++k) {
    const int g = g0 + warp + k * n_warps;
    pos[k] = g < n_items ? rows[tile.row0 + g % tile.n_rows].pos : -1;
    st[k].m = -INFINITY;
    st[k].l = 0.0f;
#pragma unroll
    for (int c = 0; c < kPer; ++c) st[k].acc[c] = 0.0f;
  }

  int first[kIpw];  // each item's first key
#pragma unroll
  for (int k = 0; k < kIpw; ++k)
    first[k] = a.window > 0 && pos[k] - a.window + 1 > 0 ? pos[k] - a.window + 1 : 0;

  const int32_t table = rows[tile.row0].table;
  for (int b0 = b_first; b0 <= last; b0 += kKeyTile) {
    __syncthreads();  // the previous tile is consumed (the first time: q is loaded)
    load_kv_tile(sm, kv, table, kvh, hd, b0, last);
#pragma unroll
    for (int k = 0; k < kIpw; ++k)
      if (pos[k] >= b0 && b0 + kKeyTile - 1 >= first[k])
        attend_tile(sm.q + (warp + k * n_warps) * kMaxHd, sm, hd, a.scale, b0, first[k], pos[k],
                    lane, st[k]);
  }

#pragma unroll
  for (int k = 0; k < kIpw; ++k) {
    if (pos[k] < 0) continue;
    const int g = g0 + warp + k * n_warps;
    const int64_t row = tile.row0 + g % tile.n_rows;
    const int h = kvh * group + g / tile.n_rows;
    float* o = out + row * q_dim + static_cast<int64_t>(h) * hd;
    const float inv = 1.0f / st[k].l;
#pragma unroll
    for (int c = 0; c < kPer; ++c) {
      const int d = lane + 32 * c;
      if (d < hd) o[d] = st[k].acc[c] * inv;
    }
  }
}

// Partial results: acc of (row, head, split) at part_acc[((row * n_head + head)
// * n_splits + split) * hd], its (m, l) at part_ml[2 * (same index)].
template <int kMaxHd>
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_kernel(const float* __restrict__ q, float* __restrict__ out,
                            const BatchRowMeta* __restrict__ rows, AttnArgs a, KvDeviceView kv,
                            DecodeSplit s, int n_chunks, float* __restrict__ part_acc,
                            float* __restrict__ part_ml) {
  constexpr int kIpw = TileCfg<kMaxHd>::kIpw;
  constexpr int kPer = kMaxHd / 32;
  __shared__ Smem<kMaxHd> sm;

  // 32-bit index arithmetic: the launcher keeps grid.x below 2^31.
  const unsigned bx = blockIdx.x, rk = bx / static_cast<unsigned>(n_chunks);
  const int chunk = static_cast<int>(bx - rk * static_cast<unsigned>(n_chunks));
  const unsigned ukvh = static_cast<unsigned>(a.n_head_kv);
  const int kvh = static_cast<int>(rk % ukvh);
  const int64_t row = rk / ukvh;
  const int split = static_cast<int>(blockIdx.y);
  const int group = a.n_head / a.n_head_kv, hd = a.head_dim;
  const int64_t q_dim = static_cast<int64_t>(a.n_head) * hd;
  const int n_warps = static_cast<int>(blockDim.x) / 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int per_cta = n_warps * kIpw;
  const int hl0 = chunk * per_cta;  // first head (in the group) of this CTA
  if (hl0 >= group) return;

  const BatchRowMeta meta = rows[row];
  // Keys [k0, k1), empty when k1 <= k0. The last split also takes any keys
  // past n_splits * split_tokens, so a too-short split plan is slow, not wrong.
  // A windowed row starts at its window (the splits before it do nothing).
  const int first = a.window > 0 && meta.pos - a.window + 1 > 0 ? meta.pos - a.window + 1 : 0;
  const int k_split = split * s.split_tokens;
  const int k0 = k_split > first / kKeyTile * kKeyTile ? k_split : first / kKeyTile * kKeyTile;
  const int k_end = split == s.n_splits - 1 ? meta.pos + 1 : k_split + s.split_tokens;
  const int k1 = k_end < meta.pos + 1 ? k_end : meta.pos + 1;

  const float* qrow = q + row * q_dim + static_cast<int64_t>(kvh * group + hl0) * hd;
  for (int i = threadIdx.x; i < per_cta * hd; i += blockDim.x) {
    const int it = i / hd;
    if (hl0 + it < group) sm.q[it * kMaxHd + (i - it * hd)] = qrow[i];
  }
  if (kv_int_keys(kv.k_type)) round_queries(sm, group - hl0 < per_cta ? group - hl0 : per_cta, hd);
  zero_kv_tiles(sm);

  bool active[kIpw];
  ItemState<kMaxHd> st[kIpw];
#pragma unroll
  for (int k = 0; k < kIpw; ++k) {
    active[k] = hl0 + warp + k * n_warps < group;
    st[k].m = -INFINITY;
    st[k].l = 0.0f;
#pragma unroll
    for (int c = 0; c < kPer; ++c) st[k].acc[c] = 0.0f;
  }

  for (int b0 = k0; b0 < k1; b0 += kKeyTile) {
    __syncthreads();
    load_kv_tile(sm, kv, meta.table, kvh, hd, b0, k1 - 1);
#pragma unroll
    for (int k = 0; k < kIpw; ++k)
      if (active[k])
        attend_tile(sm.q + (warp + k * n_warps) * kMaxHd, sm, hd, a.scale, b0, first, k1 - 1, lane,
                    st[k]);
  }

  const bool direct = s.n_splits == 1;
#pragma unroll
  for (int k = 0; k < kIpw; ++k) {
    if (!active[k]) continue;
    const int h = kvh * group + hl0 + warp + k * n_warps;
    if (direct) {
      float* o = out + row * q_dim + static_cast<int64_t>(h) * hd;
      const float inv = 1.0f / st[k].l;
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        const int d = lane + 32 * c;
        if (d < hd) o[d] = st[k].acc[c] * inv;
      }
    } else {
      const int64_t p = (row * a.n_head + h) * s.n_splits + split;
      float* pa = part_acc + p * hd;
#pragma unroll
      for (int c = 0; c < kPer; ++c) {
        const int d = lane + 32 * c;
        if (d < hd) pa[d] = st[k].acc[c];
      }
      if (lane == 0) {
        part_ml[2 * p] = st[k].m;
        part_ml[2 * p + 1] = st[k].l;
      }
    }
  }
}

// One CTA per (row, head), one thread per dimension: merges the n_splits
// partials in split order and writes acc / l.
__global__ void __launch_bounds__(256)
    attention_merge_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                           float* __restrict__ out, int hd, int n_splits) {
  const int64_t rh = blockIdx.x;  // row * n_head + head
  const int d = static_cast<int>(threadIdx.x);
  if (d >= hd) return;
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
  for (int sp = 0; sp < n_splits; ++sp) {
    const int64_t p = rh * n_splits + sp;
    softmax_merge(m, l, &acc, part_ml[2 * p], part_ml[2 * p + 1], part_acc + p * hd + d, 1);
  }
  out[rh * hd + d] = acc / l;
}

void check_args(const char* what, const AttnArgs& a, const KvDeviceView& kv) {
  const std::string w(what);
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    throw Error(w + ": n_head " + std::to_string(a.n_head) + " is not a multiple of n_head_kv " +
                std::to_string(a.n_head_kv));
  if (a.head_dim <= 0 || a.head_dim % 2 != 0 || a.head_dim > 256)
    throw Error(w + ": head_dim " + std::to_string(a.head_dim) +
                " is not supported (even, at most 256)");
  if (kv.kv_dim != a.n_head_kv * a.head_dim)
    throw Error(w + ": KV view kv_dim " + std::to_string(kv.kv_dim) +
                " is not n_head_kv * head_dim");
  if (kv.block_tokens <= 0) throw Error(w + ": KV view has no block size");
  if ((kv.k_type != KvType::kF16 || kv.v_type != KvType::kF16) && a.head_dim % 32 != 0)
    throw Error(w + ": a quantized KV cache needs head_dim a multiple of 32, not " +
                std::to_string(a.head_dim));
  if (kv.k_row != kv_row_bytes(kv.k_type, kv.kv_dim) ||
      kv.v_row != kv_row_bytes(kv.v_type, kv.kv_dim))
    throw Error(w + ": KV view row sizes do not match its types");
}

int hd_class(int hd) {
  return hd <= 64 ? 64 : hd <= 128 ? 128 : 256;
}

template <int kMaxHd>
void prefill(const float* q, float* out, const BatchRowMeta* rows, const PrefillTile* tiles,
             int64_t n_tiles, const AttnArgs& a, const KvDeviceView& kv, cudaStream_t stream) {
  constexpr int kIpw = TileCfg<kMaxHd>::kIpw;
  const int group = a.n_head / a.n_head_kv;
  const int max_items = kPrefillTileRows * group;
  const int n_warps = max_items < kWarps ? max_items : kWarps;
  const int n_chunks = static_cast<int>(ceil_div(max_items, n_warps * kIpw));
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(a.n_head_kv),
                  static_cast<unsigned>(n_chunks));
  BARATA_LAUNCH(attention_prefill_kernel<kMaxHd>, grid, dim3(n_warps * 32), 0, stream, q, out, rows,
                tiles, a, kv);
  BARATA_CUDA_CHECK_LAUNCH();
}

template <int kMaxHd>
void decode(const float* q, float* out, const BatchRowMeta* rows, int64_t n_rows, const AttnArgs& a,
            const KvDeviceView& kv, const DecodeSplit& s, float* workspace, cudaStream_t stream) {
  constexpr int kIpw = TileCfg<kMaxHd>::kIpw;
  const int group = a.n_head / a.n_head_kv;
  // At least 4 warps, so that a lone head still loads its tiles quickly.
  const int n_warps = group < 4 ? 4 : group < kWarps ? group : kWarps;
  const int n_chunks = static_cast<int>(ceil_div(group, n_warps * kIpw));
  const int64_t n_x = n_rows * a.n_head_kv * n_chunks;
  if (n_x > 0x7fffffff) throw Error("attention decode: too many rows for one launch");
  float* part_acc = workspace;
  float* part_ml = workspace ? workspace + n_rows * a.n_head * s.n_splits * a.head_dim : nullptr;
  const dim3 grid(static_cast<unsigned>(n_x), static_cast<unsigned>(s.n_splits));
  BARATA_LAUNCH(attention_decode_kernel<kMaxHd>, grid, dim3(n_warps * 32), 0, stream, q, out, rows,
                a, kv, s, n_chunks, part_acc, part_ml);
  BARATA_CUDA_CHECK_LAUNCH();
  if (s.n_splits > 1) {
    const int threads = (a.head_dim + 31) / 32 * 32;
    BARATA_LAUNCH(attention_merge_kernel, dim3(static_cast<unsigned>(n_rows * a.n_head)),
                  dim3(threads), 0, stream, part_acc, part_ml, out, a.head_dim, s.n_splits);
    BARATA_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void launch_attention_prefill(const float* q, float* out, const BatchRowMeta* rows,
                              const PrefillTile* tiles, int64_t n_tiles, const AttnArgs& a,
                              const KvDeviceView& kv, cudaStream_t stream) {
  check_args("attention prefill", a, kv);
  if (n_tiles <= 0) return;
  if (n_tiles > 0x7fffffff) throw Error("attention prefill: too many tiles for one launch");
  switch (hd_class(a.head_dim)) {
    case 64:
      return prefill<64>(q, out, rows, tiles, n_tiles, a, kv, stream);
    case 128:
      return prefill<128>(q, out, rows, tiles, n_tiles, a, kv, stream);
    default:
      return prefill<256>(q, out, rows, tiles, n_tiles, a, kv, stream);
  }
}

size_t attention_decode_workspace(int64_t n_rows, const AttnArgs& a, const DecodeSplit& s) {
  if (s.n_splits <= 1 || n_rows <= 0) return 0;  // one split writes the output directly
  return static_cast<size_t>(n_rows) * static_cast<size_t>(a.n_head) *
         static_cast<size_t>(s.n_splits) * (static_cast<size_t>(a.head_dim) + 2);
}

void launch_attention_decode(const float* q, float* out, const BatchRowMeta* rows, int64_t n_rows,
                             const AttnArgs& a, const KvDeviceView& kv, const DecodeSplit& s,
                             float* workspace, cudaStream_t stream) {
  check_args("attention decode", a, kv);
  if (s.n_splits < 1 || s.n_splits > 65535 || s.split_tokens <= 0)
    throw Error("attention decode: bad split (" + std::to_string(s.n_splits) + " splits of " +
                std::to_string(s.split_tokens) + " tokens)");
  if (n_rows <= 0) return;
  if (s.n_splits > 1 && workspace == nullptr)
    throw Error("attention decode: " + std::to_string(s.n_splits) + " splits need a workspace");
  switch (hd_class(a.head_dim)) {
    case 64:
      return decode<64>(q, out, rows, n_rows, a, kv, s, workspace, stream);
    case 128:
      return decode<128>(q, out, rows, n_rows, a, kv, s, workspace, stream);
    default:
      return decode<256>(q, out, rows, n_rows, a, kv, s, workspace, stream);
  }
}

}  // namespace barata::cuda
