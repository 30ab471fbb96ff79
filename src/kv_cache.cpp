#include "barata/kv_cache.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include <sys/mman.h>

#include "barata/error.h"
#include "barata/model_config.h"

namespace barata {

int64_t kv_sequence_bytes(int64_t len, int64_t n_full, int64_t n_sliding, int64_t window,
                          int64_t pair_bytes, int64_t keep_back) {
  constexpr int64_t B = kKvBlockTokens;
  const int64_t blocks = (std::max<int64_t>(len, 0) + B - 1) / B;
  // The last append (position len - 1) released what position len - window
  // no longer needs, less keep_back (KvBlockManager::slide).
  const int64_t released =
      window > 0 ? std::clamp<int64_t>((len - window - keep_back) / B, 0, blocks) : 0;
  const int64_t sliding = blocks - released;
  const int64_t per_layer_block = B * pair_bytes;
  return (n_full * blocks + n_sliding * sliding) * per_layer_block;
}

int64_t kv_sequence_bytes(const ModelConfig& c, int64_t len, bool swa_full, KvType k, KvType v) {
  const int64_t sliding = !swa_full && c.n_swa > 0 ? c.n_swa_layers : 0;
  const int64_t kv_dim = c.n_head_kv * c.head_dim;
  return kv_sequence_bytes(len, c.n_layer - sliding, sliding, sliding > 0 ? c.n_swa : 0,
                           kv_row_bytes(k, kv_dim) + kv_row_bytes(v, kv_dim),
                           KvBlockManager::kDefaultKeepBack);
}

KvLayout kv_layout_for(const ModelConfig& c, bool swa_full, KvType k, KvType v) {
  check_kv_type(k, c.head_dim, "--cache-type-k");
  check_kv_type(v, c.head_dim, "--cache-type-v");
  if (kv_type_info(v).k_only)
    fail("--cache-type-v: {} rotates keys only; V takes {}", kv_type_name(v), kv_type_names(false));
  KvLayout L = KvLayout::uniform(c.n_layer, c.n_head_kv * c.head_dim, k, v);
  const int64_t n_local = c.n_swa > 0 ? c.n_swa_layers : 0;
  if (swa_full || n_local == 0) return L;
  if (n_local == c.n_layer) {  // every layer windowed: one group that slides
    L.group_window = {c.n_swa};
    return L;
  }
  const int64_t n_global = c.n_layer - n_local;
  const int64_t g = std::gcd(n_local, n_global);
  L.group_layers = g;
  L.layer_group.resize(static_cast<size_t>(c.n_layer));
  L.layer_index.resize(static_cast<size_t>(c.n_layer));
  // Global layers fill the first groups, local ones the rest, in layer order.
  int64_t next_global = 0, next_local = n_global;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    int64_t& slot = c.is_swa(l) ? next_local : next_global;
    L.layer_group[static_cast<size_t>(l)] = static_cast<int32_t>(slot / g);
    L.layer_index[static_cast<size_t>(l)] = static_cast<int32_t>(slot % g);
    ++slot;
  }
  for (int64_t k = 0; k < c.n_layer / g; ++k)
    L.group_window.push_back(k < n_global / g ? 0 : c.n_swa);
  return L;
}

KvBlockManager::KvBlockManager(int64_t max_blocks, std::vector<int64_t> windows, int64_t keep_back)
    : max_blocks_(max_blocks), windows_(std::move(windows)), keep_back_(keep_back) {
  if (max_blocks < 0 || max_blocks > INT32_MAX)
    fail("KV cache: {} blocks is outside 0..{}", max_blocks, INT32_MAX);
  if (windows_.empty()) windows_ = {0};
  for (int64_t w : windows_)
    if (w < 0) fail("KV cache: a layer group with a window of {} positions", w);
  if (keep_back_ < 0) fail("KV cache: keep_back of {} positions", keep_back_);
}

void KvBlockManager::reserve_bookkeeping(int64_t sequence_tokens) {
  refcount_.reserve(static_cast<size_t>(max_blocks_));
  cached_.reserve(static_cast<size_t>(max_blocks_));
  free_.reserve(static_cast<size_t>(max_blocks_));
  reserve_blocks_ = (std::max<int64_t>(sequence_tokens, 0) + kBlockTokens - 1) / kBlockTokens + 1;
}

bool KvBlockManager::has_sliding_groups() const {
  return std::any_of(windows_.begin(), windows_.end(), [](int64_t w) { return w > 0; });
}

void KvBlockManager::make_fresh(SeqBlocks& s) const {
  s.live = true;
  s.n_tokens = 0;
  s.released_to = 0;
  s.tables.resize(windows_.size());
  for (std::vector<int32_t>& t : s.tables) {
    t.clear();
    t.reserve(static_cast<size_t>(reserve_blocks_));
  }
  s.hashes.clear();
  if (prefix_on_) s.hashes.reserve(static_cast<size_t>(reserve_blocks_));
}

int KvBlockManager::new_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!seqs_[i].live) {
      make_fresh(seqs_[i]);
      return static_cast<int>(i);
    }
  }
  seqs_.emplace_back();
  make_fresh(seqs_.back());
  return static_cast<int>(seqs_.size() - 1);
}

bool KvBlockManager::exists(int seq) const {
  return seq >= 0 && static_cast<size_t>(seq) < seqs_.size() &&
         seqs_[static_cast<size_t>(seq)].live;
}

const KvBlockManager::SeqBlocks& KvBlockManager::live(int seq) const {
  if (!exists(seq)) fail("KV cache: sequence {} does not exist (never made, or freed)", seq);
  return seqs_[static_cast<size_t>(seq)];
}

KvBlockManager::SeqBlocks& KvBlockManager::live(int seq) {
  return const_cast<SeqBlocks&>(std::as_const(*this).live(seq));
}

int64_t KvBlockManager::length(int seq) const {
  return live(seq).n_tokens;
}

const std::vector<int32_t>& KvBlockManager::table(int seq, int group) const {
  const SeqBlocks& s = live(seq);
  if (group < 0 || group >= n_groups())
    fail("internal: KV cache: layer group {} of {}", group, n_groups());
  return s.tables[static_cast<size_t>(group)];
}

int64_t KvBlockManager::blocks_held(int seq) const {
  int64_t n = 0;
  for (const auto& t : live(seq).tables)
    for (int32_t b : t) n += b != kNoBlock ? 1 : 0;
  return n;
}

void KvBlockManager::free_sequence(int seq) {
  truncate(seq, 0);
  live(seq).live = false;
}

bool KvBlockManager::can_truncate(int seq, int64_t n) const {
  const SeqBlocks& s = live(seq);
  if (n <= 0 || n >= s.n_tokens) return n >= 0;
  const auto keep = static_cast<size_t>((n + kBlockTokens - 1) / kBlockTokens);
  // A sliding group must still hold what the next row (position n) reads.
  for (size_t g = 0; g < windows_.size(); ++g) {
    if (windows_[g] == 0) continue;
    const auto first =
        static_cast<size_t>(std::max<int64_t>(0, n + 1 - windows_[g]) / kBlockTokens);
    if (first < keep && s.tables[g][first] == kNoBlock) return false;
  }
  return true;
}

void KvBlockManager::truncate(int seq, int64_t n) {
  if (n < 0) fail("KV cache: truncate of sequence {} to {} tokens", seq, n);
  SeqBlocks& s = live(seq);
  if (n >= s.n_tokens) return;
  const size_t keep = static_cast<size_t>((n + kBlockTokens - 1) / kBlockTokens);
  if (!can_truncate(seq, n))
    fail(
        "KV cache: sequence {} cannot go back to {} of its {} tokens: its sliding-window layers "
        "have released the blocks before position {} (a truncation may go back at most {} "
        "positions behind the window)",
        seq, n, s.n_tokens, s.released_to * kBlockTokens, keep_back_);
  for (auto& t : s.tables) {
    for (size_t i = keep; i < t.size(); ++i)
      if (t[i] != kNoBlock) release_block(t[i]);
    t.resize(std::min(t.size(), keep));
  }
  s.released_to = std::min<int64_t>(s.released_to, static_cast<int64_t>(keep));
  s.hashes.resize(std::min(s.hashes.size(), static_cast<size_t>(n / kBlockTokens)));
  s.n_tokens = n;
}

int KvBlockManager::fork(int seq) {
  live(seq);
  const int child = new_sequence();
  SeqBlocks& c = seqs_[static_cast<size_t>(child)];
  const SeqBlocks& p = seqs_[static_cast<size_t>(seq)];
  c.n_tokens = p.n_tokens;
  c.tables = p.tables;
  c.hashes = p.hashes;
  c.released_to = p.released_to;
  for (const auto& t : c.tables)
    for (int32_t b : t)
      if (b != kNoBlock) ++refcount_[static_cast<size_t>(b)];
  return child;
}

int32_t KvBlockManager::take_block() {
  // Released blocks first, then never-used ones in order (the pool's pages
  // are touched no further than the most blocks ever in use at once), then
  // the least recently used cached block.
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (static_cast<int64_t>(refcount_.size()) < max_blocks_) {
    b = static_cast<int32_t>(refcount_.size());
    refcount_.push_back(0);
    cached_.emplace_back();
  } else {
    if (lru_.empty()) fail("internal: KV cache: no block to take ({} in use)", n_in_use_);
    b = lru_.begin()->second;
    unpublish(b);
    ++prefix_stats_.evictions;
  }
  refcount_[static_cast<size_t>(b)] = 1;
  ++n_in_use_;
  return b;
}

void KvBlockManager::release_block(int32_t b) {
  if (--refcount_[static_cast<size_t>(b)] == 0) {
    --n_in_use_;
    Cached& c = cached_[static_cast<size_t>(b)];
    if (c.published) {
      c.lru_tick = tick_++;
      lru_.emplace(c.lru_tick, b);
    } else {
      free_.push_back(b);
    }
  }
}

// Forgets a published block's hash; a block with no holder goes to the free list.
void KvBlockManager::unpublish(int32_t b) {
  Cached& c = cached_[static_cast<size_t>(b)];
  if (!c.published) return;
  auto it = by_hash_.find(c.hash);
  if (it != by_hash_.end() && it->second == b) by_hash_.erase(it);
  if (c.lru_tick >= 0) lru_.erase(c.lru_tick);
  c = Cached{};
}

// Whether appending n tokens must first copy group g's partly filled last
// block: it is shared with another sequence, or published (immutable).
bool KvBlockManager::must_copy(const SeqBlocks& s, int group, int64_t n) const {
  const auto& t = s.tables[static_cast<size_t>(group)];
  if (n <= 0 || s.n_tokens % kBlockTokens == 0 || t.empty() || t.back() == kNoBlock) return false;
  const auto b = static_cast<size_t>(t.back());
  return refcount_[b] > 1 || cached_[b].published;
}

int64_t KvBlockManager::blocks_needed(const SeqBlocks& s, int64_t n) const {
  const int64_t want = (s.n_tokens + n + kBlockTokens - 1) / kBlockTokens;
  int64_t need = 0, freed = 0;
  for (size_t g = 0; g < s.tables.size(); ++g) {
    need += std::max<int64_t>(want - static_cast<int64_t>(s.tables[g].size()), 0) +
            (must_copy(s, static_cast<int>(g), n) ? 1 : 0);
    // The blocks this append's slide returns to the pool first (held by this
    // sequence alone), as append() releases before it allocates.
    if (n > 0 && windows_[g] > 0) {
      const auto& t = s.tables[g];
      const int64_t from = (s.n_tokens + 1 - windows_[g] - keep_back_) / kBlockTokens;
      for (int64_t i = s.released_to; i < std::min<int64_t>(from, static_cast<int64_t>(t.size()));
           ++i)
        if (t[static_cast<size_t>(i)] != kNoBlock && refcount(t[static_cast<size_t>(i)]) == 1)
          ++freed;
    }
  }
  // Never below zero: what one sequence frees is credited to its own append
  // only, so that a sum over the sequences of a step is safe in any order.
  return std::max<int64_t>(need - freed, 0);
}

int64_t KvBlockManager::blocks_needed(int seq, int64_t n) const {
  if (n < 0) fail("KV cache: append of {} tokens to sequence {}", n, seq);
  return blocks_needed(live(seq), n);
}

int64_t KvBlockManager::peak_blocks(int64_t n, int64_t chunk) const {
  if (n <= 0) return 0;
  const int64_t blocks = (n + kBlockTokens - 1) / kBlockTokens;
  int64_t total = 0;
  for (int64_t w : windows_) {
    if (w == 0) {
      total += blocks;
      continue;
    }
    // An append of c <= chunk rows at length L keeps the blocks from
    // (L + 1 - w - keep_back) / 16 to (L + c - 1) / 16: a span of
    // D = c + w + keep_back - 1 positions, which touches at most
    // (D + 30) / 16 blocks. A bound that never falls as n grows (so that
    // max_sequence_tokens can search it), at most one block above the most
    // held at once.
    const int64_t span = std::max<int64_t>(chunk, 1) + w + keep_back_ - 1;
    total += std::min(blocks, (span + 2 * (kBlockTokens - 1)) / kBlockTokens);
  }
  return total;
}

int64_t KvBlockManager::max_sequence_tokens(int64_t chunk) const {
  if (!has_sliding_groups()) return max_tokens();
  // peak_blocks grows with n; the answer lies in [max_tokens, max_blocks x 16].
  int64_t lo = max_tokens(), hi = max_blocks_ * kBlockTokens;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (peak_blocks(mid, chunk) <= max_blocks_)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Releases the sliding groups' blocks that hold only positions before
// first_needed (minus keep_back): no row from here on reads them.
void KvBlockManager::slide(SeqBlocks& s, int64_t first_needed) {
  for (size_t g = 0; g < windows_.size(); ++g) {
    if (windows_[g] == 0) continue;
    const int64_t from = first_needed - windows_[g] - keep_back_;
    auto& t = s.tables[g];
    const auto upto = static_cast<size_t>(
        std::clamp<int64_t>(from / kBlockTokens, 0, static_cast<int64_t>(t.size())));
    for (size_t i = static_cast<size_t>(s.released_to); i < upto; ++i) {
      if (t[i] != kNoBlock) release_block(t[i]);
      t[i] = kNoBlock;
    }
  }
  if (has_sliding_groups()) {
    const int64_t w = *std::max_element(windows_.begin(), windows_.end());
    s.released_to = std::max<int64_t>(
        s.released_to, std::max<int64_t>(0, first_needed - w - keep_back_) / kBlockTokens);
  }
}

void KvBlockManager::append(int seq, int64_t n, std::vector<Copy>* copies) {
  const int64_t need = blocks_needed(seq, n);
  if (need > free_blocks())
    fail(
        "KV cache full: appending {} tokens needs {} more blocks of {} tokens, {} of {} are free "
        "(raise the context size -c)",
        n, need, kBlockTokens, free_blocks(), max_blocks_);
  SeqBlocks& s = live(seq);
  const int64_t end = s.n_tokens + n;
  // The first new row (position n_tokens) sees keys from n_tokens + 1 - window.
  if (n > 0) slide(s, s.n_tokens + 1);
  for (size_t g = 0; g < s.tables.size(); ++g) {
    auto& t = s.tables[g];
    // Copy on write: the partly filled last block may be shared with a fork,
    // or published in the prefix cache.
    if (must_copy(s, static_cast<int>(g), n)) {
      const int32_t old = t.back();
      const int32_t fresh = take_block();
      if (copies) copies->push_back({old, fresh});
      release_block(old);
      t.back() = fresh;
    }
    while (static_cast<int64_t>(t.size()) * kBlockTokens < end) t.push_back(take_block());
  }
  s.n_tokens = end;
}

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ 0x6b76626c6f636bULL);
  for (int32_t t : tokens) h = mix64(h ^ static_cast<uint32_t>(t));
  return h;
}

}  // namespace

void KvBlockManager::set_prefix_caching(bool on) {
  if (!on) clear_prefix_cache();
  prefix_on_ = on;
}

void KvBlockManager::clear_prefix_cache() {
  for (size_t b = 0; b < cached_.size(); ++b) {
    if (!cached_[b].published) continue;
    const bool idle = cached_[b].lru_tick >= 0;
    unpublish(static_cast<int32_t>(b));
    if (idle) free_.push_back(static_cast<int32_t>(b));
  }
  for (SeqBlocks& s : seqs_) s.hashes.clear();
}

namespace {
// A block of one group published under (the chain hash, the group): the
// full groups' and the sliding groups' blocks of one run of tokens are found
// apart (a sliding group's early blocks are gone sooner).
uint64_t group_key(uint64_t chain, int64_t group) {
  return group == 0 ? chain : mix64(chain ^ (0x67726f7570ULL + static_cast<uint64_t>(group)));
}
}  // namespace

int64_t KvBlockManager::first_kept(int64_t group, int64_t n_tokens) const {
  const int64_t w = windows_[static_cast<size_t>(group)];
  if (w == 0) return 0;
  return std::max<int64_t>(0, n_tokens + 1 - w - keep_back_) / kBlockTokens;
}

int32_t KvBlockManager::cached_block(uint64_t chain, uint64_t parent, int64_t group,
                                     std::span<const int32_t> blk) const {
  auto it = by_hash_.find(group_key(chain, group));
  if (it == by_hash_.end()) return kNoBlock;
  const Cached& c = cached_[static_cast<size_t>(it->second)];
  if (c.parent != parent || !std::equal(blk.begin(), blk.end(), c.tokens.begin())) return kNoBlock;
  return it->second;
}

int64_t KvBlockManager::attach_prefix(int seq, std::span<const int32_t> tokens) {
  SeqBlocks& s = live(seq);
  if (!prefix_on_) return 0;
  if (s.n_tokens != 0) fail("internal: KV cache: prefix attach to a non-empty sequence {}", seq);
  ++prefix_stats_.lookups;
  // The chain over the blocks whose every full group's block is cached
  // (at least one token stays to compute).
  std::vector<uint64_t> chain, parents;
  uint64_t parent = 0;
  const size_t n = tokens.size();
  for (size_t i = 0; (i + 1) * kBlockTokens < n; ++i) {
    const auto blk = tokens.subspan(i * kBlockTokens, kBlockTokens);
    const uint64_t h = block_hash(parent, blk);
    bool all = true;
    for (size_t g = 0; g < windows_.size() && all; ++g)
      if (windows_[g] == 0) all = cached_block(h, parent, static_cast<int64_t>(g), blk) != kNoBlock;
    if (!all) break;
    chain.push_back(h);
    parents.push_back(parent);
    parent = h;
  }
  // The longest run of k blocks for which each sliding group still has the
  // blocks a sequence of k x 16 tokens keeps (its window and keep_back).
  auto sliding_ok = [&](size_t k) {
    for (size_t g = 0; g < windows_.size(); ++g) {
      if (windows_[g] == 0) continue;
      for (auto i = static_cast<size_t>(
               first_kept(static_cast<int64_t>(g), static_cast<int64_t>(k) * kBlockTokens));
           i < k; ++i)
        if (cached_block(chain[i], parents[i], static_cast<int64_t>(g),
                         tokens.subspan(i * kBlockTokens, kBlockTokens)) == kNoBlock)
          return false;
    }
    return true;
  };
  size_t k = chain.size();
  while (k > 0 && !sliding_ok(k)) --k;
  if (k == 0) return 0;
  const int64_t len = static_cast<int64_t>(k) * kBlockTokens;
  for (size_t g = 0; g < windows_.size(); ++g) {
    const auto from = static_cast<size_t>(first_kept(static_cast<int64_t>(g), len));
    auto& t = s.tables[g];
    for (size_t i = 0; i < k; ++i) {
      if (i < from) {
        t.push_back(kNoBlock);
        continue;
      }
      const int32_t b = cached_block(chain[i], parents[i], static_cast<int64_t>(g),
                                     tokens.subspan(i * kBlockTokens, kBlockTokens));
      Cached& c = cached_[static_cast<size_t>(b)];
      if (refcount_[static_cast<size_t>(b)] == 0) {
        lru_.erase(c.lru_tick);
        c.lru_tick = -1;
        ++n_in_use_;
      }
      ++refcount_[static_cast<size_t>(b)];
      t.push_back(b);
    }
  }
  s.hashes.assign(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(k));
  s.n_tokens = len;
  if (has_sliding_groups()) {
    int64_t r = 0;
    for (size_t g = 0; g < windows_.size(); ++g)
      if (windows_[g] > 0) r = std::max(r, first_kept(static_cast<int64_t>(g), len));
    s.released_to = r;
  }
  prefix_stats_.hit_blocks += static_cast<int64_t>(k);
  return len;
}

void KvBlockManager::publish(int seq, std::span<const int32_t> tokens) {
  SeqBlocks& s = live(seq);
  if (!prefix_on_) return;
  const size_t full = static_cast<size_t>(
      std::min<int64_t>(s.n_tokens, static_cast<int64_t>(tokens.size())) / kBlockTokens);
  while (s.hashes.size() < full) {
    const size_t i = s.hashes.size();
    const uint64_t parent = i == 0 ? 0 : s.hashes[i - 1];
    const auto blk = tokens.subspan(i * kBlockTokens, kBlockTokens);
    const uint64_t h = block_hash(parent, blk);
    for (size_t g = 0; g < s.tables.size(); ++g) {
      const int32_t b = s.tables[g][i];
      if (b == kNoBlock) continue;  // a sliding group's, already gone
      const uint64_t key = group_key(h, static_cast<int64_t>(g));
      Cached& c = cached_[static_cast<size_t>(b)];
      if (!c.published && by_hash_.find(key) == by_hash_.end()) {
        c.published = true;
        c.hash = key;
        c.parent = parent;
        std::copy(blk.begin(), blk.end(), c.tokens.begin());
        by_hash_.emplace(key, b);
        ++prefix_stats_.published;
      }
    }
    s.hashes.push_back(h);
  }
}

int64_t KvBlockManager::shared_blocks() const {
  int64_t n = 0;
  for (int32_t r : refcount_) n += r > 1 ? 1 : 0;
  return n;
}

int32_t KvBlockManager::refcount(int32_t block) const {
  if (block < 0 || static_cast<size_t>(block) >= refcount_.size()) return 0;
  return refcount_[static_cast<size_t>(block)];
}

HostKvPool::HostKvPool(const KvLayout& layout, int64_t n_blocks)
    : layout_(layout), n_blocks_(n_blocks) {
  if (n_blocks <= 0) return;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n_blocks, layout.bytes_per_block(), &bytes))
    fail("KV cache: {} blocks of {} bytes overflow", n_blocks, layout.bytes_per_block());
  mapped_bytes_ = static_cast<size_t>(bytes);
  // Anonymous, private, not reserved against swap: zero pages until written.
  void* p = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    fail("KV cache: cannot map {} MiB for {} blocks: {} (lower -c)", mapped_bytes_ >> 20, n_blocks,
         std::strerror(errno));
  base_ = static_cast<uint8_t*>(p);
}

HostKvPool::~HostKvPool() {
  if (base_) munmap(base_, mapped_bytes_);
}

void HostKvPool::copy(int32_t from, int32_t to) {
  std::memcpy(block(to), block(from), static_cast<size_t>(layout_.bytes_per_block()));
}

PagedKvCache::PagedKvCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t max_tokens)
    : blocks_((max_tokens + kBlockTokens - 1) / kBlockTokens),
      pool_(KvLayout::uniform(n_layer, n_head_kv * head_dim), blocks_.max_blocks()) {}

void PagedKvCache::append(int seq, int64_t n) {
  std::vector<KvBlockManager::Copy> copies;
  blocks_.append(seq, n, &copies);
  for (const auto& c : copies) pool_.copy(c.from, c.to);
}

uint16_t* PagedKvCache::slot(int64_t layer, int seq, int64_t pos, int kv) const {
  const std::vector<int32_t>& t = blocks_.table(seq);
  return reinterpret_cast<uint16_t*>(pool_.block(t[static_cast<size_t>(pos / kBlockTokens)]) +
                                     pool_.layout().offset(layer, kv, pos % kBlockTokens));
}

}  // namespace barata
