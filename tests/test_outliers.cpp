// barata outliers: the statistics on synthetic residuals with planted outlier
// dimensions (found, histogram counts, int8 level counts, scale shrink), the
// engine's residual hook on stories260K (called once per layer with the
// batch's shape, logits unchanged, the last layer's residual giving the
// logits), and the CLI (report, --json keys, --plot, the errors).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/dtype.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/model.h"
#include "barata/outliers.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace barata::outliers;

// Small ordinary values in (-1, 1), deterministic.
float noise(int64_t i) {
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
  h ^= h >> 15;
  return static_cast<float>(h % 1999) / 1000.0f - 0.999f;
}

// Three layers of 64 rows x 32 dims of noise; dim 7 reaches 500 in layers 1
// and 2, dim 3 reaches 20 in layer 2 only.
std::vector<std::vector<float>> planted(int64_t rows, int64_t d) {
  std::vector<std::vector<float>> x(3, std::vector<float>(static_cast<size_t>(rows * d)));
  for (int64_t l = 0; l < 3; ++l)
    for (int64_t i = 0; i < rows * d; ++i) x[l][i] = noise(l * rows * d + i);
  for (int64_t r = 0; r < rows; ++r) {
    x[1][r * d + 7] = (r % 2 ? -1.0f : 1.0f) * (100.0f + 400.0f * r / (rows - 1));
    x[2][r * d + 7] = 300.0f + 200.0f * r / (rows - 1);
  }
  x[2][5 * d + 3] = -20.0f;
  return x;
}

TEST(Outliers, PlantedDimensionIsFound) {
  const int64_t rows = 64, d = 32;
  const auto x = planted(rows, d);
  std::vector<LayerSummary> s;
  for (int64_t l = 0; l < 3; ++l) s.push_back(summarize_layer(l, x[l].data(), rows, d));
  EXPECT_LT(s[0].max_abs, 1.0f);
  EXPECT_EQ(s[1].max_dim, 7);
  EXPECT_EQ(s[1].max_row, rows - 1);  // the ramp ends at 500
  EXPECT_EQ(s[2].max_row, rows - 1);
  EXPECT_FLOAT_EQ(s[1].max_abs, 500.0f);
  EXPECT_FLOAT_EQ(s[2].dim_max[3], 20.0f);
  EXPECT_FLOAT_EQ(s[2].dim_max[7], 500.0f);
  // Medians stay with the ordinary values: one dimension in 32 does not move them past 1.
  for (const LayerSummary& l : s) {
    EXPECT_LT(l.median_abs, 1.0f);
    EXPECT_LT(l.median_dim_max, 1.0f);
    EXPECT_GT(l.median_dim_max, 0.5f);
  }
  // p99 of 2048 values: the top 1% is 20 values; the planted dimension holds 64 above 100.
  EXPECT_GT(s[1].p99_abs, 100.0f);
  EXPECT_LT(s[0].p99_abs, 1.0f);

  const std::vector<TopDim> top = top_dims(s, 1);
  ASSERT_GE(top.size(), 2u);
  EXPECT_EQ(top[0].dim, 7);
  EXPECT_FLOAT_EQ(top[0].max_abs, 500.0f);
  EXPECT_EQ(top[0].layers, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(top[1].layers, (std::vector<int64_t>{0}));  // layer 0's own top, a noise dim
  // With the top 2, dim 3 joins in layer 2 only.
  const std::vector<TopDim> top2 = top_dims(s, 2);
  const auto d3 =
      std::find_if(top2.begin(), top2.end(), [](const TopDim& t) { return t.dim == 3; });
  ASSERT_NE(d3, top2.end());
  EXPECT_EQ(d3->layers, (std::vector<int64_t>{2}));
  EXPECT_EQ(d3->max_layer, 2);
  EXPECT_EQ(top_k_dims(s[2], 2), (std::vector<int64_t>{7, 3}));
}

TEST(Outliers, Quantile) {
  std::vector<float> v = {4, 1, 3, 2};
  EXPECT_FLOAT_EQ(quantile(v, 0.5), 2.5f);
  EXPECT_FLOAT_EQ(quantile(v, 0.0), 1.0f);
  EXPECT_FLOAT_EQ(quantile(v, 1.0), 4.0f);
  std::vector<float> w(101);
  for (int i = 0; i <= 100; ++i) w[static_cast<size_t>(i)] = static_cast<float>(100 - i);
  EXPECT_FLOAT_EQ(quantile(w, 0.99), 99.0f);
  std::vector<float> none;
  EXPECT_EQ(quantile(none, 0.5), 0.0f);
}

TEST(Outliers, Log2HistogramCounts) {
  const std::vector<float> v = {0, 0.5f, 1, 1.5f, 2, 3.9f, 4, 100};
  const std::vector<Bin> b = log2_histogram(v);
  ASSERT_EQ(b.size(), 8u);  // 0-1, 1-2, 2-4, 4-8, 8-16, 16-32, 32-64, 64-128
  const int64_t want[] = {2, 2, 2, 1, 0, 0, 0, 1};
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(b[i].count, want[i]) << i;
  EXPECT_EQ(bin_label(b[0]), "0-1");
  EXPECT_EQ(bin_label(b[1]), "1-2");
  EXPECT_EQ(bin_label(b[2]), "2-4");
  EXPECT_EQ(bin_label(b[7]), "64-128");
  EXPECT_EQ(b[7].lo, 64.0);
  EXPECT_EQ(b[7].hi, 128.0);
  const float inf = INFINITY;
  EXPECT_THROW(log2_histogram(std::span<const float>(&inf, 1)), Error);

  const std::string bars = histogram_bars(b, 10);
  EXPECT_NE(bars.find("0-1 | ########## 2"), std::string::npos) << bars;
  EXPECT_NE(bars.find("4-8 | #####      1"), std::string::npos) << bars;
  EXPECT_NE(bars.find("8-16 |            0"), std::string::npos) << bars;
  const std::string svg = histogram_svg(b, "a <title>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("a &lt;title&gt;"), std::string::npos);
  size_t rects = 0;
  for (size_t p = svg.find("<rect"); p != std::string::npos; p = svg.find("<rect", p + 1)) ++rects;
  EXPECT_EQ(rects, b.size() + 2);  // a bar per bin, the background and the frame
}

// 11 rows x 3 dims: dim 0 an outlier of 127 (so one scale over all is 1.0),
// dim 1 = 0.4 i, dim 2 = 10 in row 0 and 0 elsewhere.
TEST(Outliers, Int8LevelsAndScaleShrink) {
  const int64_t rows = 11, d = 3;
  std::vector<float> x(static_cast<size_t>(rows * d), 0.0f);
  for (int64_t i = 0; i < rows; ++i) x[i * d + 1] = 0.4f * static_cast<float>(i);
  x[0] = 127.0f;
  x[2] = 10.0f;
  const std::vector<int64_t> typical = {1, 2};
  const Int8Levels all = int8_levels(x.data(), rows, d, typical, {});
  EXPECT_FLOAT_EQ(all.scale, 1.0f);
  // 0, 0.4, ..., 4.0 round to 0 0 1 1 2 2 2 3 3 4 4: five levels.
  EXPECT_EQ(all.typical_levels, (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(all.median_levels, 2.0);  // dims use 2, 5, 2
  EXPECT_EQ(all.tensor_levels, 7);    // 0 1 2 3 4 10 127
  const std::vector<int64_t> out = {0};
  const Int8Levels rest = int8_levels(x.data(), rows, d, typical, out);
  EXPECT_FLOAT_EQ(rest.scale, 10.0f / 127);
  // 0.4 i x 12.7 = 5.08 i: eleven distinct codes.
  EXPECT_EQ(rest.typical_levels, (std::vector<int64_t>{11, 2}));
  EXPECT_EQ(rest.median_levels, 6.5);
  EXPECT_EQ(rest.excluded, out);

  std::vector<LayerSummary> s = {summarize_layer(0, x.data(), rows, d)};
  const Analysis a = analyze(s, 0, x.data(), 1);
  EXPECT_EQ(a.without_outliers.excluded, out);
  EXPECT_EQ(a.with_outliers.typical, typical);  // dims at the quartiles of the rest
  EXPECT_NEAR(a.scale_shrink, 12.7, 1e-4);
  ASSERT_EQ(a.top.size(), 1u);
  EXPECT_EQ(a.top[0].dim, 0);

  EXPECT_THROW(int8_levels(x.data(), rows, d, typical, std::vector<int64_t>{3}), Error);
  EXPECT_THROW(int8_levels(x.data(), rows, d, std::vector<int64_t>{-1}, {}), Error);
  EXPECT_THROW(analyze(s, 1, x.data(), 1), Error);  // no layer 1
  EXPECT_THROW(analyze(s, 0, x.data(), 3), Error);  // top 3 of 3 leaves nothing
  EXPECT_THROW(summarize_layer(0, x.data(), 0, d), Error);
}

TEST(Outliers, PlantedLayerInt8) {
  const int64_t rows = 64, d = 32;
  const auto x = planted(rows, d);
  std::vector<LayerSummary> s;
  for (int64_t l = 0; l < 3; ++l) s.push_back(summarize_layer(l, x[l].data(), rows, d));
  const Analysis a = analyze(s, 1, x[1].data(), 1);
  EXPECT_FLOAT_EQ(a.with_outliers.scale, 500.0f / 127);
  // Noise under 1 against a step of 3.9: every ordinary dimension is one code, 0.
  EXPECT_EQ(a.with_outliers.median_levels, 1.0);
  for (int64_t n : a.with_outliers.typical_levels) EXPECT_EQ(n, 1);
  // Without dim 7 the step is under 1/127 and the same dimensions spread out.
  EXPECT_LT(a.without_outliers.scale, 1.0f / 127);
  EXPECT_GT(a.without_outliers.median_levels, 50.0);
  EXPECT_GT(a.scale_shrink, 500.0);
  int64_t total = 0;
  for (const Bin& b : a.histogram) total += b.count;
  EXPECT_EQ(total, d);
  EXPECT_EQ(a.histogram.back().count, 1);  // dim 7 alone in 256-512
  EXPECT_EQ(a.histogram.back().lo, 256.0);
}

// ---- the engine's hook ------------------------------------------------------------

TEST(OutliersHook, CalledPerLayerAndLogitsUnchanged) {
  const fs::path path = test::tiny_model("stories260K.gguf");
  ASSERT_TRUE(fs::exists(path)) << path;
  const Model m = Model::load(path);
  const ModelConfig& c = m.config();
  Engine e(m, {.n_threads = 1, .n_ctx = 64});
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 276, 29, 104, 300};
  const auto T = static_cast<int64_t>(ids.size());
  std::vector<float> plain(static_cast<size_t>(c.n_vocab)), hooked(plain.size());
  e.prefill(e.new_sequence(), ids, plain.data());

  std::vector<int64_t> seen;
  std::vector<float> last;
  e.set_residual_hook([&](int64_t l, const float* x, int64_t rows, int64_t d) {
    seen.push_back(l);
    EXPECT_EQ(rows, T);
    EXPECT_EQ(d, c.d_model);
    if (l == c.n_layer - 1) last.assign(x + (rows - 1) * d, x + rows * d);
  });
  e.prefill(e.new_sequence(), ids, hooked.data());
  std::vector<int64_t> want(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) want[static_cast<size_t>(l)] = l;
  EXPECT_EQ(seen, want);
  EXPECT_EQ(plain, hooked);  // bit for bit: the hook only reads

  // The last layer's last row, through the final norm and the output matrix, is the logits.
  ASSERT_EQ(static_cast<int64_t>(last.size()), c.d_model);
  double ss = 0;
  for (float v : last) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(c.d_model) + c.norm_eps);
  std::vector<float> xn(last.size()), row(last.size());
  for (size_t i = 0; i < last.size(); ++i)
    xn[i] = static_cast<float>(last[i] * inv) * m.output_norm()[i];
  const WeightDesc& o = m.output();
  double max_err = 0, max_logit = 0;
  for (int64_t r = 0; r < o.n_rows; ++r) {
    dequantize_tensor_row(o.type, o.data, o.k, r, row.data());
    double dot = 0;
    for (size_t i = 0; i < row.size(); ++i) dot += static_cast<double>(row[i]) * xn[i];
    dot *= o.scale;
    max_err = std::max(max_err, std::fabs(dot - hooked[static_cast<size_t>(r)]));
    max_logit = std::max(max_logit, std::fabs(dot));
  }
  EXPECT_GT(max_logit, 0.1);
  EXPECT_LT(max_err, 1e-3 * std::max(1.0, max_logit));

  // A decode step of two sequences: one call per layer with two rows.
  const int s1 = e.new_sequence(), s2 = e.new_sequence();
  e.prefill(s1, ids, plain.data());
  e.prefill(s2, ids, plain.data());
  int calls = 0;
  e.set_residual_hook([&](int64_t, const float*, int64_t rows, int64_t) {
    ++calls;
    EXPECT_EQ(rows, 2);
  });
  const int seqs[2] = {s1, s2};
  const int32_t next[2] = {300, 301};
  std::vector<float> two(2 * plain.size());
  e.decode(seqs, next, two.data());
  EXPECT_EQ(calls, c.n_layer);
  e.set_residual_hook({});  // unset: not called
  const int32_t again[2] = {302, 303};
  e.decode(seqs, again, two.data());
  EXPECT_EQ(calls, c.n_layer);
}

// ---- the CLI -------------------------------------------------------------------------

std::string stories() {
  return test::tiny_model("stories260K.gguf").string();
}
const char* kPrompt = "\"Once upon a time there was a little girl named Lily. She loved to play.\"";

TEST(OutliersCli, JsonHasTheStatistics) {
  const auto r = test::run_cli_within(
      "outliers -m " + stories() + " -p " + kPrompt + " -t 1 -c 128 --top 2 --json", 120);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  const Model m = Model::load(stories());
  const int64_t n_layer = m.config().n_layer, d = m.config().d_model;
  EXPECT_EQ(j["n_layer"], n_layer);
  EXPECT_EQ(j["d_model"], d);
  EXPECT_GT(j["tokens"].get<int64_t>(), 10);
  EXPECT_EQ(j["layer"], n_layer / 2);
  EXPECT_EQ(j["top_k"], 2);
  ASSERT_EQ(j["layers"].size(), static_cast<size_t>(n_layer));
  for (const json& l : j["layers"]) {
    EXPECT_GT(l["max_abs"].get<double>(), 0.0);
    EXPECT_LE(l["median_abs"].get<double>(), l["p99_abs"].get<double>());
    EXPECT_LE(l["p99_abs"].get<double>(), l["max_abs"].get<double>());
    EXPECT_LT(l["max_dim"].get<int64_t>(), d);
    EXPECT_LT(l["max_token"].get<int64_t>(), j["tokens"].get<int64_t>());
  }
  ASSERT_FALSE(j["top_dims"].empty());
  size_t in_top = 0;
  for (const json& t : j["top_dims"]) in_top += t["layers"].size();
  EXPECT_EQ(in_top, static_cast<size_t>(2 * n_layer));  // each layer names its top 2
  // The largest top dimension is the largest value of some layer.
  double layer_max = 0;
  for (const json& l : j["layers"]) layer_max = std::max(layer_max, l["max_abs"].get<double>());
  EXPECT_DOUBLE_EQ(j["top_dims"][0]["max_abs"].get<double>(), layer_max);
  int64_t dims = 0;
  for (const json& b : j["histogram"]) dims += b["count"].get<int64_t>();
  EXPECT_EQ(dims, d);
  const json& q = j["int8"];
  const double scale = q["all_dims"]["scale"].get<double>();
  const double mid_max = j["layers"][n_layer / 2]["max_abs"].get<double>();
  EXPECT_NEAR(scale, mid_max / 127, 1e-6 * mid_max);
  EXPECT_EQ(q["without_top_dims"]["excluded_dims"].size(), 2u);
  EXPECT_GE(q["scale_shrink"].get<double>(), 1.0);
  EXPECT_NEAR(q["scale_shrink"].get<double>(), scale / q["without_top_dims"]["scale"].get<double>(),
              1e-6);
  ASSERT_FALSE(q["all_dims"]["typical"].empty());
  for (const json& t : q["all_dims"]["typical"]) {
    EXPECT_GE(t["levels"].get<int64_t>(), 1);
    EXPECT_LE(t["levels"].get<int64_t>(), 256);
  }
}

TEST(OutliersCli, TextReportAndPlots) {
  test::TempDir dir;
  const auto r =
      test::run_cli_within("outliers -m " + stories() + " -p " + kPrompt +
                               " -t 1 -c 128 --layer 1 --plot " + (dir / "plots").string(),
                           120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("levels used of 256"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer 1: max |h| per dimension, log2 bins"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0-1 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the scale shrinks"), std::string::npos) << r.out;
  for (const char* f : {"outliers-histogram-layer1.svg", "outliers-layers.svg"}) {
    const auto bytes = test::read_bytes(dir / "plots" / f);
    const std::string svg(bytes.begin(), bytes.end());
    EXPECT_EQ(svg.rfind("<svg", 0), 0u) << f;
    EXPECT_NE(svg.find("</svg>"), std::string::npos) << f;
  }
}

void expect_error(const std::string& args, const std::string& what) {
  const auto r = test::run_cli_within(args, 60);
  EXPECT_NE(r.status, 0) << args;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << args << "\n" << r.err;
  EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
}

TEST(OutliersCli, BadInputIsOneErrorLine) {
  const std::string m = " -m " + stories();
  expect_error("outliers" + m, "-p or -f");
  expect_error("outliers -m /nonexistent.gguf -p hi", "/nonexistent.gguf");
  expect_error("outliers" + m + " -p hi --layer 99", "--layer 99");
  expect_error("outliers" + m + " -p hi --top 0", "--top");
  expect_error("outliers" + m + " -p hi --top 100000", "--top 100000");
  expect_error("outliers" + m + " -p hi --bogus", "--bogus");
  expect_error("outliers" + m + " -p " + kPrompt + " -c 4", "context holds 4");
  expect_error("outliers" + m + " -p hi -f /nonexistent.txt", "");
}

}  // namespace
}  // namespace barata
