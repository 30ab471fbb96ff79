// Paged fp16 KV cache: K and V of every layer live in fixed-size blocks of
// kBlockTokens tokens, handed to sequences through per-sequence block tables.
// Blocks are reference-counted so that sequences can share a prefix.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace barata {

class PagedKvCache {
 public:
  static constexpr int64_t kBlockTokens = 16;

  // max_tokens bounds the blocks that may ever be allocated (all sequences).
  PagedKvCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t max_tokens);

  int new_sequence();                 // an empty sequence; returns its id
  void free_sequence(int seq);        // releases its blocks
  void truncate(int seq, int64_t n);  // keeps the first n tokens
  int fork(int seq);                  // a new sequence sharing seq's blocks (copy on write)
  int64_t length(int seq) const;      // throws barata::Error for a sequence that does not exist

  // Makes room for positions [length, length + n) and advances the length;
  // throws barata::Error when the pool is exhausted.
  void append(int seq, int64_t n);

  // One token's K (or V) of one layer: n_head_kv x head_dim fp16 values.
  uint16_t* k(int64_t layer, int seq, int64_t pos) { return slot(layer, seq, pos, 0); }
  uint16_t* v(int64_t layer, int seq, int64_t pos) { return slot(layer, seq, pos, 1); }
  const uint16_t* k(int64_t layer, int seq, int64_t pos) const { return slot(layer, seq, pos, 0); }
  const uint16_t* v(int64_t layer, int seq, int64_t pos) const { return slot(layer, seq, pos, 1); }

  // K of kBlockTokens consecutive tokens starting at block-aligned pos, as
  // [token][n_head_kv * head_dim]; same for V.
  const uint16_t* k_block(int64_t layer, int seq, int64_t pos) const {
    return slot(layer, seq, pos, 0);
  }
  const uint16_t* v_block(int64_t layer, int seq, int64_t pos) const {
    return slot(layer, seq, pos, 1);
  }

  int64_t bytes_per_token() const { return block_bytes_ / kBlockTokens; }
  int64_t bytes_per_block() const { return block_bytes_; }
  int64_t blocks_in_use() const { return n_blocks_in_use_; }
  int64_t bytes_allocated() const { return n_blocks_allocated_ * block_bytes_; }
  int64_t max_tokens() const { return max_blocks_ * kBlockTokens; }

 private:
  struct Sequence {
    bool live = false;
    int64_t n_tokens = 0;
    std::vector<int32_t> blocks;  // block table: position / kBlockTokens -> block id
  };
  // Throw barata::Error unless seq is a live sequence.
  const Sequence& live(int seq) const;
  Sequence& live(int seq);
  uint16_t* slot(int64_t layer, int seq, int64_t pos, int kv) const;
  int32_t take_block();
  void release_block(int32_t b);

  int64_t n_layer_, kv_dim_;  // kv_dim = n_head_kv * head_dim
  int64_t block_bytes_;       // 2 (K,V) x n_layer x kBlockTokens x kv_dim x 2 bytes
  int64_t max_blocks_;
  std::vector<std::unique_ptr<uint16_t[]>> blocks_;  // allocated on first use
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;
  int64_t n_blocks_allocated_ = 0, n_blocks_in_use_ = 0;
  std::vector<Sequence> seqs_;
};

}  // namespace barata
