// The paged attention kernels (kernels/attention.cu), run under the CUDA host
// emulation, against a float64 reference on the same fp16 K/V; and the
// softmax merge helpers (kernels/softmax_merge.cuh) on the host directly.
//
// Error bound. K/V are the same fp16 values on both sides, so the only
// difference is fp32 arithmetic in the kernels: a score is a dot of head_dim
// <= 256 products (|q| <= 4, |k| <= 1, so |s| stays within a few tens) with
// relative rounding ~ head_dim * 2^-24 in the worst case; exp and the running
// sums add a few ulps per tile. The output is a convex combination of V rows
// with |v| <= 1, so an absolute error of order 1e-6 is expected; the tests
// allow 1e-4 * max(1, max |ref|), which stays far below any indexing or
// masking mistake (those move outputs by 1e-2 or more) and prints the error.
//
// Every pool slot that is not a written K/V of the layer under test holds
// fp16 NaN, so a read of the wrong block, layer, head or position, or a
// masked key whose V is not ignored, turns the output into NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "barata/error.h"
#include "barata/half.h"
#include "barata/kv_types.h"
#include "softmax_merge.cuh"

namespace barata {
namespace {

using cuda::AttnArgs;
using cuda::DecodeSplit;
using cuda::KvDeviceView;
using cuda::PrefillTile;

constexpr int kBlock = 16;

struct Shape {
  int head_dim, n_head, n_head_kv;
};

std::string name(const Shape& s) {
  return "hd " + std::to_string(s.head_dim) + ", " + std::to_string(s.n_head) + "/" +
         std::to_string(s.n_head_kv) + " heads";
}

// A pool of blocks holding several sequences whose blocks are scattered (a
// random permutation of the pool), two layers, tests on layer 1; K and V in
// the cache types kt / vt (kv_types.h), written by the host's reference codec.
class Cache {
 public:
  Cache(const Shape& s, const std::vector<int>& lengths, std::mt19937& rng,
        KvType kt = KvType::kF16, KvType vt = KvType::kF16)
      : shape_(s), kv_dim_(s.n_head_kv * s.head_dim), kt_(kt), vt_(vt) {
    k_row_ = kv_row_bytes(kt, kv_dim_);
    v_row_ = kv_row_bytes(vt, kv_dim_);
    int n_blocks = 0;
    for (int len : lengths) n_blocks += (len + kBlock - 1) / kBlock;
    n_blocks = 2 * n_blocks + 3;  // free blocks between the used ones
    block_bytes_ = int64_t{kLayers} * kBlock * (k_row_ + v_row_);
    // NaN everywhere (fp16 0x7e7e; a quantized block's scale too).
    pool_.assign(static_cast<size_t>(n_blocks * block_bytes_), kNanByte);
    std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(kv_dim_));
    size_t next = 0;
    for (int len : lengths) {
      const int seq = static_cast<int>(lengths_.size());
      table_start_.push_back(static_cast<int32_t>(tables_.size()));
      lengths_.push_back(len);
      values_.emplace_back();
      for (int b = 0; b < (len + kBlock - 1) / kBlock; ++b) tables_.push_back(perm[next++]);
      tables_.push_back(-1);  // a bad entry right after each table: must never be read
      for (int p = 0; p < len; ++p)
        for (int kv = 0; kv < 2; ++kv) {
          for (float& e : x) e = u(rng);
          uint8_t* dst = pool_.data() + offset(seq, p, kv);
          kv_quantize_row(kv == 0 ? kt : vt, x.data(), dst, kv_dim_);
          std::vector<float> back(x.size());
          kv_dequantize_row(kv == 0 ? kt : vt, dst, back.data(), kv_dim_);
          values_.back().push_back(std::move(back));
        }
    }
  }

  KvDeviceView view() {
    KvDeviceView v;
    v.pool = pool_.data();
    v.block_bytes = block_bytes_;
    v.layer = kLayer;
    v.kv_dim = kv_dim_;
    v.block_tokens = kBlock;
    v.k_row = static_cast<int32_t>(k_row_);
    v.v_row = static_cast<int32_t>(v_row_);
    v.k_type = kt_;
    v.v_type = vt_;
    v.block_tables = tables_.data();
    return v;
  }

  // Byte offset of K (kv 0) or V (kv 1) of position p of sequence seq.
  int64_t offset(int seq, int p, int kv) const {
    const int64_t block = tables_[static_cast<size_t>(table_start_[seq] + p / kBlock)];
    return block * block_bytes_ + kLayer * int64_t{kBlock} * (k_row_ + v_row_) +
           (kv == 0 ? 0 : kBlock * k_row_) + (p % kBlock) * (kv == 0 ? k_row_ : v_row_);
  }
  // The value the cache holds (the reference codec's decoding).
  double at(int seq, int p, int kv, int head, int d) const {
    return values_[static_cast<size_t>(seq)][static_cast<size_t>(2 * p + kv)]
                  [static_cast<size_t>(head * shape_.head_dim + d)];
  }
  BatchRowMeta row(int seq, int pos) const {
    BatchRowMeta m;
    m.pos = pos;
    m.table = table_start_[seq];
    m.slot = tables_[static_cast<size_t>(table_start_[seq] + pos / kBlock)] * kBlock + pos % kBlock;
    m.seq = seq;
    return m;
  }
  KvType k_type() const { return kt_; }

 private:
  static constexpr int kLayers = 2, kLayer = 1;
  static constexpr uint8_t kNanByte = 0x7e;
  Shape shape_;
  int kv_dim_;
  KvType kt_, vt_;
  int64_t k_row_ = 0, v_row_ = 0, block_bytes_ = 0;
  std::vector<uint8_t> pool_;
  std::vector<int32_t> tables_, table_start_;
  std::vector<int> lengths_;
  std::vector<std::vector<std::vector<float>>> values_;  // [seq][2 p + kv][kv_dim]
};

// out[row][h * hd + d] in float64: row attends positions [0, pos] of its sequence.
std::vector<double> reference(const Cache& c, const Shape& s, const std::vector<float>& q,
                              const std::vector<BatchRowMeta>& rows, float scale) {
  const int hd = s.head_dim, group = s.n_head / s.n_head_kv;
  const size_t q_dim = static_cast<size_t>(s.n_head) * hd;
  std::vector<double> out(rows.size() * q_dim);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int n = rows[r].pos + 1;
    for (int h = 0; h < s.n_head; ++h) {
      const int kvh = h / group;
      // Int keys meet the query rounded to 8 bits per block (kv_int_keys).
      const float* qf = q.data() + r * q_dim + static_cast<size_t>(h) * hd;
      std::vector<double> qh(qf, qf + hd);
      if (kv_int_keys(c.k_type())) {
        std::vector<int8_t> codes(static_cast<size_t>(hd));
        std::vector<float> db(static_cast<size_t>(hd / 32));
        kv_quantize_query(qf, codes.data(), db.data(), hd);
        for (int d = 0; d < hd; ++d)
          qh[static_cast<size_t>(d)] = static_cast<double>(
              db[static_cast<size_t>(d / 32)] * static_cast<float>(codes[static_cast<size_t>(d)]));
      }
      std::vector<double> sc(static_cast<size_t>(n));
      double mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int d = 0; d < hd; ++d)
          dot += qh[static_cast<size_t>(d)] * c.at(rows[r].seq, j, 0, kvh, d);
        sc[static_cast<size_t>(j)] = dot * static_cast<double>(scale);
        mx = std::max(mx, sc[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (double& v : sc) sum += (v = std::exp(v - mx));
      double* o = out.data() + r * q_dim + static_cast<size_t>(h) * hd;
      for (int j = 0; j < n; ++j)
        for (int d = 0; d < hd; ++d)
          o[d] += sc[static_cast<size_t>(j)] / sum * c.at(rows[r].seq, j, 1, kvh, d);
    }
  }
  return out;
}

std::vector<float> random_q(size_t n, float amp, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<float> q(n);
  for (float& v : q) v = u(rng);
  return q;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  double max_ref = 0, max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(want[i]));
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= max_err)) {  // NaN counts as the worst
      max_err = std::isnan(e) ? INFINITY : e;
      worst = i;
    }
  }
  const double tol = 1e-4 * std::max(1.0, max_ref);
  EXPECT_LE(max_err, tol) << what << ": element " << worst << " got " << got[worst] << " want "
                          << want[worst];
  std::printf("  %-52s max err %.3g (max |ref| %.3g)\n", what.c_str(), max_err, max_ref);
}

AttnArgs args(const Shape& s) {
  AttnArgs a;
  a.n_head = s.n_head;
  a.n_head_kv = s.n_head_kv;
  a.head_dim = s.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  return a;
}

// Under ASan the emulator's fiber switches cost ~30x more: fewer shapes there.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Whether shape i of kShapes runs in a test that loops over all of them.
bool run_shape(int i) {
  return !kSanitized || i == 1 || i == 4 || i == 8;
}

const Shape kShapes[] = {
    {64, 4, 4},   // MHA
    {64, 8, 2},   // GQA 4
    {128, 7, 1},  // GQA 7, one KV head
    {128, 4, 2},  // GQA 2
    {48, 6, 3},   // odd head dim, GQA 2
    {80, 8, 8},   // odd head dim, MHA
    {32, 16, 8},  // small head dim, GQA 2, 8 KV heads
    {256, 4, 2},  // largest head dim
    {34, 3, 1},   // head dim not a multiple of 8 (4-byte loads)
};

// A prefill batch: each sequence has `cached` tokens already in the cache and
// appends `fresh` rows; tiles of up to 16 rows (some shorter).
struct PrefillSeq {
  int cached, fresh;
};

void run_prefill(const Shape& s, const std::vector<PrefillSeq>& seqs, float q_amp, uint32_t seed,
                 int max_tile, KvType kt = KvType::kF16, KvType vt = KvType::kF16) {
  std::mt19937 rng(seed);
  std::vector<int> lengths;
  for (const PrefillSeq& p : seqs) lengths.push_back(p.cached + p.fresh);
  Cache c(s, lengths, rng, kt, vt);
  std::vector<BatchRowMeta> rows;
  std::vector<PrefillTile> tiles;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int r0 = 0; r0 < seqs[i].fresh; r0 += max_tile) {
      PrefillTile t;
      t.n_rows = std::min(max_tile, seqs[i].fresh - r0);
      t.row0 = static_cast<int32_t>(rows.size());
      for (int r = 0; r < t.n_rows; ++r)
        rows.push_back(c.row(static_cast<int>(i), seqs[i].cached + r0 + r));
      tiles.push_back(t);
    }
  }
  const size_t q_dim = static_cast<size_t>(s.n_head) * s.head_dim;
  const std::vector<float> q = random_q(rows.size() * q_dim, q_amp, rng);
  std::vector<float> out(q.size(), NAN);
  const AttnArgs a = args(s);
  cuda::launch_attention_prefill(q.data(), out.data(), rows.data(), tiles.data(),
                                 static_cast<int64_t>(tiles.size()), a, c.view(), nullptr);
  expect_close(out, reference(c, s, q, rows, a.scale),
               "prefill " + name(s) + ", K " + kv_type_name(kt) + " V " + kv_type_name(vt));
}

TEST(EmuAttention, PrefillShapesAndBlockEdges) {
  // Lengths 1, 15, 16, 17, 33, 70 from an empty cache, in one batch; the
  // shapes other than three get a shorter set (the emulation is slow).
  const std::vector<PrefillSeq> full = {{0, 1}, {0, 15}, {0, 16}, {0, 17}, {0, 33}, {0, 70}};
  const std::vector<PrefillSeq> brief = {{0, 1}, {0, 16}, {0, 17}, {0, 40}};
  uint32_t seed = 1;
  int i = 0;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(name(s));
    const bool all = i == 0 || i == 2 || i == 4;  // MHA 64, GQA 7 at 128, head dim 48
    if (!run_shape(i++)) continue;
    run_prefill(s, all ? full : brief, 4.0f, seed++, cuda::kPrefillTileRows);
  }
}

TEST(EmuAttention, PrefillAppendedToCache) {
  // Prompts appended to non-empty caches, tile starts off block boundaries.
  const std::vector<PrefillSeq> seqs = {{17, 15}, {16, 1}, {5, 33}, {48, 20}, {1, 16}};
  uint32_t seed = 100;
  for (const Shape& s : kSanitized
                            ? std::vector<Shape>{kShapes[2]}
                            : std::vector<Shape>{kShapes[1], kShapes[2], kShapes[4], kShapes[7]}) {
    SCOPED_TRACE(name(s));
    run_prefill(s, seqs, 4.0f, seed++, cuda::kPrefillTileRows);
  }
}

TEST(EmuAttention, PrefillShortTiles) {
  // Tiles of 5 rows (and a remainder), so tiles start mid-block and CTAs
  // have fewer rows than the tile size.
  const std::vector<PrefillSeq> seqs = {{3, 23}, {0, 9}, {30, 4}};
  uint32_t seed = 200;
  for (const Shape& s : {kShapes[0], kShapes[2], kShapes[5]}) {
    SCOPED_TRACE(name(s));
    run_prefill(s, seqs, 4.0f, seed++, 5);
  }
}

TEST(EmuAttention, PrefillLargeScores) {
  // Scores of several tens: the running max changes tile to tile and the
  // rescaling of l and acc matters.
  const std::vector<PrefillSeq> seqs = {{20, 30}, {0, 40}};
  run_prefill(kShapes[3], seqs, 40.0f, 300, cuda::kPrefillTileRows);
  run_prefill(kShapes[4], seqs, 40.0f, 301, cuda::kPrefillTileRows);
}

void run_decode(const Shape& s, const std::vector<int>& positions, const DecodeSplit& split,
                uint32_t seed, float q_amp = 4.0f, KvType kt = KvType::kF16,
                KvType vt = KvType::kF16) {
  std::mt19937 rng(seed);
  // One sequence per row with length pos + 1, plus one row at an earlier
  // position of the first sequence (two rows of one sequence).
  std::vector<int> lengths;
  for (int p : positions) lengths.push_back(p + 1);
  Cache c(s, lengths, rng, kt, vt);
  std::vector<BatchRowMeta> rows;
  for (size_t i = 0; i < positions.size(); ++i)
    rows.push_back(c.row(static_cast<int>(i), positions[i]));
  rows.push_back(c.row(0, positions[0] / 2));
  const size_t q_dim = static_cast<size_t>(s.n_head) * s.head_dim;
  const std::vector<float> q = random_q(rows.size() * q_dim, q_amp, rng);
  std::vector<float> out(q.size(), NAN);
  const AttnArgs a = args(s);
  const int64_t n_rows = static_cast<int64_t>(rows.size());
  std::vector<float> ws(cuda::attention_decode_workspace(n_rows, a, split), NAN);
  cuda::launch_attention_decode(q.data(), out.data(), rows.data(), n_rows, a, c.view(), split,
                                ws.empty() ? nullptr : ws.data(), nullptr);
  expect_close(out, reference(c, s, q, rows, a.scale),
               "decode " + name(s) + ", " + std::to_string(split.n_splits) + " splits of " +
                   std::to_string(split.split_tokens) + ", K " + kv_type_name(kt) + " V " +
                   kv_type_name(vt));
}

// A quantized cache: the kernels decode the blocks in registers to the same
// values the host's codec gives (the reference reads those), for every type,
// K and V of different types, prefill and decode, split and not.
TEST(EmuAttention, QuantizedCacheTypes) {
  const KvType types[][2] = {{KvType::kQ8_0, KvType::kQ8_0}, {KvType::kQ4_0, KvType::kQ4_0},
                             {KvType::kFp8, KvType::kFp8},   {KvType::kQ8_0, KvType::kF16},
                             {KvType::kF16, KvType::kQ4_0},  {KvType::kIq4Nl, KvType::kIq4Nl}};
  const std::vector<PrefillSeq> seqs = {{17, 15}, {0, 33}};
  const std::vector<int> positions = {69, 0, 16, 40};
  uint32_t seed = 600;
  for (const auto& t : types) {
    run_prefill(kShapes[1], seqs, 4.0f, seed++, cuda::kPrefillTileRows, t[0], t[1]);
    run_decode(kShapes[1], positions, DecodeSplit{3, 32}, seed++, 4.0f, t[0], t[1]);
    if (kSanitized) continue;
    run_prefill(kShapes[2], seqs, 4.0f, seed++, 5, t[0], t[1]);
    run_decode(kShapes[7], positions, DecodeSplit{1, 112}, seed++, 4.0f, t[0], t[1]);
  }
}

TEST(EmuAttention, QuantizedCacheNeedsHeadDimOf32) {
  std::mt19937 rng(8);
  const Shape s{48, 6, 3};
  Cache c(s, {20}, rng);
  KvDeviceView v = c.view();
  v.k_type = KvType::kQ8_0;
  v.k_row = static_cast<int32_t>(kv_row_bytes(KvType::kQ8_0, 96));  // not a whole head's blocks
  std::vector<BatchRowMeta> rows = {c.row(0, 19)};
  std::vector<float> q(6 * 48), out(q.size());
  EXPECT_THROW(cuda::launch_attention_decode(q.data(), out.data(), rows.data(), 1, args(s), v,
                                             DecodeSplit{1, 32}, nullptr, nullptr),
               Error);
}

TEST(EmuAttention, DecodeSplits) {
  // Positions 0 .. 100: rows whose later splits are empty, lengths on and
  // across block edges.
  const std::vector<int> positions = {69, 0, 14, 15, 16, 32, 100};
  uint32_t seed = 400;
  int i = 0;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(name(s));
    if (!run_shape(i++)) continue;
    run_decode(s, positions, DecodeSplit{4, 32}, seed++);
    run_decode(s, positions, DecodeSplit{1, 112}, seed++);  // one split: direct output
  }
}

TEST(EmuAttention, DecodeManySmallSplits) {
  const std::vector<int> positions = {33, 1, 47, 48, 79};
  run_decode(kShapes[2], positions, DecodeSplit{8, 16}, 500);
  run_decode(kShapes[6], positions, DecodeSplit{3, 48}, 501);
  run_decode(kShapes[1], positions, DecodeSplit{16, 16}, 502, 40.0f);  // large scores, 11 empty
  // A split plan shorter than the rows: the last split takes the rest.
  run_decode(kShapes[3], positions, DecodeSplit{2, 16}, 503);
  run_decode(kShapes[3], positions, DecodeSplit{1, 16}, 504);
}

TEST(EmuAttention, DecodeWorkspaceSize) {
  AttnArgs a = args({64, 8, 2});
  EXPECT_EQ(cuda::attention_decode_workspace(3, a, DecodeSplit{1, 128}), 0u);
  EXPECT_EQ(cuda::attention_decode_workspace(3, a, DecodeSplit{4, 32}), 3u * 8 * 4 * (64 + 2));
  EXPECT_EQ(cuda::attention_decode_workspace(0, a, DecodeSplit{4, 32}), 0u);
}

TEST(EmuAttention, BadArgumentsAreErrors) {
  std::mt19937 rng(7);
  const Shape s{64, 4, 2};
  Cache c(s, {20}, rng);
  std::vector<BatchRowMeta> rows = {c.row(0, 19)};
  std::vector<float> q(4 * 64), out(q.size());
  std::vector<PrefillTile> tiles = {PrefillTile{0, 1}};
  auto prefill = [&](AttnArgs a) {
    cuda::launch_attention_prefill(q.data(), out.data(), rows.data(), tiles.data(), 1, a, c.view(),
                                   nullptr);
  };
  AttnArgs a = args(s);
  a.n_head = 5;
  EXPECT_THROW(prefill(a), Error);
  a = args(s);
  a.head_dim = 63;
  EXPECT_THROW(prefill(a), Error);  // odd, and kv_dim mismatch
  KvDeviceView big = c.view();
  a = args({258, 4, 2});
  big.kv_dim = 2 * 258;
  EXPECT_THROW(cuda::launch_attention_prefill(q.data(), out.data(), rows.data(), tiles.data(), 1, a,
                                              big, nullptr),
               Error);
  a = args(s);
  EXPECT_THROW(cuda::launch_attention_decode(q.data(), out.data(), rows.data(), 1, a, c.view(),
                                             DecodeSplit{2, 16}, nullptr, nullptr),
               Error);  // two splits need a workspace
  EXPECT_THROW(cuda::launch_attention_decode(q.data(), out.data(), rows.data(), 1, a, c.view(),
                                             DecodeSplit{1, 0}, nullptr, nullptr),
               Error);
}

// ---- softmax merge on the host ------------------------------------------------

struct State {
  float m = -INFINITY, l = 0;
  std::vector<float> acc;
};

// The state of scores s[i] with values v[i] (one-dimensional acc of size 2: v, -v).
State state_of(const std::vector<float>& s, const std::vector<float>& v) {
  State st;
  st.acc.assign(2, 0.0f);
  for (float x : s) st.m = std::max(st.m, x);
  for (size_t i = 0; i < s.size(); ++i) {
    const float p = std::exp(s[i] - st.m);
    st.l += p;
    st.acc[0] += p * v[i];
    st.acc[1] -= p * v[i];
  }
  return st;
}

void merge(State& a, const State& b) {
  cuda::softmax_merge(a.m, a.l, a.acc.data(), b.m, b.l, b.acc.data(), 2);
}

TEST(EmuAttentionSoftmaxMerge, SplitsMergeToTheWhole) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f), uv(-1.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<float> s(static_cast<size_t>(n)), v(s.size());
    for (int i = 0; i < n; ++i)
      s[static_cast<size_t>(i)] = u(rng), v[static_cast<size_t>(i)] = uv(rng);
    double mx = -INFINITY, sum = 0, want = 0;
    for (float x : s) mx = std::max(mx, static_cast<double>(x));
    for (int i = 0; i < n; ++i) {
      const double p = std::exp(s[static_cast<size_t>(i)] - mx);
      sum += p;
      want += p * v[static_cast<size_t>(i)];
    }
    want /= sum;
    // Cut into up to 4 pieces, some empty, merged left to right from empty.
    State total;
    total.acc.assign(2, 0.0f);
    int start = 0;
    for (int piece = 0; piece < 4; ++piece) {
      const int end = piece == 3 ? n : start + static_cast<int>(rng() % (n - start + 1));
      const std::vector<float> ps(s.begin() + start, s.begin() + end);
      const std::vector<float> pv(v.begin() + start, v.begin() + end);
      merge(total, state_of(ps, pv));
      start = end;
    }
    EXPECT_EQ(total.m, static_cast<float>(mx));
    EXPECT_NEAR(total.acc[0] / total.l, want, 1e-5);
    EXPECT_NEAR(total.acc[1] / total.l, -want, 1e-5);
  }
}

TEST(EmuAttentionSoftmaxMerge, EmptyIsTheIdentity) {
  const State x = state_of({1.5f, -2.0f, 0.25f}, {0.5f, -1.0f, 0.75f});
  State empty;
  empty.acc.assign(2, 0.0f);

  State a = x;
  merge(a, empty);  // x + empty
  EXPECT_EQ(a.m, x.m);
  EXPECT_EQ(a.l, x.l);
  EXPECT_EQ(a.acc, x.acc);

  State b = empty;
  merge(b, x);  // empty + x
  EXPECT_EQ(b.m, x.m);
  EXPECT_EQ(b.l, x.l);
  EXPECT_EQ(b.acc, x.acc);

  State c = empty;
  merge(c, empty);  // stays empty, no NaN
  EXPECT_EQ(c.m, -INFINITY);
  EXPECT_EQ(c.l, 0.0f);
  EXPECT_EQ(c.acc[0], 0.0f);
  EXPECT_EQ(c.acc[1], 0.0f);
  EXPECT_EQ(cuda::softmax_rescale(-INFINITY, -INFINITY), 0.0f);
  EXPECT_EQ(cuda::softmax_rescale(-INFINITY, 3.0f), 0.0f);
  EXPECT_EQ(cuda::softmax_rescale(3.0f, 3.0f), 1.0f);
}

TEST(EmuAttentionSoftmaxMerge, OrderDoesNotMatter) {
  const State x = state_of({10.0f, -4.0f}, {1.0f, -1.0f});
  const State y = state_of({-3.0f, 25.0f, 7.0f}, {0.25f, 0.5f, -0.75f});
  State xy = x, yx = y;
  merge(xy, y);
  merge(yx, x);
  EXPECT_EQ(xy.m, yx.m);
  EXPECT_FLOAT_EQ(xy.l, yx.l);
  EXPECT_FLOAT_EQ(xy.acc[0] / xy.l, yx.acc[0] / yx.l);
}

}  // namespace
}  // namespace barata
