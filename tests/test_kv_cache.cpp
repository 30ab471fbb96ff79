// PagedKvCache block bookkeeping: fork shares blocks by reference count,
// copy on write keeps a shared block's tokens intact for every owner,
// truncate and free give blocks back, and misuse is a barata::Error.
#include <algorithm>
#include <cstdint>
#include <set>

#include <gtest/gtest.h>

#include "barata/error.h"
#include "barata/kv_cache.h"
#include "barata/model_config.h"

namespace barata {
namespace {

constexpr int64_t kLayers = 2, kHeads = 2, kHeadDim = 4, kDim = kHeads * kHeadDim;
constexpr int64_t B = PagedKvCache::kBlockTokens;

// A value that names (layer, seq tag, pos, K/V, element), so a token written
// for one sequence is told apart from any other.
uint16_t tag(int64_t layer, int owner, int64_t pos, int kv, int64_t j) {
  return static_cast<uint16_t>((layer * 7 + owner * 131 + pos * 3 + kv * 17 + j) & 0xffff);
}

void write(PagedKvCache& c, int seq, int owner, int64_t from, int64_t to) {
  for (int64_t p = from; p < to; ++p)
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t j = 0; j < kDim; ++j) {
        c.k(l, seq, p)[j] = tag(l, owner, p, 0, j);
        c.v(l, seq, p)[j] = tag(l, owner, p, 1, j);
      }
}

// Positions [from, to) of seq hold what `owner` wrote there.
::testing::AssertionResult holds(const PagedKvCache& c, int seq, int owner, int64_t from,
                                 int64_t to) {
  for (int64_t p = from; p < to; ++p)
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t j = 0; j < kDim; ++j)
        if (c.k(l, seq, p)[j] != tag(l, owner, p, 0, j) ||
            c.v(l, seq, p)[j] != tag(l, owner, p, 1, j))
          return ::testing::AssertionFailure()
                 << "seq " << seq << " pos " << p << " layer " << l << " elem " << j
                 << " is not owner " << owner << "'s";
  return ::testing::AssertionSuccess();
}

TEST(KvCache, ForkSharesEveryBlockUntilAWrite) {
  PagedKvCache c(kLayers, kHeads, kHeadDim, 8 * B);
  const int a = c.new_sequence();
  c.append(a, B + 5);  // one full block and a partial one
  write(c, a, 0, 0, B + 5);
  EXPECT_EQ(c.blocks_in_use(), 2);
  const int b = c.fork(a);
  EXPECT_NE(a, b);
  EXPECT_EQ(c.length(b), B + 5);
  EXPECT_EQ(c.blocks_in_use(), 2);  // nothing copied yet
  EXPECT_TRUE(holds(c, b, 0, 0, B + 5));
  // The first token either one appends is written into the shared partial
  // block: it is copied for the writer, and the other keeps its own.
  c.append(b, 3);
  EXPECT_EQ(c.blocks_in_use(), 3);
  write(c, b, 1, B + 5, B + 8);
  EXPECT_TRUE(holds(c, b, 0, 0, B + 5));
  EXPECT_TRUE(holds(c, b, 1, B + 5, B + 8));
  EXPECT_EQ(c.length(a), B + 5);
  c.append(a, 3);
  EXPECT_EQ(c.blocks_in_use(), 3);  // a's partial block is its own again: no copy
  write(c, a, 2, B + 5, B + 8);
  EXPECT_TRUE(holds(c, a, 0, 0, B + 5));
  EXPECT_TRUE(holds(c, a, 2, B + 5, B + 8));
  EXPECT_TRUE(holds(c, b, 1, B + 5, B + 8));  // b is untouched by a's write
  // The full first block is still one block for both.
  EXPECT_EQ(c.k(0, a, 0), c.k(0, b, 0));
  EXPECT_NE(c.k(0, a, B), c.k(0, b, B));
}

TEST(KvCache, ForkAtABlockEdgeSharesAllAndAppendsFreshBlocks) {
  PagedKvCache c(kLayers, kHeads, kHeadDim, 8 * B);
  const int a = c.new_sequence();
  c.append(a, 2 * B);
  write(c, a, 0, 0, 2 * B);
  const int b = c.fork(a);
  c.append(b, 1);
  EXPECT_EQ(c.blocks_in_use(), 3);  // a new block, nothing copied
  write(c, b, 1, 2 * B, 2 * B + 1);
  EXPECT_TRUE(holds(c, a, 0, 0, 2 * B));
  EXPECT_TRUE(holds(c, b, 0, 0, 2 * B));
}

TEST(KvCache, FreeingOneOwnerKeepsTheOthersTokens) {
  PagedKvCache c(kLayers, kHeads, kHeadDim, 8 * B);
  const int a = c.new_sequence();
  c.append(a, 2 * B + 1);
  write(c, a, 0, 0, 2 * B + 1);
  const int b = c.fork(a);
  const int d = c.fork(b);  // three owners of three blocks
  EXPECT_EQ(c.blocks_in_use(), 3);
  c.free_sequence(a);
  EXPECT_EQ(c.blocks_in_use(), 3);
  EXPECT_TRUE(holds(c, b, 0, 0, 2 * B + 1));
  c.free_sequence(b);
  EXPECT_TRUE(holds(c, d, 0, 0, 2 * B + 1));
  c.free_sequence(d);
  EXPECT_EQ(c.blocks_in_use(), 0);
  // Freed blocks are reused before new ones are allocated.
  const int64_t allocated = c.bytes_allocated();
  const int e = c.new_sequence();
  c.append(e, 3 * B);
  EXPECT_EQ(c.bytes_allocated(), allocated);
  EXPECT_EQ(c.blocks_in_use(), 3);
}

TEST(KvCache, TruncateInsideASharedBlockThenAppendCopiesIt) {
  PagedKvCache c(kLayers, kHeads, kHeadDim, 8 * B);
  const int a = c.new_sequence();
  c.append(a, B + 10);
  write(c, a, 0, 0, B + 10);
  const int b = c.fork(a);
  c.truncate(b, B + 4);  // b keeps both blocks, the second still shared
  EXPECT_EQ(c.length(b), B + 4);
  EXPECT_EQ(c.blocks_in_use(), 2);
  c.append(b, 2);  // overwrites positions B+4, B+5 of its copy only
  write(c, b, 1, B + 4, B + 6);
  EXPECT_TRUE(holds(c, a, 0, 0, B + 10));
  EXPECT_TRUE(holds(c, b, 0, 0, B + 4));
  EXPECT_TRUE(holds(c, b, 1, B + 4, B + 6));
  c.truncate(b, 3);  // drops b's second block (its copy) back to the pool
  EXPECT_EQ(c.blocks_in_use(), 2);
  c.truncate(a, 0);
  EXPECT_EQ(c.blocks_in_use(), 1);  // the first block, still b's
  EXPECT_TRUE(holds(c, b, 0, 0, 3));
}

TEST(KvCache, PoolExhaustionAndMisuseAreErrors) {
  PagedKvCache c(kLayers, kHeads, kHeadDim, 2 * B);
  const int a = c.new_sequence();
  c.append(a, 2 * B);
  EXPECT_THROW(c.append(a, 1), Error);
  const int b = c.fork(a);
  EXPECT_EQ(c.blocks_in_use(), 2);
  c.free_sequence(b);
  EXPECT_THROW(c.fork(b), Error);
  EXPECT_THROW(c.append(b, 1), Error);
  EXPECT_THROW(c.length(b), Error);
  EXPECT_THROW(c.length(99), Error);
  EXPECT_THROW(c.truncate(a, -1), Error);
  EXPECT_THROW(c.append(a, -1), Error);
  // The bookkeeping is what it was before the failed calls.
  EXPECT_EQ(c.length(a), 2 * B);
  EXPECT_EQ(c.blocks_in_use(), 2);
  // bytes per token: K and V, every layer, fp16.
  EXPECT_EQ(c.bytes_per_token(), 2 * kLayers * kDim * 2);
}

// ---- prefix caching (KvBlockManager) -----------------------------------------

std::vector<int32_t> ids(int64_t n, int32_t salt = 0) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(i * 3 + salt));
  return v;
}

TEST(PrefixCache, PublishedBlocksAreTakenByReference) {
  KvBlockManager m(16);
  m.set_prefix_caching(true);
  const auto t = ids(3 * B + 5);
  const int a = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(a, t), 0) << "a cold cache";
  m.append(a, static_cast<int64_t>(t.size()), nullptr);
  m.publish(a, t);
  EXPECT_EQ(m.cached_blocks(), 3) << "full blocks only";
  const int b = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(b, t), 3 * B);
  EXPECT_EQ(m.length(b), 3 * B);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(m.table(b)[static_cast<size_t>(i)], m.table(a)[static_cast<size_t>(i)]);
    EXPECT_EQ(m.refcount(m.table(a)[static_cast<size_t>(i)]), 2);
  }
  EXPECT_EQ(m.shared_blocks(), 3);
  EXPECT_EQ(m.blocks_in_use(), 4) << "nothing new taken";
  // A prompt that is exactly 3 blocks leaves its last block to compute.
  const int c = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(c, std::span(t).first(3 * B)), 2 * B);
  // A different second block stops the match after the first.
  auto u = t;
  u[B + 2] += 1;
  const int d = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(d, u), B);
  // The chain is on content and position: the same tokens later in a prompt do not match.
  auto shifted = ids(B, 99);
  shifted.insert(shifted.end(), t.begin(), t.end());
  const int e = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(e, shifted), 0);
}

TEST(PrefixCache, FreedBlocksStayCachedAndAreEvictedLeastRecentlyUsedFirst) {
  KvBlockManager m(4);
  m.set_prefix_caching(true);
  const auto t1 = ids(2 * B, 1), t2 = ids(2 * B, 2);
  const int a = m.new_sequence();
  m.append(a, 2 * B, nullptr);
  m.publish(a, t1);
  m.free_sequence(a);
  const int b = m.new_sequence();
  m.append(b, 2 * B, nullptr);
  m.publish(b, t2);
  m.free_sequence(b);
  EXPECT_EQ(m.blocks_in_use(), 0);
  EXPECT_EQ(m.free_blocks(), 4) << "cached blocks count as free";
  EXPECT_EQ(m.cached_blocks(), 4);
  // t1 used again: t2's blocks are now the least recently used.
  const int c = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(c, ids(2 * B + 1, 1)), 2 * B);
  m.free_sequence(c);
  const int d = m.new_sequence();
  m.append(d, B, nullptr);  // needs one block: evicts t2's first
  EXPECT_EQ(m.prefix_stats().evictions, 1);
  const int e = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(e, ids(2 * B + 1, 1)), 2 * B) << "t1 survived";
  const int f = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(f, ids(2 * B + 1, 2)), 0) << "t2's chain is broken";
}

TEST(PrefixCache, APublishedBlockIsCopiedBeforeAWrite) {
  KvBlockManager m(8);
  m.set_prefix_caching(true);
  const auto t = ids(2 * B);
  const int a = m.new_sequence();
  m.append(a, 2 * B, nullptr);
  m.publish(a, t);
  const int32_t second = m.table(a)[1];
  m.truncate(a, B + 3);  // into the published second block
  std::vector<KvBlockManager::Copy> copies;
  EXPECT_EQ(m.blocks_needed(a, 1), 1);
  m.append(a, 1, &copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].from, second);
  EXPECT_NE(m.table(a)[1], second);
  const int b = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(b, ids(2 * B + 1)), 2 * B) << "the cached block is intact";
  EXPECT_EQ(m.table(b)[1], second);
}

TEST(PrefixCache, OffByDefaultAndClearable) {
  KvBlockManager m(8);
  const auto t = ids(2 * B + 1);
  const int a = m.new_sequence();
  m.append(a, 2 * B, nullptr);
  m.publish(a, t);
  EXPECT_EQ(m.cached_blocks(), 0);
  m.set_prefix_caching(true);
  m.publish(a, t);
  EXPECT_EQ(m.cached_blocks(), 2);
  m.free_sequence(a);
  m.clear_prefix_cache();
  EXPECT_EQ(m.cached_blocks(), 0);
  EXPECT_EQ(m.free_blocks(), 8);
  const int b = m.new_sequence();
  EXPECT_EQ(m.attach_prefix(b, t), 0);
}

}  // namespace
}  // namespace barata

namespace barata {
namespace {

int64_t released(const std::vector<int32_t>& t) {
  return std::count(t.begin(), t.end(), KvBlockManager::kNoBlock);
}

// A full-attention group keeps every block; a sliding group (window 32,
// keep_back 16) releases those whose positions the next row can no longer
// see, as the sequence grows, and they go back to the shared pool.
TEST(KvGroups, ASlidingGroupReleasesTheBlocksBehindItsWindow) {
  KvBlockManager m(100, {0, 32}, 16);
  ASSERT_EQ(m.n_groups(), 2);
  ASSERT_TRUE(m.has_sliding_groups());
  const int s = m.new_sequence();
  std::vector<KvBlockManager::Copy> copies;
  m.append(s, 10, &copies);
  EXPECT_EQ(m.blocks_held(s), 2);  // one block per group
  for (int i = 0; i < 190; ++i) m.append(s, 1, &copies);
  ASSERT_EQ(m.length(s), 200);
  // The last append (position 199) sees from 199 + 1 - 32 = 168; keep_back
  // 16 more: 152, so blocks 0..8 (positions < 144... 152) went back.
  EXPECT_EQ(m.table(s, 0).size(), 13u);
  EXPECT_EQ(released(m.table(s, 0)), 0);
  EXPECT_EQ(m.table(s, 1).size(), 13u);
  EXPECT_EQ(released(m.table(s, 1)), 9);
  EXPECT_EQ(m.blocks_held(s), 13 + 4);
  EXPECT_EQ(m.blocks_in_use(), 17);
  EXPECT_TRUE(copies.empty());
  // Released blocks are taken again: a second sequence fills the pool's rest.
  const int t = m.new_sequence();
  EXPECT_EQ(m.blocks_needed(t, 16 * 41), 82);
  EXPECT_TRUE(m.can_append(t, 16 * 41));
  EXPECT_FALSE(m.can_append(t, 16 * 42));
  m.free_sequence(t);

  // Back within keep_back: row 190 sees from 159, block 9 is still held.
  m.truncate(s, 190);
  EXPECT_EQ(m.length(s), 190);
  // Further back is refused: row 150 would see from 119, in released block 7.
  EXPECT_TRUE(m.can_truncate(s, 180));
  EXPECT_FALSE(m.can_truncate(s, 150));
  EXPECT_TRUE(m.can_truncate(s, 0));
  try {
    m.truncate(s, 150);
    ADD_FAILURE() << "truncate past the released blocks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot go back to 150 of its 190 tokens"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(m.length(s), 190);
  // A fork shares the held blocks; freeing both gives everything back.
  const int f = m.fork(s);
  EXPECT_EQ(m.blocks_held(f), m.blocks_held(s));
  m.free_sequence(s);
  m.free_sequence(f);
  EXPECT_EQ(m.blocks_in_use(), 0);
  // Truncating to 0 is always allowed.
  const int u = m.new_sequence();
  for (int i = 0; i < 20; ++i) m.append(u, 16, &copies);
  m.truncate(u, 0);
  EXPECT_EQ(m.blocks_in_use(), 0);
}

// One sequence may run past max_tokens() when its sliding groups give their
// blocks back as it goes: peak_blocks bounds what it holds, appended chunk by
// chunk, and max_sequence_tokens is the longest that fits the pool alone.
TEST(KvGroups, ALongSequenceFitsWhereItsWindowsBlocksGoBack) {
  KvBlockManager full(20);
  EXPECT_EQ(full.peak_blocks(100, 16), full.blocks_for_tokens(100));
  EXPECT_EQ(full.max_sequence_tokens(16), full.max_tokens());

  KvBlockManager m(20, {0, 32}, 64);
  ASSERT_EQ(m.max_tokens(), 160);  // 10 blocks per group
  // A chunk of 16 at most: the sliding group spans 16 + 32 + 64 - 1 = 111
  // positions, 8 blocks at most; the full group one block per 16.
  EXPECT_EQ(m.peak_blocks(16, 16), 2);
  EXPECT_EQ(m.peak_blocks(192, 16), 12 + 8);
  EXPECT_EQ(m.peak_blocks(193, 16), 13 + 8);
  EXPECT_EQ(m.max_sequence_tokens(16), 192);
  // Bigger chunks keep more of the window's blocks.
  EXPECT_LT(m.max_sequence_tokens(64), 192);
  for (int64_t n = 1; n < 400; ++n) EXPECT_LE(m.peak_blocks(n, 16), m.peak_blocks(n + 1, 16));

  // And so it goes: 192 tokens in chunks of 16, never above the bound, each
  // append's need counting the blocks its slide gives back first.
  const int s = m.new_sequence();
  std::vector<KvBlockManager::Copy> copies;
  for (int64_t n = 16; n <= 192; n += 16) {
    ASSERT_TRUE(m.can_append(s, 16)) << "at " << n - 16 << ": needs " << m.blocks_needed(s, 16)
                                     << ", " << m.free_blocks() << " free";
    m.append(s, 16, &copies);
    EXPECT_LE(m.blocks_held(s), m.peak_blocks(n, 16)) << n;
  }
  EXPECT_EQ(m.length(s), 192);
  EXPECT_EQ(m.free_blocks(), 20 - m.blocks_held(s));
  // The bound may be one block high per sliding group: the real sequence
  // goes on a little (here to 208), never past what the full group holds.
  while (m.can_append(s, 16)) m.append(s, 16, &copies);
  EXPECT_GE(m.length(s), m.max_sequence_tokens(16));
  EXPECT_LE(m.length(s), 19 * 16);
  EXPECT_EQ(m.free_blocks(), 20 - m.blocks_held(s));
}

// Prefix caching with a sliding group: the full group's blocks of the whole
// run are taken, and of the sliding group only those a sequence of that
// length keeps; a sliding block evicted from the cache shortens the hit to a
// run whose window is still whole.
TEST(KvGroups, PrefixCachingTakesTheFullBlocksAndTheWindowsBlocks) {
  KvBlockManager m(64, {0, 32}, 16);
  m.set_prefix_caching(true);
  ASSERT_TRUE(m.prefix_caching());
  std::vector<int32_t> tok(260);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>(i * 7 % 101);
  std::vector<KvBlockManager::Copy> copies;
  const int a = m.new_sequence();
  for (int i = 0; i < 13; ++i) {  // 208 tokens, published as they are written
    m.append(a, 16, &copies);
    m.publish(a, tok);
  }
  // The last append's first row, 193, sees from 162; 16 kept back: 146,
  // block 9. Blocks 0..8 of the sliding group went back, cached.
  EXPECT_EQ(released(m.table(a, 1)), 9);
  const std::vector<int32_t> full_a = m.table(a, 0), slid_a = m.table(a, 1);
  m.free_sequence(a);

  const int b = m.new_sequence();
  const std::span<const int32_t> prompt(tok.data(), 200);
  // 200 tokens: 12 whole blocks leave one token to compute.
  EXPECT_EQ(m.attach_prefix(b, prompt), 192);
  EXPECT_EQ(m.length(b), 192);
  const auto& fb = m.table(b, 0);
  const auto& sb = m.table(b, 1);
  ASSERT_EQ(fb.size(), 12u);
  ASSERT_EQ(sb.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(fb[i], full_a[i]) << i;
  // A sequence of 192 keeps the sliding blocks from (193 - 32 - 16) / 16 = 9.
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(sb[i], KvBlockManager::kNoBlock) << i;
  for (size_t i = 9; i < 12; ++i) EXPECT_EQ(sb[i], slid_a[i]) << i;
  EXPECT_EQ(m.blocks_held(b), 12 + 3);
  // Truncation within keep_back works as for any sequence of this length.
  EXPECT_TRUE(m.can_truncate(b, 180));
  EXPECT_FALSE(m.can_truncate(b, 100));
  // Appending copies nothing (the run ends on a block boundary).
  m.append(b, 8, &copies);
  EXPECT_TRUE(copies.empty());
  m.free_sequence(b);

  // Published only at the end: the sliding blocks 0..8 were gone by then and
  // never cached. A prompt of 200 still finds its window (blocks 9..11); one
  // of 150 (a run of 9 blocks would keep sliding blocks 6..8) finds no run
  // whose window is whole, though the full group has all 9 blocks.
  KvBlockManager late(64, {0, 32}, 16);
  late.set_prefix_caching(true);
  const int e = late.new_sequence();
  for (int i = 0; i < 13; ++i) late.append(e, 16, &copies);
  late.publish(e, tok);
  late.free_sequence(e);
  const int f = late.new_sequence();
  EXPECT_EQ(late.attach_prefix(f, prompt), 192);
  late.free_sequence(f);
  const int g = late.new_sequence();
  EXPECT_EQ(late.attach_prefix(g, std::span<const int32_t>(tok.data(), 150)), 0);
  EXPECT_EQ(late.length(g), 0);
  EXPECT_TRUE(late.table(g, 0).empty());
  late.free_sequence(g);
  EXPECT_EQ(late.blocks_in_use(), 0);
  EXPECT_EQ(m.blocks_in_use(), 0);
}

// Gemma 3 270M's 18 layers (every sixth global): groups of 3 layers, one of
// the 3 global layers, five of local ones; a block is 3 layers' worth.
TEST(KvGroups, Gemma3sLayersSplitIntoGroupsOfOneKind) {
  ModelConfig c;
  c.n_layer = 18;
  c.n_head_kv = 1;
  c.head_dim = 256;
  c.n_swa = 512;
  c.swa_layers.assign(18, 1);
  for (int l = 5; l < 18; l += 6) c.swa_layers[static_cast<size_t>(l)] = 0;
  c.n_swa_layers = 15;
  const KvLayout L = kv_layout_for(c, false);
  EXPECT_EQ(L.n_groups(), 6);
  EXPECT_EQ(L.layers_per_block(), 3);
  EXPECT_EQ(L.group_window, (std::vector<int64_t>{0, 512, 512, 512, 512, 512}));
  EXPECT_EQ(L.group(5), 0);
  EXPECT_EQ(L.index(5), 0);
  EXPECT_EQ(L.group(11), 0);
  EXPECT_EQ(L.index(17), 2);
  EXPECT_EQ(L.group(0), 1);
  EXPECT_EQ(L.index(0), 0);
  EXPECT_EQ(L.group(4), 2);  // local layers 0..4, 6.. fill groups 1..5 in order
  EXPECT_EQ(L.index(4), 1);
  EXPECT_EQ(L.bytes_per_block() * L.n_groups(), 16 * L.bytes_per_token());
  // Every (group, index) is one layer's.
  std::set<std::pair<int, int64_t>> seen;
  for (int64_t l = 0; l < 18; ++l) EXPECT_TRUE(seen.insert({L.group(l), L.index(l)}).second);
  // --swa-full: one group of every layer, as before.
  const KvLayout F = kv_layout_for(c, true);
  EXPECT_EQ(F.n_groups(), 1);
  EXPECT_EQ(F.layers_per_block(), 18);
  EXPECT_EQ(F.index(7), 7);
}

}  // namespace
}  // namespace barata
