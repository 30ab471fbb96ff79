// The bench library without a model: statistics, the KV memory check, the
// renderers, and SVG well-formedness.
#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/bench.h"

namespace barata::bench {
namespace {

TEST(BenchStats, EvenCount) {
  const std::vector<double> v{4, 1, 3, 2};
  const Stats s = summarize(v);
  EXPECT_EQ(s.n, 4);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_NEAR(s.sd, std::sqrt(5.0 / 3.0), 1e-12);  // sample sd: sum of squares / (n - 1)
}

TEST(BenchStats, OddCountSingleAndEmpty) {
  const std::vector<double> odd{5, 1, 3};
  EXPECT_DOUBLE_EQ(summarize(odd).median, 3);
  EXPECT_DOUBLE_EQ(summarize(odd).sd, 2);
  const std::vector<double> one{7.5};
  const Stats s1 = summarize(one);
  EXPECT_EQ(s1.n, 1);
  EXPECT_DOUBLE_EQ(s1.sd, 0);
  EXPECT_DOUBLE_EQ(s1.mean, 7.5);
  EXPECT_DOUBLE_EQ(s1.median, 7.5);
  const Stats s0 = summarize({});
  EXPECT_EQ(s0.n, 0);
  EXPECT_DOUBLE_EQ(s0.sd, 0);
}

TEST(BenchStats, MeanStaysWithinMinMax) {
  // Identical values whose floating-point mean could drift one ulp.
  const std::vector<double> v(7, 0.1);
  const Stats s = summarize(v);
  EXPECT_GE(s.mean, s.min);
  EXPECT_LE(s.mean, s.max);
  EXPECT_DOUBLE_EQ(s.sd, 0);
}

TEST(BenchKv, AllocationMatchesTheBlockRoundedFormula) {
  const std::vector<KvShape> shapes{
      {"a", 2, 1, 8, 1}, {"b", 3, 2, 16, 16}, {"c", 3, 2, 16, 17}, {"d", 5, 4, 8, 100}};
  const auto rows = run_kv(shapes, Hooks{});
  ASSERT_EQ(rows.size(), shapes.size());
  for (const KvRow& r : rows) {
    const int64_t per_token = 2 * r.shape.n_layer * r.shape.n_head_kv * r.shape.head_dim * 2;
    EXPECT_EQ(r.bytes_per_token, per_token);
    EXPECT_EQ(r.rounded_tokens % 16, 0);
    EXPECT_GE(r.rounded_tokens, r.shape.n_tokens);
    EXPECT_LT(r.rounded_tokens - r.shape.n_tokens, 16);
    EXPECT_EQ(r.formula_bytes, per_token * r.rounded_tokens);
    EXPECT_EQ(r.bytes_allocated, r.formula_bytes) << r.shape.name;
    EXPECT_TRUE(r.equal);
  }
  EXPECT_EQ(rows[0].n_blocks, 1);  // one token still takes a block
  EXPECT_EQ(rows[1].n_blocks, 1);
  EXPECT_EQ(rows[2].n_blocks, 2);
  EXPECT_EQ(rows[3].n_blocks, 7);
}

TEST(BenchKv, StopsWhenInterrupted) {
  std::atomic<bool> stop{true};
  const std::vector<KvShape> shapes{{"a", 2, 1, 8, 1}};
  EXPECT_TRUE(run_kv(shapes, Hooks{[](const std::string&) {}, &stop}).empty());
}

// Every opening tag is closed in order (self-closing tags count as both).
bool balanced_tags(const std::string& svg) {
  std::vector<std::string> stack;
  const std::regex tag(R"(<(/?)([A-Za-z]+)[^>]*?(/?)>)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator();
       ++it) {
    const auto& m = *it;
    if (m[3].length() > 0) continue;
    if (m[1].length() == 0) {
      stack.push_back(m[2]);
    } else {
      if (stack.empty() || stack.back() != m[2]) return false;
      stack.pop_back();
    }
  }
  return stack.empty();
}

TEST(BenchSvg, WellFormedLineChart) {
  Chart c{"cost & <rate>", "tokens", "ms", true, false, {}};
  c.series.push_back({"prefill", {16, 64, 256}, {0.5, 0.4, 0.45}});
  c.series.push_back({"decode", {16, 64, 256}, {9, 9.2, 9.9}});
  const std::string svg = to_svg(c);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  ASSERT_GE(svg.size(), 7u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_TRUE(balanced_tags(svg));
  EXPECT_NE(svg.find("cost &amp; &lt;rate&gt;"), std::string::npos);
  size_t lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1))
    ++lines;
  EXPECT_EQ(lines, 2u);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(BenchSvg, LogAxesDropWhatTheyCannotShowAndEmptyChartSaysSo) {
  Chart c{"macs", "T", "MACs", true, true, {}};
  c.series.push_back({"with zero", {0, 1, 2, 4}, {0, 10, 1e3, 1e6}});
  const std::string svg = to_svg(c);
  EXPECT_TRUE(balanced_tags(svg));
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  const std::string empty = to_svg(Chart{"nothing", "x", "y", false, false, {}});
  EXPECT_TRUE(balanced_tags(empty));
  EXPECT_NE(empty.find("no data"), std::string::npos);
}

Report tiny_report() {
  Report r;
  r.model.path = "m.gguf";
  r.threads = {1};
  r.tests = {"prefill", "decode", "cache", "kv", "batch", "roofline"};
  const std::vector<double> ms{2, 3, 4};
  ThreadRun t;
  t.n_threads = 1;
  t.prefill.push_back({16, summarize(ms), summarize(ms), summarize(ms), summarize(ms)});
  t.decode.push_back({16, 1000, summarize(ms), summarize(ms), summarize(ms)});
  t.batch.push_back({2, 64, summarize(ms), summarize(ms)});
  t.cache.ran = true;
  t.cache.ids_identical = true;
  t.cache.n_generate = 2;
  t.cache.ids_cache = t.cache.ids_no_cache = {5, 6};
  t.cache.points.push_back({1, summarize(ms), summarize(ms), 10, 2, 10, 2});
  t.cache.points.push_back({2, summarize(ms), summarize(ms), 20, 5, 30, 7});
  r.runs.push_back(t);
  r.kv = run_kv(std::vector<KvShape>{{"a", 2, 1, 8, 3}}, Hooks{});
  return r;
}

TEST(BenchReport, RenderersCoverEveryPart) {
  const Report r = tiny_report();
  const std::string md = to_markdown(r);
  for (const char* h : {"### Prefill", "### Decode", "### KV cache against no cache",
                        "### KV memory", "### Batch sweep", "| a | 2 | 1 | 8 | 3 |"})
    EXPECT_NE(md.find(h), std::string::npos) << h;
  EXPECT_NE(md.find("identical"), std::string::npos);

  const std::string csv = to_csv(r);
  EXPECT_EQ(csv.rfind("test,threads,param,x,label,metric,mean,sd,median,min,max,n\n", 0), 0u);
  EXPECT_NE(csv.find("prefill,1,P,16,,ms,3,1,3,2,4,3\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("kv,,tokens,3,a L2 H1 D8,equal,1,0,1,1,1,1\n"), std::string::npos) << csv;

  const auto j = nlohmann::json::parse(to_json(r));
  EXPECT_EQ(j["schema"], "barata.bench/1");
  EXPECT_EQ(j["runs"][0]["prefill"][0]["ms"]["median"], 3.0);
  EXPECT_TRUE(j["runs"][0]["roofline"].is_null());  // did not run
  EXPECT_TRUE(j["runs"][0]["cache"]["first_mismatch"].is_null());

  const auto charts = report_charts(r);
  std::vector<std::string> names;
  for (const auto& [name, chart] : charts) {
    names.push_back(name);
    EXPECT_TRUE(balanced_tags(to_svg(chart))) << name;
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"prefill_decode.svg", "batch_throughput.svg",
                                      "batch_latency.svg", "cache_macs.svg", "cache_time.svg"}));
}

// bench -v on a GPU backend: the kernel each (weight type, width) ran, in the
// markdown's Device section only with -v, and in the JSON always.
TEST(BenchReport, KernelChoicesInTheDeviceSectionAndTheJson) {
  Report r = tiny_report();
  ThreadRun& t = r.runs[0];
  t.device = "cuda";
  t.report.name = "a GPU";
  t.report.kernels = {{"Q4_K", 1, "qmm<Q4_K, 4 rows x 1 tokens>"},
                      {"Q4_K", 64, "dequant_rows<Q4_K> to f16 + cublasGemmEx"}};
  EXPECT_EQ(to_markdown(r).find("qmm<Q4_K"), std::string::npos) << "printed without -v";
  r.verbose = true;
  const std::string md = to_markdown(r);
  EXPECT_NE(md.find("| weight type | width | kernel |"), std::string::npos) << md;
  EXPECT_NE(md.find("| Q4_K | 1 | qmm<Q4_K, 4 rows x 1 tokens> |"), std::string::npos) << md;
  EXPECT_NE(md.find("| Q4_K | 64 | dequant_rows<Q4_K> to f16 + cublasGemmEx |"), std::string::npos)
      << md;
  const auto j = nlohmann::json::parse(to_json(r));
  const auto& k = j["runs"][0]["device"]["kernels"];
  ASSERT_EQ(k.size(), 2u) << j.dump();
  EXPECT_EQ(k[1]["weight_type"], "Q4_K");
  EXPECT_EQ(k[1]["width"], 64);
  EXPECT_EQ(k[1]["kernel"], "dequant_rows<Q4_K> to f16 + cublasGemmEx");
}

}  // namespace
}  // namespace barata::bench
