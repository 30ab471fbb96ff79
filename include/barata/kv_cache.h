// The paged KV cache, in two parts:
//  - KvBlockManager, on the host for every backend: per-sequence block
//    tables, reference counts (sequences sharing a prefix), copy on write,
//    the free list, and whether a sequence has room (can_append);
//  - a pool of blocks in a backend's memory, allocated once and addressed by
//    block id (HostKvPool here; the CUDA backend's lives on the device).
// K and V live in fixed-size blocks of kBlockTokens tokens, laid out as
// [layer in group][K|V][token in block][one row], the same on every backend;
// a row is a token's K (or V) of one layer, kv_dim values in the cache type
// (kv_types.h: fp16 by default, or q8_0, q4_0, fp8, ...), so a block of a
// quantized cache is smaller and the pool holds more of them.
//
// Layer groups (vLLM's hybrid KV-cache manager is the model): the layers are
// split into groups of equal size, so every group's block is the same number
// of bytes and all groups draw from one pool; each sequence has one block
// table per group. A model without sliding-window layers has one group of
// every layer (a block holds 16 tokens of every layer). A model with both
// kinds (Gemma 3: 5 local layers to 1 global) gets groups of only local or
// only global layers, and a local group's blocks that fall behind its window
// go back to the pool while the sequence runs: at long context such a
// sequence holds about (global layers + local layers x window / length) of
// the blocks the full cache would.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "barata/kv_types.h"

namespace barata {

inline constexpr int64_t kKvBlockTokens = 16;

struct KvLayout {
  int64_t n_layer = 0;
  int64_t kv_dim = 0;  // n_head_kv * head_dim
  KvType k_type = KvType::kF16, v_type = KvType::kF16;
  // Layer groups; empty: one group of every layer. Otherwise, per layer, its
  // group and its index in the group, and per group its window (0: full
  // attention; n: the layer sees the last n positions).
  std::vector<int32_t> layer_group, layer_index;
  std::vector<int64_t> group_window;
  int64_t group_layers = 0;  // layers per group (0: n_layer)

  // One group of every layer.
  static KvLayout uniform(int64_t n_layer, int64_t kv_dim, KvType k = KvType::kF16,
                          KvType v = KvType::kF16) {
    KvLayout L;
    L.n_layer = n_layer;
    L.kv_dim = kv_dim;
    L.k_type = k;
    L.v_type = v;
    return L;
  }

  int64_t n_groups() const {
    return group_window.empty() ? 1 : static_cast<int64_t>(group_window.size());
  }
  int64_t layers_per_block() const { return group_layers > 0 ? group_layers : n_layer; }
  int32_t group(int64_t layer) const {
    return layer_group.empty() ? 0 : layer_group[static_cast<size_t>(layer)];
  }
  int64_t index(int64_t layer) const {
    return layer_index.empty() ? layer : layer_index[static_cast<size_t>(layer)];
  }
  int64_t window(int64_t group) const {
    return group_window.empty() ? 0 : group_window[static_cast<size_t>(group)];
  }
  KvType type(int kv) const { return kv == 0 ? k_type : v_type; }
  // Bytes of one token's K (kv = 0) or V (kv = 1) of one layer.
  int64_t row_bytes(int kv) const { return kv_row_bytes(type(kv), kv_dim); }
  // K and V of one layer and position.
  int64_t pair_bytes() const { return row_bytes(0) + row_bytes(1); }
  // One layer's K and V in a block.
  int64_t layer_bytes() const { return kKvBlockTokens * pair_bytes(); }
  int64_t bytes_per_block() const { return layers_per_block() * layer_bytes(); }
  // K and V of one position of every layer: what the full cache costs a token.
  int64_t bytes_per_token() const { return n_layer * pair_bytes(); }
  // Byte offset of K (kv = 0) or V (kv = 1) of `layer` at block position t
  // in a block of the layer's group.
  int64_t offset(int64_t layer, int kv, int64_t t) const {
    return index(layer) * layer_bytes() + (kv != 0 ? kKvBlockTokens * row_bytes(0) : 0) +
           t * row_bytes(kv);
  }
};

// The K/V bytes one sequence of len tokens holds after its last append:
// n_full layers keep every block of 16 positions; n_sliding layers of a
// `window` keep the blocks from (len - window - keep_back) on (n_sliding = 0
// or window = 0: the full cache, layers x pair_bytes per position, in whole
// blocks). pair_bytes: K and V of one layer and position (KvLayout::pair_bytes).
int64_t kv_sequence_bytes(int64_t len, int64_t n_full, int64_t n_sliding, int64_t window,
                          int64_t pair_bytes, int64_t keep_back);

struct ModelConfig;
// The same for a model: its sliding-window layers (none with swa_full) and
// KvBlockManager's default keep_back.
int64_t kv_sequence_bytes(const ModelConfig& c, int64_t len, bool swa_full, KvType k = KvType::kF16,
                          KvType v = KvType::kF16);
// The cache layout of a model: one group, or with sliding-window layers (and
// swa_full false) groups of only local or only global layers, of the size of
// the smaller kind's count when that divides both (else one group).
// The cache types are checked against the head size (check_kv_type).
KvLayout kv_layout_for(const ModelConfig& c, bool swa_full, KvType k = KvType::kF16,
                       KvType v = KvType::kF16);

class KvBlockManager {
 public:
  static constexpr int64_t kBlockTokens = kKvBlockTokens;

  // windows: per layer group, 0 (full attention: every block stays) or the
  // number of positions its layers see (blocks behind it are released).
  // keep_back: positions a sliding group keeps behind its window, so that a
  // sequence can be truncated that far back (speculative decoding rejects
  // drafted tokens; at most keep_back of them).
  explicit KvBlockManager(int64_t max_blocks, std::vector<int64_t> windows = {0},
                          int64_t keep_back = kDefaultKeepBack);
  static constexpr int64_t kDefaultKeepBack = 64;

  int new_sequence();           // an empty sequence; returns its id
  void free_sequence(int seq);  // releases its blocks
  // Reserves the bookkeeping of every block of the pool, and gives each new
  // sequence's tables room for sequence_tokens (the engine passes its
  // context), so that appends allocate nothing. The engine calls it: it has
  // allocated the pool's memory already, beside which this is small.
  void reserve_bookkeeping(int64_t sequence_tokens);
  // The blocks a table has room for, as reserved (0: none reserved).
  int64_t reserved_table_blocks() const { return reserve_blocks_; }
  // Keeps the first n tokens. With sliding groups, going back more than
  // keep_back positions behind the window is an Error (their blocks are
  // released): can_truncate says whether it would be; 0 is always allowed.
  void truncate(int seq, int64_t n);
  bool can_truncate(int seq, int64_t n) const;
  int fork(int seq);              // a new sequence sharing seq's blocks (copy on write)
  int64_t length(int seq) const;  // throws barata::Error for a sequence that does not exist
  bool exists(int seq) const;

  // Blocks that appending n tokens to seq would take from the free list (a
  // shared partial last block is copied first).
  int64_t blocks_needed(int seq, int64_t n) const;
  bool can_append(int seq, int64_t n) const { return blocks_needed(seq, n) <= free_blocks(); }

  // A block whose contents must be copied before the append's writes (copy on write).
  struct Copy {
    int32_t from, to;
  };
  // Makes room for positions [length, length + n) and advances the length.
  // Throws barata::Error, changing nothing, when the pool has too few blocks.
  // The copies the caller must make in the pool are appended to *copies.
  void append(int seq, int64_t n, std::vector<Copy>* copies);

  // position / kBlockTokens -> block id, of group 0 (the only one without
  // sliding-window groups) or of `group`; a released entry is kNoBlock.
  const std::vector<int32_t>& table(int seq, int group = 0) const;
  static constexpr int32_t kNoBlock = -1;
  int64_t n_groups() const { return static_cast<int64_t>(windows_.size()); }
  int64_t window(int group) const { return windows_[static_cast<size_t>(group)]; }
  bool has_sliding_groups() const;
  // Blocks a sequence holds now, every group counted.
  int64_t blocks_held(int seq) const;

  // Prefix caching (off until enabled). A full block, once its K/V is
  // written, is published under a hash chained over (the previous block's
  // hash, its token ids), as vLLM's automatic prefix caching does; with
  // several layer groups each group's block is published under that hash and
  // its group. A published block is never written again (an append into it
  // copies it first); when no sequence holds it any more (a sliding group's
  // block behind its window, too) it stays cached and is evicted, least
  // recently used first, only when the pool needs a block.
  void set_prefix_caching(bool on);
  bool prefix_caching() const { return prefix_on_; }
  // On an empty sequence: takes by reference the longest run of cached full
  // blocks that begins `tokens`, leaving at least one token to compute;
  // returns the number of tokens taken (a multiple of kBlockTokens). With
  // sliding groups (vLLM's hybrid manager's rule): the full groups' blocks of
  // the whole run, and of each sliding group only those a sequence of that
  // length keeps (its window and keep_back before the run's end); the rest
  // of its table is released entries.
  int64_t attach_prefix(int seq, std::span<const int32_t> tokens);
  // Publishes seq's full blocks not yet published; tokens holds at least its
  // first length(seq) ids.
  void publish(int seq, std::span<const int32_t> tokens);
  // Forgets every cached block (cold cache); blocks in use stay in use.
  void clear_prefix_cache();
  struct PrefixStats {
    int64_t lookups = 0, hit_blocks = 0, evictions = 0, published = 0;
  };
  const PrefixStats& prefix_stats() const { return prefix_stats_; }
  int64_t cached_blocks() const { return static_cast<int64_t>(by_hash_.size()); }
  int64_t shared_blocks() const;  // blocks held by more than one sequence now
  int32_t refcount(int32_t block) const;

  int64_t max_blocks() const { return max_blocks_; }
  int64_t blocks_in_use() const { return n_in_use_; }
  int64_t free_blocks() const { return max_blocks_ - n_in_use_; }
  // Tokens the pool holds when every group keeps every block (a sequence
  // shorter than the window, or a model without sliding groups).
  int64_t max_tokens() const { return max_blocks_ / n_groups() * kBlockTokens; }
  // Blocks n tokens take at most (every group, nothing released yet).
  int64_t blocks_for_tokens(int64_t n) const {
    return n_groups() * ((n + kBlockTokens - 1) / kBlockTokens);
  }
  // The most blocks one sequence holds on its way to n tokens when it is
  // appended at most `chunk` tokens at a time (chunked prefill, then decode):
  // every block of a full group, and of a sliding group those from the first
  // new row's window (less keep_back) of the last append on. Equals
  // blocks_for_tokens without sliding groups.
  int64_t peak_blocks(int64_t n, int64_t chunk) const;
  // The longest sequence the pool holds alone, appended in chunks of at most
  // `chunk` tokens (the most n with peak_blocks(n, chunk) <= max_blocks()):
  // max_tokens() without sliding groups; with them, what their release of
  // the blocks behind their windows adds.
  int64_t max_sequence_tokens(int64_t chunk) const;

 private:
  struct SeqBlocks {
    bool live = false;
    int64_t n_tokens = 0;
    std::vector<std::vector<int32_t>> tables;  // per group
    std::vector<uint64_t> hashes;              // chained hash of each published leading block
    int64_t released_to = 0;                   // sliding groups' blocks below this index are gone
  };
  void make_fresh(SeqBlocks& s) const;  // empty and live, reusing s's capacity
  int64_t blocks_needed(const SeqBlocks& s, int64_t n) const;
  void slide(SeqBlocks& s, int64_t first_needed);
  // A published block: its hash, its parent's and its tokens (checked on a hit).
  struct Cached {
    uint64_t hash = 0, parent = 0;
    std::array<int32_t, kKvBlockTokens> tokens{};
    int64_t lru_tick = -1;  // while in lru_ (refcount 0)
    bool published = false;
  };
  bool must_copy(const SeqBlocks& s, int group, int64_t n) const;
  // The first block index of `group` a sequence of n_tokens keeps (0 for a
  // full group): what slide() leaves at the next append.
  int64_t first_kept(int64_t group, int64_t n_tokens) const;
  // The published block of `group` for a run of tokens (chain hash, its
  // parent's, the block's ids), or kNoBlock.
  int32_t cached_block(uint64_t chain, uint64_t parent, int64_t group,
                       std::span<const int32_t> blk) const;
  void unpublish(int32_t b);
  const SeqBlocks& live(int seq) const;
  SeqBlocks& live(int seq);
  int32_t take_block();
  void release_block(int32_t b);

  int64_t max_blocks_;
  std::vector<int64_t> windows_;
  int64_t keep_back_;
  std::vector<int32_t> refcount_;  // per block id ever used
  std::vector<int32_t> free_;      // used ids whose refcount fell to 0
  int64_t n_in_use_ = 0;
  std::vector<SeqBlocks> seqs_;
  int64_t reserve_blocks_ = 0;  // per table of a new sequence
  bool prefix_on_ = false;
  std::vector<Cached> cached_;                     // per block id ever used
  std::unordered_map<uint64_t, int32_t> by_hash_;  // published blocks
  std::map<int64_t, int32_t> lru_;                 // tick -> published block with refcount 0
  int64_t tick_ = 0;
  PrefixStats prefix_stats_;
};

// A pool of blocks in host memory: one mapping, made up front and never
// grown; its pages are committed by the OS only as they are first written, so
// a large -c costs address space, not memory.
class HostKvPool {
 public:
  HostKvPool(const KvLayout& layout, int64_t n_blocks);
  ~HostKvPool();
  HostKvPool(const HostKvPool&) = delete;
  HostKvPool& operator=(const HostKvPool&) = delete;
  uint8_t* block(int32_t b) const { return base_ + b * layout_.bytes_per_block(); }
  void copy(int32_t from, int32_t to);
  const KvLayout& layout() const { return layout_; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t bytes() const { return n_blocks_ * layout_.bytes_per_block(); }

 private:
  KvLayout layout_;
  int64_t n_blocks_;
  size_t mapped_bytes_ = 0;
  uint8_t* base_ = nullptr;
};

// Block manager and host pool together, addressed by (layer, sequence,
// position): the host-side fp16 cache that tools and tests drive directly.
class PagedKvCache {
 public:
  static constexpr int64_t kBlockTokens = kKvBlockTokens;

  // max_tokens bounds the blocks that may ever be used (all sequences).
  PagedKvCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t max_tokens);

  int new_sequence() { return blocks_.new_sequence(); }
  void free_sequence(int seq) { blocks_.free_sequence(seq); }
  void truncate(int seq, int64_t n) { blocks_.truncate(seq, n); }
  int fork(int seq) { return blocks_.fork(seq); }
  int64_t length(int seq) const { return blocks_.length(seq); }
  void append(int seq, int64_t n);

  // One token's K (or V) of one layer: n_head_kv x head_dim fp16 values.
  uint16_t* k(int64_t layer, int seq, int64_t pos) { return slot(layer, seq, pos, 0); }
  uint16_t* v(int64_t layer, int seq, int64_t pos) { return slot(layer, seq, pos, 1); }
  const uint16_t* k(int64_t layer, int seq, int64_t pos) const { return slot(layer, seq, pos, 0); }
  const uint16_t* v(int64_t layer, int seq, int64_t pos) const { return slot(layer, seq, pos, 1); }

  int64_t bytes_per_token() const { return pool_.layout().bytes_per_token(); }
  int64_t bytes_per_block() const { return pool_.layout().bytes_per_block(); }
  int64_t blocks_in_use() const { return blocks_.blocks_in_use(); }
  int64_t bytes_allocated() const { return pool_.bytes(); }
  int64_t max_tokens() const { return blocks_.max_tokens(); }
  const KvBlockManager& blocks() const { return blocks_; }

 private:
  uint16_t* slot(int64_t layer, int seq, int64_t pos, int kv) const;

  KvBlockManager blocks_;
  HostKvPool pool_;
};

}  // namespace barata
