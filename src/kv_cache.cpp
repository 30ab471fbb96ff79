#include "barata/kv_cache.h"

#include <cstring>
#include <utility>

#include "barata/error.h"

namespace barata {

PagedKvCache::PagedKvCache(int64_t n_layer, int64_t n_head_kv, int64_t head_dim, int64_t max_tokens)
    : n_layer_(n_layer),
      kv_dim_(n_head_kv * head_dim),
      block_bytes_(2 * n_layer * kBlockTokens * n_head_kv * head_dim * 2),
      max_blocks_((max_tokens + kBlockTokens - 1) / kBlockTokens) {}

int PagedKvCache::new_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (!seqs_[i].live) {
      seqs_[i] = Sequence{true, 0, {}};
      return static_cast<int>(i);
    }
  }
  seqs_.push_back(Sequence{true, 0, {}});
  return static_cast<int>(seqs_.size() - 1);
}

const PagedKvCache::Sequence& PagedKvCache::live(int seq) const {
  if (seq < 0 || static_cast<size_t>(seq) >= seqs_.size() || !seqs_[static_cast<size_t>(seq)].live)
    fail("KV cache: sequence {} does not exist (never made, or freed)", seq);
  return seqs_[static_cast<size_t>(seq)];
}

PagedKvCache::Sequence& PagedKvCache::live(int seq) {
  return const_cast<Sequence&>(std::as_const(*this).live(seq));
}

int64_t PagedKvCache::length(int seq) const {
  return live(seq).n_tokens;
}

void PagedKvCache::free_sequence(int seq) {
  truncate(seq, 0);
  live(seq).live = false;
}

void PagedKvCache::truncate(int seq, int64_t n) {
  if (n < 0) fail("KV cache: truncate of sequence {} to {} tokens", seq, n);
  Sequence& s = live(seq);
  if (n >= s.n_tokens) return;
  const size_t keep = static_cast<size_t>((n + kBlockTokens - 1) / kBlockTokens);
  for (size_t i = keep; i < s.blocks.size(); ++i) release_block(s.blocks[i]);
  s.blocks.resize(keep);
  s.n_tokens = n;
}

int PagedKvCache::fork(int seq) {
  live(seq);
  const int child = new_sequence();
  Sequence& c = seqs_[static_cast<size_t>(child)];
  const Sequence& p = seqs_[static_cast<size_t>(seq)];
  c.n_tokens = p.n_tokens;
  c.blocks = p.blocks;
  for (int32_t b : c.blocks) ++refcount_[b];
  return child;
}

int32_t PagedKvCache::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    if (n_blocks_allocated_ >= max_blocks_)
      fail("KV cache full: all {} blocks of {} tokens are in use (raise the context size -c)",
           max_blocks_, kBlockTokens);
    blocks_.push_back(std::make_unique<uint16_t[]>(static_cast<size_t>(block_bytes_ / 2)));
    refcount_.push_back(0);
    b = static_cast<int32_t>(n_blocks_allocated_++);
  }
  refcount_[b] = 1;
  ++n_blocks_in_use_;
  return b;
}

void PagedKvCache::release_block(int32_t b) {
  if (--refcount_[b] == 0) {
    free_.push_back(b);
    --n_blocks_in_use_;
  }
}

void PagedKvCache::append(int seq, int64_t n) {
  if (n < 0) fail("KV cache: append of {} tokens to sequence {}", n, seq);
  Sequence& s = live(seq);
  const int64_t end = s.n_tokens + n;
  // Copy on write: the partly filled last block may be shared with a fork.
  if (s.n_tokens % kBlockTokens != 0 && !s.blocks.empty() && refcount_[s.blocks.back()] > 1) {
    const int32_t old = s.blocks.back();
    const int32_t fresh = take_block();
    std::memcpy(blocks_[fresh].get(), blocks_[old].get(), static_cast<size_t>(block_bytes_));
    release_block(old);
    s.blocks.back() = fresh;
  }
  while (static_cast<int64_t>(s.blocks.size()) * kBlockTokens < end)
    s.blocks.push_back(take_block());
  s.n_tokens = end;
}

uint16_t* PagedKvCache::slot(int64_t layer, int seq, int64_t pos, int kv) const {
  const Sequence& s = seqs_[static_cast<size_t>(seq)];
  uint16_t* block =
      blocks_[static_cast<size_t>(s.blocks[static_cast<size_t>(pos / kBlockTokens)])].get();
  // Block layout: [layer][K|V][token in block][kv_dim].
  return block + ((layer * 2 + kv) * kBlockTokens + pos % kBlockTokens) * kv_dim_;
}

}  // namespace barata
