// `barata bench` end to end on the committed tiny model
// (tests/data/models/stories260K.gguf) with tiny settings: the JSON schema
// (docs/bench-schema.md), KV formula equality, identical ids with and without
// the cache, sane statistics, capping, bad lists, the other formats and the
// SVG charts. Nothing here asserts a time.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using Result = test::CliResult;

Result bench(const std::string& args) {
  return test::run_cli("bench " + args);
}

fs::path stories() {
  return test::tiny_model("stories260K.gguf");
}

// The model is committed: its absence is a broken checkout, not a skip.
#define REQUIRE_MODEL() ASSERT_TRUE(fs::exists(stories())) << stories();

// Small enough for the sanitizer build: every test, two repetitions.
const std::string kTiny =
    " -t 1 -r 2 -p 8,16 -c 8,16 -b 1,3 -n 6 --batch-cached 16 --decode-steps 2 --bw-mib 8";

void expect_stat(const json& s, int64_t reps, const std::string& where) {
  SCOPED_TRACE(where);
  ASSERT_TRUE(s.is_object());
  for (const char* k : {"mean", "sd", "median", "min", "max"}) ASSERT_TRUE(s[k].is_number()) << k;
  ASSERT_TRUE(s["n"].is_number_integer());
  EXPECT_EQ(s["n"].get<int64_t>(), reps);
  const double mean = s["mean"], sd = s["sd"], med = s["median"], mn = s["min"], mx = s["max"];
  EXPECT_GE(sd, 0.0);
  EXPECT_LE(mn, mx);
  EXPECT_GE(mean, mn);
  EXPECT_LE(mean, mx);
  EXPECT_GE(med, mn);
  EXPECT_LE(med, mx);
  EXPECT_GT(mn, 0.0);  // times, rates and bandwidths are all positive
}

void expect_int(const json& j, const char* key) {
  EXPECT_TRUE(j.contains(key) && j[key].is_number_integer()) << key << " in " << j.dump();
}

TEST(BenchCli, JsonSchemaOnTheTinyModel) {
  REQUIRE_MODEL();
  const Result r = bench("-m " + stories().string() + kTiny + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schema"], "barata.bench/1");
  EXPECT_FALSE(j["interrupted"].get<bool>());
  EXPECT_TRUE(j["notices"].is_array());

  const json& m = j["model"];
  EXPECT_TRUE(m["path"].is_string());
  EXPECT_EQ(m["arch"], "llama");
  EXPECT_EQ(m["weight_type"], "F32");
  for (const char* k : {"n_layer", "d_model", "n_head", "n_head_kv", "head_dim", "d_ff", "n_vocab",
                        "n_ctx", "weight_bytes", "kv_bytes_per_token"})
    expect_int(m, k);
  EXPECT_EQ(m["n_ctx"], 128);
  EXPECT_EQ(m["kv_bytes_per_token"], 2 * 5 * 4 * 8 * 2);
  EXPECT_TRUE(j["machine"]["cpu"].is_string());
  expect_int(j["machine"], "hardware_threads");

  const json& s = j["settings"];
  EXPECT_EQ(s["reps"], 2);
  EXPECT_EQ(s["warmup"], 1);
  EXPECT_EQ(s["threads"], json::array({1}));
  EXPECT_EQ(s["tests"], json::array({"prefill", "decode", "cache", "kv", "batch", "roofline"}));
  EXPECT_EQ(s["prefill_tokens"], json::array({8, 16}));
  EXPECT_EQ(s["cache_tokens"], json::array({8, 16}));
  EXPECT_EQ(s["batch_sizes"], json::array({1, 3}));
  for (const char* k : {"batch_cached", "decode_steps", "n_generate", "bandwidth_bytes"})
    expect_int(s, k);

  ASSERT_FALSE(j["kv"].empty());
  for (const json& k : j["kv"]) {
    EXPECT_TRUE(k["name"].is_string());
    for (const char* f :
         {"n_layer", "n_head_kv", "head_dim", "n_tokens", "bytes_per_token", "block_tokens",
          "n_blocks", "rounded_tokens", "formula_bytes", "unrounded_bytes", "bytes_allocated"})
      expect_int(k, f);
    const int64_t per_token = 2 * k["n_layer"].get<int64_t>() * k["n_head_kv"].get<int64_t>() *
                              k["head_dim"].get<int64_t>() * 2;
    EXPECT_EQ(k["bytes_per_token"], per_token);
    EXPECT_EQ(k["rounded_tokens"], k["n_blocks"].get<int64_t>() * 16);
    EXPECT_EQ(k["formula_bytes"], per_token * k["rounded_tokens"].get<int64_t>());
    EXPECT_EQ(k["bytes_allocated"], k["formula_bytes"]);
    EXPECT_TRUE(k["equal"].get<bool>()) << k.dump();
  }

  ASSERT_EQ(j["runs"].size(), 1u);
  const json& run = j["runs"][0];
  EXPECT_EQ(run["threads"], 1);
  ASSERT_EQ(run["prefill"].size(), 2u);
  for (const json& p : run["prefill"])
    for (const char* k : {"ms", "ms_per_token", "tokens_per_s", "ttft_ms"})
      expect_stat(p[k], 2, std::string("prefill ") + k);
  EXPECT_EQ(run["prefill"][1]["n_tokens"], 16);
  ASSERT_EQ(run["decode"].size(), 2u);
  for (const json& d : run["decode"]) {
    expect_int(d, "n_cached");
    expect_int(d, "bytes_per_step");
    for (const char* k : {"ms_per_step", "tokens_per_s", "gb_per_s"})
      expect_stat(d[k], 2, std::string("decode ") + k);
  }

  const json& c = run["cache"];
  EXPECT_TRUE(c["ids_identical"].get<bool>());
  EXPECT_TRUE(c["first_mismatch"].is_null());
  EXPECT_EQ(c["ids_cache"], c["ids_no_cache"]);
  EXPECT_EQ(c["ids_cache"].size(), 6u);
  EXPECT_EQ(c["n_generate"], 6);
  expect_int(c, "prompt_tokens");
  ASSERT_FALSE(c["points"].empty());
  EXPECT_EQ(c["points"].back()["n_generated"], 6);
  for (const json& p : c["points"]) {
    expect_stat(p["cache_ms"], 2, "cache_ms");
    expect_stat(p["no_cache_ms"], 2, "no_cache_ms");
    // Recomputing never costs fewer multiply-accumulates than reusing.
    EXPECT_GE(p["no_cache_proj_macs"].get<int64_t>(), p["cache_proj_macs"].get<int64_t>());
    EXPECT_GE(p["no_cache_attn_macs"].get<int64_t>(), p["cache_attn_macs"].get<int64_t>());
    EXPECT_GT(p["cache_proj_macs"].get<int64_t>(), 0);
  }
  // The first token comes from the same prefill either way.
  EXPECT_EQ(c["points"][0]["cache_proj_macs"], c["points"][0]["no_cache_proj_macs"]);

  ASSERT_EQ(run["batch"].size(), 2u);
  EXPECT_EQ(run["batch"][1]["batch"], 3);
  EXPECT_EQ(run["batch"][1]["n_cached"], 16);
  for (const json& b : run["batch"]) {
    expect_stat(b["step_ms"], 2, "batch step_ms");
    expect_stat(b["tokens_per_s"], 2, "batch tokens_per_s");
  }

  const json& f = run["roofline"];
  ASSERT_TRUE(f.is_object());
  expect_stat(f["bandwidth_gb_per_s"], 2, "bandwidth");
  expect_stat(f["decode_ms_per_step"], 2, "roofline decode");
  EXPECT_EQ(f["weight_bytes"], m["weight_bytes"]);
  EXPECT_EQ(f["buffer_bytes"], 8 << 20);
  for (const char* k : {"weight_gb_per_s", "fraction", "bound_tokens_per_s"})
    EXPECT_GT(f[k].get<double>(), 0.0) << k;
}

TEST(BenchCli, ListsBeyondTheContextAreCappedWithANotice) {
  REQUIRE_MODEL();
  const Result r = bench("-m " + stories().string() +
                         " --json -t 1 -r 1 --tests prefill,decode -p 16,1000,2000 -c 500 "
                         "--decode-steps 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("P=1000 is beyond the context of 128 tokens: capped to 128"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("C=500"), std::string::npos) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["settings"]["prefill_tokens"], json::array({16, 128}));
  EXPECT_EQ(j["settings"]["cache_tokens"], json::array({126}));
  EXPECT_EQ(j["notices"].size(), 3u);
  EXPECT_EQ(j["runs"][0]["prefill"].back()["n_tokens"], 128);
  EXPECT_TRUE(j["runs"][0]["cache"].is_null());  // not selected
  EXPECT_TRUE(j["kv"].empty());
}

// -n beyond what the context leaves after the cache test's prompt is capped to
// what the no-cache run (prompt + all but the last token, then a reply) fits.
TEST(BenchCli, CacheTestCapsGenerationToWhatTheNoCacheRunFits) {
  REQUIRE_MODEL();
  const Result r = bench("-m " + stories().string() + " --json -t 1 -r 1 --tests cache -n 200");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("capped to"), std::string::npos) << r.err;
  const json j = json::parse(r.out);
  const int64_t n = j["settings"]["n_generate"].get<int64_t>();
  EXPECT_EQ(n + j["runs"][0]["cache"]["prompt_tokens"].get<int64_t>(), 128) << r.out;
}

TEST(BenchCli, GarbageInAListIsAUsageError) {
  REQUIRE_MODEL();
  for (const char* bad : {"-p 16,abc", "-t 1,x", "-b 0", "--tests prefill,nope", "-r 0"}) {
    const Result r = bench("-m " + stories().string() + " " + bad);
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_TRUE(r.out.empty()) << bad;
    EXPECT_EQ(r.err.find("error: internal"), std::string::npos) << bad << ": " << r.err;
    EXPECT_FALSE(r.err.empty()) << bad;
  }
}

TEST(BenchCli, MarkdownCsvAndPlots) {
  REQUIRE_MODEL();
  test::TempDir dir;
  const std::string base = "-m " + stories().string() +
                           " -t 1 -r 1 --tests prefill,decode,kv,batch -p 8 -c 8 -b 1,2 "
                           "--batch-cached 8 --decode-steps 1";
  const Result md = bench(base + " --plot " + (dir / "plots").string());
  ASSERT_EQ(md.status, 0) << md.err;
  for (const char* h : {"## barata bench", "### Prefill", "### Decode", "### KV memory",
                        "### Batch sweep", "| 1 | 8 |"})
    EXPECT_NE(md.out.find(h), std::string::npos) << h;
  EXPECT_EQ(md.out.find("NOT equal"), std::string::npos);
  for (const char* name : {"prefill_decode.svg", "batch_throughput.svg", "batch_latency.svg"}) {
    const auto bytes = test::read_bytes(dir / "plots" / name);
    const std::string svg(bytes.begin(), bytes.end());
    EXPECT_EQ(svg.rfind("<svg", 0), 0u) << name;
    EXPECT_NE(svg.find("</svg>"), std::string::npos) << name;
  }
  EXPECT_FALSE(fs::exists(dir / "plots" / "cache_macs.svg"));  // cache not selected

  const Result csv = bench(base + " --csv");
  ASSERT_EQ(csv.status, 0) << csv.err;
  EXPECT_EQ(csv.out.rfind("test,threads,param,x,label,metric,mean,sd,median,min,max,n\n", 0), 0u);
  EXPECT_NE(csv.out.find("\nprefill,1,P,8,,ms,"), std::string::npos);
  EXPECT_NE(csv.out.find("\nbatch,1,B,2,,tokens_per_s,"), std::string::npos);
  EXPECT_NE(csv.out.find(",equal,1,0,1,1,1,1\n"), std::string::npos);
  EXPECT_EQ(csv.out.find(",equal,0,"), std::string::npos);
}

}  // namespace
}  // namespace barata
