#include "barata/kv_cache.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <sys/mman.h>

#include "barata/error.h"

namespace barata {

KvBlockManager::KvBlockManager(int64_t max_blocks) : max_blocks_(max_blocks) {
  if (max_blocks < 0 || max_blocks > INT32_MAX)
    fail("KV cache: {} blocks is outside 0..{}", max_blocks, INT32_MAX);
}

int KvBlockManager::new_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!seqs_[i].live) {
      seqs_[i] = Sequence{true, 0, {}, {}};
      return static_cast<int>(i);
    }
  }
  seqs_.push_back(Sequence{true, 0, {}, {}});
  return static_cast<int>(seqs_.size() - 1);
}

bool KvBlockManager::exists(int seq) const {
  return seq >= 0 && static_cast<size_t>(seq) < seqs_.size() &&
         seqs_[static_cast<size_t>(seq)].live;
}

const KvBlockManager::Sequence& KvBlockManager::live(int seq) const {
  if (!exists(seq)) fail("KV cache: sequence {} does not exist (never made, or freed)", seq);
  return seqs_[static_cast<size_t>(seq)];
}

KvBlockManager::Sequence& KvBlockManager::live(int seq) {
  return const_cast<Sequence&>(std::as_const(*this).live(seq));
}

int64_t KvBlockManager::length(int seq) const {
  return live(seq).n_tokens;
}

const std::vector<int32_t>& KvBlockManager::table(int seq) const {
  return live(seq).blocks;
}

void KvBlockManager::free_sequence(int seq) {
  truncate(seq, 0);
  live(seq).live = false;
}

void KvBlockManager::truncate(int seq, int64_t n) {
  if (n < 0) fail("KV cache: truncate of sequence {} to {} tokens", seq, n);
  Sequence& s = live(seq);
  if (n >= s.n_tokens) return;
  const size_t keep = static_cast<size_t>((n + kBlockTokens - 1) / kBlockTokens);
  for (size_t i = keep; i < s.blocks.size(); ++i) release_block(s.blocks[i]);
  s.blocks.resize(keep);
  s.hashes.resize(std::min(s.hashes.size(), static_cast<size_t>(n / kBlockTokens)));
  s.n_tokens = n;
}

int KvBlockManager::fork(int seq) {
  live(seq);
  const int child = new_sequence();
  Sequence& c = seqs_[static_cast<size_t>(child)];
  const Sequence& p = seqs_[static_cast<size_t>(seq)];
  c.n_tokens = p.n_tokens;
  c.blocks = p.blocks;
  c.hashes = p.hashes;
  for (int32_t b : c.blocks) ++refcount_[static_cast<size_t>(b)];
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

// Whether appending n tokens must first copy the partly filled last block:
// it is shared with another sequence, or published (immutable).
bool KvBlockManager::must_copy(const Sequence& s, int64_t n) const {
  if (n <= 0 || s.n_tokens % kBlockTokens == 0 || s.blocks.empty()) return false;
  const auto b = static_cast<size_t>(s.blocks.back());
  return refcount_[b] > 1 || cached_[b].published;
}

int64_t KvBlockManager::blocks_needed(int seq, int64_t n) const {
  if (n < 0) fail("KV cache: append of {} tokens to sequence {}", n, seq);
  const Sequence& s = live(seq);
  const int64_t have = static_cast<int64_t>(s.blocks.size());
  const int64_t want = (s.n_tokens + n + kBlockTokens - 1) / kBlockTokens;
  return std::max<int64_t>(want - have, 0) + (must_copy(s, n) ? 1 : 0);
}

void KvBlockManager::append(int seq, int64_t n, std::vector<Copy>* copies) {
  const int64_t need = blocks_needed(seq, n);
  if (need > free_blocks())
    fail(
        "KV cache full: appending {} tokens needs {} more blocks of {} tokens, {} of {} are free "
        "(raise the context size -c)",
        n, need, kBlockTokens, free_blocks(), max_blocks_);
  Sequence& s = live(seq);
  const int64_t end = s.n_tokens + n;
  // Copy on write: the partly filled last block may be shared with a fork,
  // or published in the prefix cache.
  if (must_copy(s, n)) {
    const int32_t old = s.blocks.back();
    const int32_t fresh = take_block();
    if (copies) copies->push_back({old, fresh});
    release_block(old);
    s.blocks.back() = fresh;
  }
  while (static_cast<int64_t>(s.blocks.size()) * kBlockTokens < end)
    s.blocks.push_back(take_block());
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
  for (Sequence& s : seqs_) s.hashes.clear();
}

int64_t KvBlockManager::attach_prefix(int seq, std::span<const int32_t> tokens) {
  Sequence& s = live(seq);
  if (!prefix_on_) return 0;
  if (s.n_tokens != 0) fail("internal: KV cache: prefix attach to a non-empty sequence {}", seq);
  ++prefix_stats_.lookups;
  uint64_t parent = 0;
  const size_t n = tokens.size();
  for (size_t i = 0; (i + 1) * kBlockTokens < n; ++i) {  // at least one token stays
    const auto blk = tokens.subspan(i * kBlockTokens, kBlockTokens);
    const uint64_t h = block_hash(parent, blk);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const int32_t b = it->second;
    Cached& c = cached_[static_cast<size_t>(b)];
    if (c.parent != parent || !std::equal(blk.begin(), blk.end(), c.tokens.begin())) break;
    if (refcount_[static_cast<size_t>(b)] == 0) {
      lru_.erase(c.lru_tick);
      c.lru_tick = -1;
      ++n_in_use_;
    }
    ++refcount_[static_cast<size_t>(b)];
    s.blocks.push_back(b);
    s.hashes.push_back(h);
    s.n_tokens += kBlockTokens;
    ++prefix_stats_.hit_blocks;
    parent = h;
  }
  return s.n_tokens;
}

void KvBlockManager::publish(int seq, std::span<const int32_t> tokens) {
  Sequence& s = live(seq);
  if (!prefix_on_) return;
  const size_t full = static_cast<size_t>(
      std::min<int64_t>(s.n_tokens, static_cast<int64_t>(tokens.size())) / kBlockTokens);
  while (s.hashes.size() < full) {
    const size_t i = s.hashes.size();
    const uint64_t parent = i == 0 ? 0 : s.hashes[i - 1];
    const auto blk = tokens.subspan(i * kBlockTokens, kBlockTokens);
    const uint64_t h = block_hash(parent, blk);
    const int32_t b = s.blocks[i];
    Cached& c = cached_[static_cast<size_t>(b)];
    if (!c.published && by_hash_.find(h) == by_hash_.end()) {
      c.published = true;
      c.hash = h;
      c.parent = parent;
      std::copy(blk.begin(), blk.end(), c.tokens.begin());
      by_hash_.emplace(h, b);
      ++prefix_stats_.published;
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
  base_ = static_cast<uint16_t*>(p);
}

HostKvPool::~HostKvPool() {
  if (base_) munmap(base_, mapped_bytes_);
}

void HostKvPool::copy(int32_t from, int32_t to) {
  std::memcpy(block(to), block(from), static_cast<size_t>(layout_.bytes_per_block()));
}

PagedKvCache::PagedKvCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t max_tokens)
    : blocks_((max_tokens + kBlockTokens - 1) / kBlockTokens),
      pool_(KvLayout{n_layer, n_head_kv * head_dim}, blocks_.max_blocks()) {}

void PagedKvCache::append(int seq, int64_t n) {
  std::vector<KvBlockManager::Copy> copies;
  blocks_.append(seq, n, &copies);
  for (const auto& c : copies) pool_.copy(c.from, c.to);
}

uint16_t* PagedKvCache::slot(int64_t layer, int seq, int64_t pos, int kv) const {
  const std::vector<int32_t>& t = blocks_.table(seq);
  return pool_.block(t[static_cast<size_t>(pos / kBlockTokens)]) +
         pool_.layout().offset(layer, kv, pos % kBlockTokens);
}

}  // namespace barata
