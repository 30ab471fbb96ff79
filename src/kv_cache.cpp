#include "barata/kv_cache.h"

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
      seqs_[i] = Sequence{true, 0, {}};
      return static_cast<int>(i);
    }
  }
  seqs_.push_back(Sequence{true, 0, {}});
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
  s.n_tokens = n;
}

int KvBlockManager::fork(int seq) {
  live(seq);
  const int child = new_sequence();
  Sequence& c = seqs_[static_cast<size_t>(child)];
  const Sequence& p = seqs_[static_cast<size_t>(seq)];
  c.n_tokens = p.n_tokens;
  c.blocks = p.blocks;
  for (int32_t b : c.blocks) ++refcount_[static_cast<size_t>(b)];
  return child;
}

int32_t KvBlockManager::take_block() {
  // Released blocks first, then never-used ones in order: the pool's pages
  // are touched no further than the most blocks ever in use at once.
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = static_cast<int32_t>(refcount_.size());
    refcount_.push_back(0);
  }
  refcount_[static_cast<size_t>(b)] = 1;
  ++n_in_use_;
  return b;
}

void KvBlockManager::release_block(int32_t b) {
  if (--refcount_[static_cast<size_t>(b)] == 0) {
    free_.push_back(b);
    --n_in_use_;
  }
}

int64_t KvBlockManager::blocks_needed(int seq, int64_t n) const {
  if (n < 0) fail("KV cache: append of {} tokens to sequence {}", n, seq);
  const Sequence& s = live(seq);
  const int64_t have = static_cast<int64_t>(s.blocks.size());
  const int64_t want = (s.n_tokens + n + kBlockTokens - 1) / kBlockTokens;
  const bool cow = n > 0 && s.n_tokens % kBlockTokens != 0 && !s.blocks.empty() &&
                   refcount_[static_cast<size_t>(s.blocks.back())] > 1;
  return std::max<int64_t>(want - have, 0) + (cow ? 1 : 0);
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
  // Copy on write: the partly filled last block may be shared with a fork.
  if (n > 0 && s.n_tokens % kBlockTokens != 0 && !s.blocks.empty() &&
      refcount_[static_cast<size_t>(s.blocks.back())] > 1) {
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
