// How kernels address the paged fp16 KV cache on the device and the rows of a
// batch. The block layout is the CPU's (include/barata/kv_cache.h): a block of
// block_tokens tokens holds, for every layer of one layer group, K then V as
// [layer in group][K|V][token in block][kv_dim] fp16 values.
#pragma once

#include <cstdint>

#include "barata/batch.h"

namespace barata::cuda {

struct KvDeviceView {
  uint16_t* pool = nullptr;               // fp16 bits; block b starts at pool + b * block_elems
  int64_t block_elems = 0;                // 2 * layers per group * block_tokens * kv_dim
  int32_t layer = 0;                      // the layer this call reads or writes, in its group
  int32_t kv_dim = 0;                     // n_head_kv * head_dim
  int32_t block_tokens = 16;              // tokens per block
  const int32_t* block_tables = nullptr;  // device: every sequence's table of the layer's group
};

// Element offset of K (kv = 0) or V (kv = 1) of the token in physical slot
// `slot` (block id * block_tokens + position within the block).
__host__ __device__ inline int64_t kv_offset(const KvDeviceView& v, int64_t slot, int kv) {
  const int64_t b = slot / v.block_tokens, t = slot % v.block_tokens;
  return b * v.block_elems +
         ((static_cast<int64_t>(v.layer) * 2 + kv) * v.block_tokens + t) * v.kv_dim;
}

// Physical slot of position `pos` of the sequence whose table starts at
// block_tables[table].
__host__ __device__ inline int64_t kv_slot(const KvDeviceView& v, int32_t table, int64_t pos) {
  return static_cast<int64_t>(v.block_tables[table + pos / v.block_tokens]) * v.block_tokens +
         pos % v.block_tokens;
}

}  // namespace barata::cuda
