// How kernels address the paged KV cache on the device and the rows of a
// batch. The block layout is the CPU's (include/barata/kv_cache.h): a block of
// block_tokens tokens holds, for every layer of one layer group, K then V as
// [layer in group][K|V][token in block][one row], a row being kv_dim values
// in the cache's type (k_row / v_row bytes; kv_codec.cuh).
#pragma once

#include <cstdint>

#include "barata/batch.h"
#include "barata/kv_types.h"

namespace barata::cuda {

struct KvDeviceView {
  uint8_t* pool = nullptr;          // block b starts at pool + b * block_bytes
  int64_t block_bytes = 0;          // layers per group * block_tokens * (k_row + v_row)
  int32_t layer = 0;                // the layer this call reads or writes, in its group
  int32_t kv_dim = 0;               // n_head_kv * head_dim
  int32_t block_tokens = 16;        // tokens per block
  int32_t k_row = 0, v_row = 0;     // bytes of one token's K and V row
  KvType k_type = KvType::kF16;     // storage types (a rotated K: its codes' type;
  KvType v_type = KvType::kF16;     // the rotation is rope_kv's)
  bool rotate_k = false;            // rope_kv rotates k by H and q by H / head_dim
  const float* k_offset = nullptr;  // rope_kv subtracts it from k (kv_dim; null: none)
  const float* k_scale = nullptr;   // rope_kv: k / s, q * s (kv_dim powers of two; null: none)
  const int32_t* block_tables = nullptr;  // device: every sequence's table of the layer's group
};

// Byte offset of K (kv = 0) or V (kv = 1) of the token in physical slot
// `slot` (block id * block_tokens + position within the block).
__host__ __device__ inline int64_t kv_offset(const KvDeviceView& v, int64_t slot, int kv) {
  const int64_t b = slot / v.block_tokens, t = slot % v.block_tokens;
  const int64_t pair = static_cast<int64_t>(v.k_row) + v.v_row;
  return b * v.block_bytes + static_cast<int64_t>(v.layer) * v.block_tokens * pair +
         (kv != 0 ? static_cast<int64_t>(v.block_tokens) * v.k_row : 0) +
         t * (kv != 0 ? v.v_row : v.k_row);
}

// Physical slot of position `pos` of the sequence whose table starts at
// block_tables[table].
__host__ __device__ inline int64_t kv_slot(const KvDeviceView& v, int32_t table, int64_t pos) {
  return static_cast<int64_t>(v.block_tables[table + pos / v.block_tokens]) * v.block_tokens +
         pos % v.block_tokens;
}

}  // namespace barata::cuda
