// RoPE on q and k, then K and V stored into their cache slots as fp16.
#pragma once

#include <cstdint>

#include "cuda_types.cuh"
#include "kv_view.cuh"

namespace barata::cuda {

struct RopeArgs {
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
  int32_t rope_dims = 0;       // rotated dimensions of each head (even, <= head_dim)
  bool neox = false;           // NeoX pairs (i, i + rope_dims/2); normal pairs (2i, 2i+1)
  const float* cos = nullptr;  // device tables [position][rope_dims / 2]
  const float* sin = nullptr;
};

// For each of n_rows rows (rows[i].pos, rows[i].table): rotates q (n_head x
// head_dim) and k (n_head_kv x head_dim) in place, with the CPU's arithmetic
// (x0*c - x1*s, x0*s + x1*c), and writes k and v into the cache at the slot of
// position rows[i].pos in the block table (kv.block_tables: the layer group's)
// of kv.layer, rounded to fp16 to nearest even.
void launch_rope_kv(float* q, float* k, const float* v, const BatchRowMeta* rows, int64_t n_rows,
                    const RopeArgs& rope, const KvDeviceView& kv, cudaStream_t stream);

}  // namespace barata::cuda
