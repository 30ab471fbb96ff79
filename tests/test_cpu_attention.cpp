// The CPU's tiled attention (src/cpu/attention.cpp) and gated activations, per
// instruction set: against a float64 reference over a paged cache with a
// shuffled block table, causal and sliding-window masks, GQA groups and head
// sizes that are and are not vector multiples; and bit for bit the same output
// for a query whichever work item, lane position and batch it is computed in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "barata/batch.h"
#include "barata/half.h"
#include "barata/kv_types.h"
#include "cpu/dot.h"
#include "cpu/isa.h"

namespace barata {
namespace {

constexpr int64_t kB = 16;  // keys per cache block

// A one-layer paged cache of K type kt and V type vt: blocks of [K: 16 rows]
// [V: 16 rows], the positions of one sequence spread over a shuffled block
// table.
struct Cache {
  int64_t kv_dim = 0, n_pos = 0;
  KvType kt = KvType::kF16, vt = KvType::kF16;
  std::vector<uint8_t> pool;
  std::vector<int32_t> table;
  int64_t row(int kv) const { return kv_row_bytes(kv == 0 ? kt : vt, kv_dim); }
  int64_t block_bytes() const { return kB * (row(0) + row(1)); }

  Cache(int64_t kv_dim_, int64_t n_pos_, std::mt19937& rng, KvType k = KvType::kF16,
        KvType v = KvType::kF16)
      : kv_dim(kv_dim_), n_pos(n_pos_), kt(k), vt(v) {
    const int64_t n_blocks = (n_pos + kB - 1) / kB + 3;  // a few blocks no one uses
    table.resize(static_cast<size_t>(n_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    // Unused slots hold NaN bytes (fp16 and scale 0x7e7e, fp8 0x7e is 448
    // with a NaN scale): a kernel that reads past a query's keys shows.
    pool.assign(static_cast<size_t>(n_blocks * block_bytes()), 0x7e);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(kv_dim));
    for (int64_t p = 0; p < n_pos; ++p)
      for (int kv = 0; kv < 2; ++kv) {
        for (float& e : x) e = nd(rng) * (kv == 0 ? 1.5f : 1.0f);
        kv_quantize_row(kv == 0 ? kt : vt, x.data(), at(kv, p), kv_dim);
      }
  }
  uint8_t* at(int kv, int64_t p) {
    return pool.data() + table[static_cast<size_t>(p / kB)] * block_bytes() +
           (kv == 0 ? 0 : kB * row(0)) + (p % kB) * row(kv);
  }
  // The values attention must see: the reference codec's.
  std::vector<float> values(int kv, int64_t p) {
    std::vector<float> v(static_cast<size_t>(kv_dim));
    kv_dequantize_row(kv == 0 ? kt : vt, at(kv, p), v.data(), kv_dim);
    return v;
  }
};

struct Shape {
  int64_t hd, n_head, n_head_kv, window;
};

AttnArgs args_for(const Shape& s, const Cache& c, const float* q, float* out,
                  const std::vector<BatchRowMeta>& rows) {
  return AttnArgs{q,
                  out,
                  rows.data(),
                  c.pool.data(),
                  c.block_bytes(),
                  0,
                  kB * c.row(0),
                  c.row(0),
                  c.row(1),
                  c.kt,
                  c.vt,
                  s.hd,
                  s.n_head * s.hd,
                  s.n_head_kv * s.hd,
                  s.n_head / s.n_head_kv,
                  1.0f / std::sqrt(static_cast<float>(s.hd)),
                  s.window};
}

// The cache types attention reads (a rotated type is read as its storage
// type; the rotation is rope_kv's), K and V mixed as a user may.
struct Types {
  KvType k, v;
};
constexpr Types kTypes[] = {{KvType::kF16, KvType::kF16},    {KvType::kQ8_0, KvType::kQ8_0},
                            {KvType::kQ4_0, KvType::kQ4_0},  {KvType::kFp8, KvType::kFp8},
                            {KvType::kQ8_0, KvType::kF16},   {KvType::kF16, KvType::kQ4_0},
                            {KvType::kIq4Nl, KvType::kIq4Nl}};
bool quantized(const Types& t) {
  return t.k != KvType::kF16 || t.v != KvType::kF16;
}

// Every token of a run of positions, every KV head, items of up to `per`
// tokens (the backend's split is kAttnMaxQueries / group).
void run_all(CpuAttendFn f, const AttnArgs& a, const int32_t* table, int64_t n_tokens,
             int64_t n_head_kv, int64_t per) {
  for (int64_t t = 0; t < n_tokens; t += per)
    for (int64_t h = 0; h < n_head_kv; ++h) f(a, table, t, std::min(n_tokens, t + per), h);
}

class CpuAttention : public testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!cpu_isa_available(GetParam()))
      GTEST_SKIP() << "this CPU or build has no " << cpu_isa_name(GetParam())
                   << " kernels (best here: " << cpu_isa_name(cpu_best_isa()) << ")";
  }
};

TEST_P(CpuAttention, MatchesFloat64ReferenceOverAPagedCache) {
  std::mt19937 rng(11);
  const Shape shapes[] = {{64, 14, 2, 0}, {64, 9, 3, 0},  {8, 4, 4, 0},
                          {12, 6, 2, 0},  {96, 8, 1, 40}, {256, 4, 1, 21}};
  for (const Types& ty : kTypes)
    for (const Shape& s : shapes) {
      if (quantized(ty) && s.hd % 32 != 0) continue;  // quantized rows: head_dim of 32s
      const int64_t n_pos = 83, q_dim = s.n_head * s.hd, group = s.n_head / s.n_head_kv;
      Cache c(s.n_head_kv * s.hd, n_pos, rng, ty.k, ty.v);
      std::vector<std::vector<float>> kvals, vvals;  // what the cache holds, decoded once
      for (int64_t p = 0; p < n_pos; ++p) {
        kvals.push_back(c.values(0, p));
        vvals.push_back(c.values(1, p));
      }
      // A prefill of the last 37 positions (keys before them already cached).
      const int64_t T = 37, p0 = n_pos - T;
      std::vector<BatchRowMeta> rows(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t)
        rows[static_cast<size_t>(t)].pos = static_cast<int32_t>(p0 + t);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> q(static_cast<size_t>(T * q_dim)), out(q.size(), NAN);
      for (float& x : q) x = nd(rng);
      const CpuAttendFn f = cpu_attend(GetParam(), s.hd);
      ASSERT_NE(f, nullptr);
      const AttnArgs a = args_for(s, c, q.data(), out.data(), rows);
      run_all(f, a, c.table.data(), T, s.n_head_kv, std::max<int64_t>(1, kAttnMaxQueries / group));
      double worst = 0.0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < s.n_head; ++h) {
          const int64_t kvh = h / group, n = p0 + t + 1;
          const int64_t first = s.window > 0 ? std::max<int64_t>(0, n - s.window) : 0;
          // Int keys (kv_int_keys) meet the query as its 8-bit codes times
          // the block scales; their product with a key is exact in float64.
          const float* qf = q.data() + t * q_dim + h * s.hd;
          std::vector<double> qh(qf, qf + s.hd);
          if (kv_int_keys(ty.k)) {
            std::vector<int8_t> codes(static_cast<size_t>(s.hd));
            std::vector<float> d(static_cast<size_t>(s.hd / 32));
            kv_quantize_query(qf, codes.data(), d.data(), s.hd);
            for (int64_t i = 0; i < s.hd; ++i)
              qh[static_cast<size_t>(i)] = static_cast<double>(d[static_cast<size_t>(i / 32)]) *
                                           codes[static_cast<size_t>(i)];
          }
          std::vector<double> sc;
          double mx = -INFINITY;
          for (int64_t p = first; p < n; ++p) {
            const float* k = kvals[static_cast<size_t>(p)].data() + kvh * s.hd;
            double d = 0.0;
            for (int64_t i = 0; i < s.hd; ++i) d += qh[static_cast<size_t>(i)] * k[i];
            sc.push_back(d * a.scale);
            mx = std::max(mx, sc.back());
          }
          double sum = 0.0;
          for (double& x : sc) sum += (x = std::exp(x - mx));
          for (int64_t i = 0; i < s.hd; ++i) {
            double o = 0.0;
            for (int64_t p = first; p < n; ++p)
              o += sc[static_cast<size_t>(p - first)] *
                   vvals[static_cast<size_t>(p)][static_cast<size_t>(kvh * s.hd + i)];
            o /= sum;
            const double got = out[static_cast<size_t>(t * q_dim + h * s.hd + i)];
            ASSERT_TRUE(std::isfinite(got)) << "hd " << s.hd << " token " << t << " head " << h;
            worst = std::max(worst, std::fabs(got - o));
          }
        }
      EXPECT_LT(worst, 2e-5) << "hd " << s.hd << " heads " << s.n_head << "/" << s.n_head_kv
                             << " window " << s.window << " K " << kv_type_name(ty.k) << " V "
                             << kv_type_name(ty.v);
    }
}

// A query's output does not depend on the item it is computed in: the same
// tokens as one item, and split into items of 1 (decode), 2, 5 and 13 tokens
// (other lane positions, other key ranges in the item), give the same bits.
TEST_P(CpuAttention, AQueryGivesTheSameBitsInEveryItem) {
  std::mt19937 rng(12);
  const Shape shapes[] = {{64, 14, 2, 0}, {64, 9, 3, 0}, {12, 6, 2, 0}, {96, 8, 1, 20}};
  for (const Types& ty : kTypes)
    for (const Shape& s : shapes) {
      if (quantized(ty) && s.hd % 32 != 0) continue;
      const int64_t n_pos = 70, T = 45, p0 = n_pos - T, q_dim = s.n_head * s.hd;
      Cache c(s.n_head_kv * s.hd, n_pos, rng, ty.k, ty.v);
      std::vector<BatchRowMeta> rows(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t)
        rows[static_cast<size_t>(t)].pos = static_cast<int32_t>(p0 + t);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> q(static_cast<size_t>(T * q_dim));
      for (float& x : q) x = nd(rng);
      const CpuAttendFn f = cpu_attend(GetParam(), s.hd);
      std::vector<float> ref(q.size());
      run_all(f, args_for(s, c, q.data(), ref.data(), rows), c.table.data(), T, s.n_head_kv, T);
      for (int64_t per : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{13}}) {
        std::vector<float> out(q.size());
        run_all(f, args_for(s, c, q.data(), out.data(), rows), c.table.data(), T, s.n_head_kv, per);
        for (size_t i = 0; i < out.size(); ++i)
          ASSERT_EQ(out[i], ref[i]) << "items of " << per << " tokens, element " << i;
      }
    }
}

TEST_P(CpuAttention, GatedActivationsAreElementwiseAndAccurate) {
  const CpuVectorOps ops = cpu_vector_ops(GetParam());
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  const int64_t n = 173;  // not a vector multiple
  std::vector<float> g(n), u(n);
  for (int64_t i = 0; i < n; ++i) {
    g[static_cast<size_t>(i)] = nd(rng);
    u[static_cast<size_t>(i)] = nd(rng);
  }
  g[0] = -100.0f;
  g[1] = 100.0f;
  for (int act = 0; act < 2; ++act) {
    std::vector<float> whole = g;
    (act == 0 ? ops.swiglu : ops.geglu)(whole.data(), u.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[static_cast<size_t>(i)], up = u[static_cast<size_t>(i)];
      // GELU's 0.5 x (1 + tanh z) as x / (1 + e^-2z): the same function,
      // without the cancellation of 1 + tanh z for negative x.
      const double z = 0.7978845608028654 * (x + 0.044715 * x * x * x);
      const double want =
          act == 0 ? x / (1.0 + std::exp(-x)) * up : x / (1.0 + std::exp(-2.0 * z)) * up;
      EXPECT_NEAR(whole[static_cast<size_t>(i)], want, 4e-6 * std::fabs(want) + 1e-30)
          << (act == 0 ? "silu" : "gelu") << " x " << x;
      // The element alone (a tail of one) gives the same bits as in the array.
      float one = g[static_cast<size_t>(i)];
      (act == 0 ? ops.swiglu : ops.geglu)(&one, &u[static_cast<size_t>(i)], 1);
      ASSERT_EQ(one, whole[static_cast<size_t>(i)]) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuAttention, testing::ValuesIn(kAllCpuIsas),
                         [](const testing::TestParamInfo<CpuIsa>& i) {
                           return std::string(cpu_isa_name(i.param));
                         });

}  // namespace
}  // namespace barata
