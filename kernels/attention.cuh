// Attention over the paged fp16 KV cache: a tiled prefill kernel (causal,
// online softmax in fp32) and a split decode kernel (one query row per
// sequence, split over blocks, then merged). Both read K/V through the block
// tables, so a prompt appended to a non-empty cache sees its earlier blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda_types.cuh"
#include "kv_view.cuh"

namespace barata::cuda {

struct AttnArgs {
  int32_t n_head = 0, n_head_kv = 0, head_dim = 0;  // n_head % n_head_kv == 0
  float scale = 0;                                  // 1 / sqrt(head_dim) unless the model says
  // Sliding window: a row at position p attends to (p - window, p]; 0: to
  // every position up to p.
  int32_t window = 0;
};

// Query rows of one sequence handled by one CTA of the prefill kernel:
// rows [row0, row0 + n_rows) of the batch, all with the same table, at most
// kPrefillTileRows of them. Each row attends positions [0, rows[i].pos].
inline constexpr int kPrefillTileRows = 16;
struct PrefillTile {
  int32_t row0 = 0, n_rows = 0;
};

// q: (batch rows, n_head * head_dim) fp32, RoPE applied; out: same shape.
// tiles: device array of n_tiles tiles that cover every row once.
void launch_attention_prefill(const float* q, float* out, const BatchRowMeta* rows,
                              const PrefillTile* tiles, int64_t n_tiles, const AttnArgs& a,
                              const KvDeviceView& kv, cudaStream_t stream);

// Decode: n_rows independent query rows (any sequences). The keys of each row
// are cut into n_splits ranges of split_tokens (a multiple of kv.block_tokens);
// ranges past a row's length do nothing (and the last range takes any keys
// past n_splits * split_tokens). The grid depends only on n_rows and n_splits,
// never on the lengths, so a captured CUDA graph replays at any length.
struct DecodeSplit {
  int32_t n_splits = 1;
  int32_t split_tokens = 0;  // n_splits * split_tokens >= every row's pos + 1
};
// The fp32 workspace launch_attention_decode needs (partial outputs and their
// max / sum per split), in floats: 0 for one split, which writes the output
// directly (workspace may then be null).
size_t attention_decode_workspace(int64_t n_rows, const AttnArgs& a, const DecodeSplit& s);
void launch_attention_decode(const float* q, float* out, const BatchRowMeta* rows, int64_t n_rows,
                             const AttnArgs& a, const KvDeviceView& kv, const DecodeSplit& s,
                             float* workspace, cudaStream_t stream);

}  // namespace barata::cuda
