// `barata batch` end to end on the committed tiny model
// (tests/data/models/stories260K.gguf): both policies give every request the
// ids `barata run` gives it, prefix caching changes no id, arrivals, a prompt
// too long for the context fails only its request, the text report with the
// simulation and the charts, and the usage and JSONL errors. Nothing here
// asserts a time.
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Result = test::CliResult;

fs::path stories() {
  return test::tiny_model("stories260K.gguf");
}

#define REQUIRE_MODEL() ASSERT_TRUE(fs::exists(stories())) << stories();

Result cli(const std::string& args) {
  return test::run_cli_within(args, 60);
}

std::string model_flags() {
  return " -m " + stories().string() + " -t 1 -c 256";
}
// A pool for every slot's whole context: no preemption unless a test wants it.
std::string batch_flags() {
  return model_flags() + " --kv-tokens 4096";
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

struct Req {
  std::string prompt;
  int max_tokens;
};
const std::vector<Req> kRequests = {
    {"Once upon a time", 12},       {"Lily and Tom went to the park", 5},
    {"The cat sat on the mat", 20}, {"One day, a little bird", 3},
    {"Tim had a big red ball", 9},  {"The sun was hot and the dog", 15},
};

std::string jsonl(const std::vector<Req>& reqs, const std::string& extra = "") {
  std::string s;
  for (size_t i = 0; i < reqs.size(); ++i)
    s += json({{"id", "r" + std::to_string(i)},
               {"prompt", reqs[i].prompt},
               {"max_tokens", reqs[i].max_tokens},
               {"ignore_eos", true}})
             .dump() +
         "\n" + (i == 1 ? "\n" : "") + extra;
  return s;
}

const json& policy(const json& doc, const std::string& name) {
  for (const json& p : doc["policies"])
    if (p["policy"] == name) return p;
  static const json none;
  return none;
}

TEST(BatchCli, BothPoliciesGiveTheIdsOfRun) {
  REQUIRE_MODEL();
  test::TempDir dir;
  write_text(dir / "reqs.jsonl", jsonl(kRequests));
  const Result r = cli("batch" + batch_flags() + " --requests " + (dir / "reqs.jsonl").string() +
                       " --policy both --slots 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schema"], "barata.batch/1");
  ASSERT_EQ(j["policies"].size(), 2u);
  const json &st = policy(j, "static"), &co = policy(j, "continuous");
  ASSERT_TRUE(st.is_object());
  ASSERT_TRUE(co.is_object());
  int64_t total = 0;
  for (const Req& q : kRequests) total += q.max_tokens;
  for (const json* p : {&st, &co}) {
    SCOPED_TRACE((*p)["policy"].get<std::string>());
    EXPECT_EQ((*p)["finished"], kRequests.size());
    EXPECT_EQ((*p)["failed"], 0);
    EXPECT_EQ((*p)["output_tokens"], total);
    EXPECT_GT((*p)["output_tokens_per_s"].get<double>(), 0.0);
    const double u = (*p)["slot_utilization"];
    EXPECT_GT(u, 0.0);
    EXPECT_LE(u, 1.0);
    for (const char* k : {"mean", "median", "p90", "p99"})
      EXPECT_GE((*p)["latency_s"][k].get<double>(), 0.0) << k;
    ASSERT_EQ((*p)["per_request"].size(), kRequests.size());
  }
  // Static batching pads: the short members of a batch wait for the longest.
  EXPECT_GT(st["padding_slot_steps"].get<int64_t>(), 0);
  EXPECT_EQ(co["padding_slot_steps"].get<int64_t>(), 0);
  EXPECT_TRUE(j["comparison"].is_object());

  for (size_t i = 0; i < kRequests.size(); ++i) {
    SCOPED_TRACE(kRequests[i].prompt);
    const json &a = st["per_request"][i], &b = co["per_request"][i];
    EXPECT_EQ(a["id"], "r" + std::to_string(i));
    EXPECT_EQ(a["finish"], "length");
    ASSERT_EQ(a["output_ids"].size(), static_cast<size_t>(kRequests[i].max_tokens));
    EXPECT_EQ(a["output_ids"], b["output_ids"]);
    EXPECT_EQ(a["prompt_tokens"], b["prompt_tokens"]);
    // `run` stops at an end-of-generation token: compare what it generated.
    const Result g =
        cli("run" + model_flags() + " --temp 0 --json -n " +
            std::to_string(kRequests[i].max_tokens) + " -p \"" + kRequests[i].prompt + "\"");
    ASSERT_EQ(g.status, 0) << g.err;
    const json gj = json::parse(g.out);
    EXPECT_EQ(gj["prompt_ids"].size(), a["prompt_tokens"].get<size_t>());
    const json& ids = gj["generated_ids"];
    ASSERT_GE(ids.size(), 1u);
    if (gj["stop"] != "eog") EXPECT_EQ(ids.size(), a["output_ids"].size());
    for (size_t t = 0; t < ids.size() && t < a["output_ids"].size(); ++t)
      EXPECT_EQ(ids[t], a["output_ids"][t]) << "token " << t;
  }
}

// Speculative decoding in the batch: n-gram lookup, the model as its own
// draft, and its quantized self give every request the plain ids, while
// speculating sequences share each step with the others.
TEST(BatchCli, SpeculativeDraftsGiveThePlainIds) {
  REQUIRE_MODEL();
  test::TempDir dir;
  write_text(dir / "reqs.jsonl", jsonl(kRequests));
  const std::string base = "batch" + batch_flags() + " --requests " +
                           (dir / "reqs.jsonl").string() + " --slots 3 --json";
  const Result plain = cli(base);
  ASSERT_EQ(plain.status, 0) << plain.err;
  const json p = policy(json::parse(plain.out), "continuous");
  ASSERT_TRUE(p.is_object());
  EXPECT_EQ(p["speculative"]["verify_passes"], 0);
  for (const std::string flags :
       {std::string(" --lookup 3"), " --draft " + stories().string() + " --draft-max 4",
        std::string(" --draft-self q8_0")}) {
    SCOPED_TRACE(flags);
    const Result r = cli(base + flags);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("speculative"), std::string::npos) << r.err;
    const json s = policy(json::parse(r.out), "continuous");
    ASSERT_TRUE(s.is_object());
    EXPECT_GT(s["speculative"]["accepted"].get<int64_t>(), 0);
    for (size_t i = 0; i < kRequests.size(); ++i)
      EXPECT_EQ(s["per_request"][i]["output_ids"], p["per_request"][i]["output_ids"]) << i;
  }
  // --draft-auto: each sequence chooses its gamma, plain steps included.
  const Result autog = cli(base + " --lookup 3 --draft-auto");
  ASSERT_EQ(autog.status, 0) << autog.err;
  const json s = policy(json::parse(autog.out), "continuous");
  ASSERT_TRUE(s.is_object());
  for (size_t i = 0; i < kRequests.size(); ++i)
    EXPECT_EQ(s["per_request"][i]["output_ids"], p["per_request"][i]["output_ids"]) << i;
  const Result bad = cli(base + " --draft-auto");
  EXPECT_NE(bad.status, 0) << "--draft-auto needs a drafter";
  EXPECT_NE(bad.err.find("need a drafter"), std::string::npos) << bad.err;
}

TEST(BatchCli, PrefixCacheHitsWithoutChangingIds) {
  REQUIRE_MODEL();
  test::TempDir dir;
  write_text(dir / "reqs.jsonl", jsonl(kRequests));
  const std::string base = "batch" + batch_flags() + " --requests " +
                           (dir / "reqs.jsonl").string() +
                           " --policy continuous --slots 2 --shared-prefix 40 --json";
  const Result on = cli(base), off = cli(base + " --no-prefix-cache");
  ASSERT_EQ(on.status, 0) << on.err;
  ASSERT_EQ(off.status, 0) << off.err;
  const json a = json::parse(on.out)["policies"][0], b = json::parse(off.out)["policies"][0];
  // BOS + 40 shared tokens: two full blocks of 16 every later request can take.
  EXPECT_GT(a["prefix_cache"]["hit_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(a["prefix_cache"]["hit_tokens"].get<int64_t>() % 16, 0);
  EXPECT_GT(a["prefix_cache"]["blocks_shared"].get<int64_t>(), 0);
  EXPECT_EQ(b["prefix_cache"]["hit_tokens"].get<int64_t>(), 0);
  EXPECT_LT(a["prefill_rows"].get<int64_t>(), b["prefill_rows"].get<int64_t>());
  for (size_t i = 0; i < kRequests.size(); ++i) {
    EXPECT_EQ(a["per_request"][i]["output_ids"], b["per_request"][i]["output_ids"]) << i;
    EXPECT_GE(a["per_request"][i]["prompt_tokens"].get<int64_t>(), 41);
  }
}

TEST(BatchCli, PrefixCacheIsColdForEachPolicy) {
  REQUIRE_MODEL();
  test::TempDir dir;
  write_text(dir / "reqs.jsonl", jsonl(kRequests));
  const Result r = cli("batch" + batch_flags() + " --requests " + (dir / "reqs.jsonl").string() +
                       " --policy both --slots 6 --shared-prefix 40 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  // Six slots: every request is admitted in the first step, before any block
  // is published, so neither policy may hit (the second would, on a warm cache).
  for (const json& p : j["policies"]) EXPECT_EQ(p["prefix_cache"]["hit_tokens"], 0) << p["policy"];
}

TEST(BatchCli, ArrivalInterval) {
  REQUIRE_MODEL();
  test::TempDir dir;
  write_text(dir / "reqs.jsonl", jsonl({{"Once", 3}, {"The dog", 3}, {"A cat", 3}}));
  const Result r = cli("batch" + batch_flags() + " --requests " + (dir / "reqs.jsonl").string() +
                       " --arrival-interval 30 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json p = json::parse(r.out)["policies"][0];
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(p["per_request"][i]["arrival_s"].get<double>(), 0.03 * i, 1e-9);
    EXPECT_GE(p["per_request"][i]["latency_s"].get<double>(), 0.0);
    EXPECT_GE(p["per_request"][i]["ttft_s"].get<double>(), 0.0);
  }
  EXPECT_GE(p["wall_s"].get<double>(), 0.06);
}

TEST(BatchCli, TooLongPromptFailsOnlyItsRequest) {
  REQUIRE_MODEL();
  test::TempDir dir;
  std::string words;
  for (int i = 0; i < 30; ++i) words += "the dog ran ";
  std::vector<Req> reqs = {{"Once upon a time", 4}, {words, 4}, {"The cat", 4}};
  write_text(dir / "reqs.jsonl", jsonl(reqs));
  const Result r = cli("batch -m " + stories().string() + " -t 1 -c 32 --requests " +
                       (dir / "reqs.jsonl").string() + " --policy both --slots 2 --json");
  EXPECT_EQ(r.status, 1) << r.err;
  const json j = json::parse(r.out);  // the results are printed all the same
  for (const json& p : j["policies"]) {
    EXPECT_EQ(p["failed"], 1);
    EXPECT_EQ(p["finished"], 2);
    EXPECT_EQ(p["per_request"][1]["status"], "failed");
    EXPECT_NE(p["per_request"][1]["error"].get<std::string>().find("context holds 32"),
              std::string::npos);
    EXPECT_EQ(p["per_request"][0]["output_ids"].size(), 4u);
    EXPECT_EQ(p["per_request"][2]["output_ids"].size(), 4u);
  }
  EXPECT_NE(r.err.find("error: request r1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 of 3 requests failed"), std::string::npos) << r.err;
}

TEST(BatchCli, Reference64TextReportSimulationAndCharts) {
  REQUIRE_MODEL();
  test::TempDir dir;
  // -c 512: the longest request (231 tokens after its prompt) fits the context.
  const Result r = cli("batch -m " + stories().string() + " -t 1 -c 512 --kv-tokens 4096" +
                       " --workload reference64 --policy both --slots 8 --simulate --plot " +
                       (dir / "charts").string());
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* s :
       {"64 requests (reference64)", "KV pool", "policy static", "policy continuous",
        "1874 output tokens", "latency", "TTFT", "prefix cache",
        "comparison: continuous/static throughput", "simulation", "measured"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_NE(r.err.find("[batch] static 64/64"), std::string::npos) << r.err;
  for (const char* f : {"latency-cdf.svg", "occupancy-static.svg", "occupancy-continuous.svg"}) {
    const auto b = test::read_bytes(dir / "charts" / f);
    const std::string svg(b.begin(), b.end());
    EXPECT_EQ(svg.rfind("<svg", 0), 0u) << f;
    EXPECT_NE(svg.find("</svg>"), std::string::npos) << f;
  }
}

TEST(BatchCli, MalformedJsonlNamesTheLine) {
  REQUIRE_MODEL();
  test::TempDir dir;
  write_text(dir / "bad.jsonl",
             "{\"prompt\": \"Once\"}\n\n{\"prompt\": \"x\", \"max_tokens\": }\n");
  Result r = cli("batch" + batch_flags() + " --requests " + (dir / "bad.jsonl").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("bad.jsonl: line 3: not valid JSON"), std::string::npos) << r.err;
  write_text(dir / "bad.jsonl", "{\"prompt\": \"Once\", \"max_tokens\": \"many\"}\n");
  r = cli("batch" + batch_flags() + " --requests " + (dir / "bad.jsonl").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("line 1: \"max_tokens\" must be an integer"), std::string::npos) << r.err;
  // Refused before the model loads: the "model" here is no GGUF file at all.
  r = cli("batch -m " + (dir / "bad.jsonl").string() + " --requests " +
          (dir / "bad.jsonl").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("line 1: \"max_tokens\""), std::string::npos) << r.err;
}

TEST(BatchCli, UsageErrors) {
  REQUIRE_MODEL();
  test::TempDir dir;
  write_text(dir / "reqs.jsonl", jsonl({{"Once", 2}}));
  const std::string m = "batch" + model_flags() + " ";
  const std::string req = " --requests " + (dir / "reqs.jsonl").string();
  for (const std::string& args :
       {m + req + " --slots 0", m + req + " --slots -1", m + req + " --max-batch-tokens -4",
        m + req + " --max-batch-tokens 0", m + req + " --shared-prefix -1",
        m + req + " --arrival-interval -5", m + req + " --arrival-interval nan",
        m + req + " --policy dynamic", m, m + req + " --workload reference64",
        m + " --workload reference32"}) {
    SCOPED_TRACE(args);
    const Result r = cli(args);
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.status, 1);  // a usage error, not a run's
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
}  // namespace barata
