// The workload library behind `barata batch` (include/barata/workload.h):
// the reference workload's three numbers and its determinism, JSONL parsing
// and its errors, the shared prefix, quantiles, and the static/continuous
// simulation on hand-computed cases.
#include <algorithm>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/tokenizer.h"
#include "barata/workload.h"
#include "test_util.h"

namespace barata {
namespace {

using namespace workload;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Workload, SplitMix64KnownValues) {
  // splitmix64's first outputs from seed 0 (Vigna's reference implementation).
  SplitMix64 r(0);
  EXPECT_EQ(r.next(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(r.next(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(r.next(), 0x06c45d188009454full);
  SplitMix64 u(1);
  for (int i = 0; i < 1000; ++i) {
    const double x = u.uniform();
    ASSERT_GT(x, 0.0);
    ASSERT_LT(x, 1.0);
  }
}

TEST(Workload, Reference64HasTheReferenceNumbers) {
  // The reference text's workload: 64 requests, median 18, max 231, total 1,874.
  const std::vector<int64_t> len = reference64_lengths();
  ASSERT_EQ(len.size(), 64u);
  EXPECT_EQ(std::accumulate(len.begin(), len.end(), int64_t{0}), 1874);
  EXPECT_EQ(*std::max_element(len.begin(), len.end()), 231);
  EXPECT_EQ(std::count(len.begin(), len.end(), 231), 1);
  std::vector<double> d(len.begin(), len.end());
  EXPECT_EQ(quantile(d, 0.5), 18.0);
  for (int64_t l : len) EXPECT_GE(l, 1);
  // Skewed as output lengths are: the mean well above the median.
  EXPECT_GT(1874.0 / 64, 18.0 * 1.3);
}

TEST(Workload, Reference64IsDeterministic) {
  EXPECT_EQ(reference64_lengths(), reference64_lengths());
  const auto a = reference64(), b = reference64();
  ASSERT_EQ(a.size(), 64u);
  std::set<std::string> prompts, ids;
  const std::vector<int64_t> len = reference64_lengths();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_EQ(a[i].max_tokens, len[i]);
    EXPECT_TRUE(a[i].ignore_eos);
    EXPECT_EQ(a[i].sampling.temperature, 0.0f);
    EXPECT_FALSE(a[i].prompt.empty());
    prompts.insert(a[i].prompt);
    ids.insert(a[i].id);
  }
  EXPECT_EQ(prompts.size(), 64u);  // all differ
  EXPECT_EQ(ids.size(), 64u);
  EXPECT_EQ(a[0].id, "ref-00");
}

TEST(Workload, JsonlDefaultsAndFields) {
  const std::string text =
      "{\"prompt\": \"Once upon a time\"}\n"
      "\n"
      "   \n"
      "{\"prompt\": \"Hi\", \"id\": \"x\", \"max_tokens\": 7, \"temperature\": 0.7, \"top_k\": 5, "
      "\"top_p\": 0.9, \"min_p\": 0.1, \"seed\": 42, \"ignore_eos\": true, \"stop\": [\".\", "
      "\"!\"], \"arrival_ms\": 12.5}\r\n"
      "{\"prompt\": \"\", \"id\": 17}";
  const auto r = parse_jsonl(text, "reqs.jsonl");
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].prompt, "Once upon a time");
  EXPECT_EQ(r[0].id, "");
  EXPECT_EQ(r[0].max_tokens, kDefaultMaxTokens);
  EXPECT_EQ(r[0].sampling.temperature, 0.0f);
  EXPECT_EQ(r[0].sampling.seed, 0u);
  EXPECT_FALSE(r[0].ignore_eos);
  EXPECT_TRUE(r[0].stop.empty());
  EXPECT_LT(r[0].arrival_ms, 0);
  EXPECT_EQ(r[0].line, 1);
  EXPECT_EQ(r[1].line, 4);
  EXPECT_EQ(r[1].id, "x");
  EXPECT_EQ(r[1].max_tokens, 7);
  EXPECT_FLOAT_EQ(r[1].sampling.temperature, 0.7f);
  EXPECT_EQ(r[1].sampling.top_k, 5);
  EXPECT_FLOAT_EQ(r[1].sampling.top_p, 0.9f);
  EXPECT_FLOAT_EQ(r[1].sampling.min_p, 0.1f);
  EXPECT_EQ(r[1].sampling.seed, 42u);
  EXPECT_TRUE(r[1].ignore_eos);
  EXPECT_EQ(r[1].stop, (std::vector<std::string>{".", "!"}));
  EXPECT_DOUBLE_EQ(r[1].arrival_ms, 12.5);
  EXPECT_EQ(r[2].id, "17");
  EXPECT_EQ(r[2].prompt, "");
  EXPECT_EQ(r[2].sampling.seed, 4u);  // the line's 0-based index
}

TEST(Workload, JsonlErrorsNameFileAndLine) {
  const std::string good = "{\"prompt\": \"a\"}\n\n";
  struct Case {
    std::string line, expect;
  };
  const Case cases[] = {
      {"{\"prompt\": \"a\"", "not valid JSON"},
      {"{\"prompt\": \"a\", \"max_tokens\": 1e999}", "not valid JSON"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"max_tokens\": 3}", "no \"prompt\""},
      {"{\"prompt\": 5}", "\"prompt\" must be a string"},
      {"{\"prompt\": \"a\", \"max_token\": 3}", "unknown key \"max_token\""},
      {"{\"prompt\": \"a\", \"max_tokens\": 0}", "outside [1, "},
      {"{\"prompt\": \"a\", \"max_tokens\": 2.5}", "must be an integer"},
      {"{\"prompt\": \"a\", \"temperature\": -1}", "below 0"},
      {"{\"prompt\": \"a\", \"top_p\": 0}", "outside (0, 1]"},
      {"{\"prompt\": \"a\", \"min_p\": 2}", "outside [0, 1]"},
      {"{\"prompt\": \"a\", \"seed\": -3}", "\"seed\""},
      {"{\"prompt\": \"a\", \"ignore_eos\": 1}", "true or false"},
      {"{\"prompt\": \"a\", \"stop\": \"x\"}", "array of strings"},
      {"{\"prompt\": \"a\", \"stop\": [\"\"]}", "non-empty strings"},
      {"{\"prompt\": \"a\", \"arrival_ms\": -1}", "below 0"},
      {"{\"prompt\": \"a\", \"id\": [1]}", "\"id\" must be"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.line);
    const std::string e = error_of([&] { parse_jsonl(good + c.line + "\n" + good, "reqs.jsonl"); });
    EXPECT_EQ(e.rfind("reqs.jsonl: line 3: ", 0), 0u) << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << e;
  }
  EXPECT_NE(error_of([] { parse_jsonl("\n \n", "empty.jsonl"); }).find("empty.jsonl: no requests"),
            std::string::npos);
}

TEST(Workload, Quantiles) {
  EXPECT_EQ(quantile({}, 0.5), 0.0);
  EXPECT_EQ(quantile({3}, 0.99), 3.0);
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 0.9), 3.7);
  EXPECT_DOUBLE_EQ(quantile({4, 1, 3, 2}, 1.0), 4.0);
  const std::vector<double> v = {1, 2, 3, 4, 10};
  const LatencySummary s = summarize_latency(v);
  EXPECT_EQ(s.n, 5);
  EXPECT_DOUBLE_EQ(s.mean, 4.0);
  EXPECT_DOUBLE_EQ(s.median, 3.0);
  EXPECT_DOUBLE_EQ(s.p90, 7.6);
  EXPECT_DOUBLE_EQ(s.max, 10.0);
}

TEST(Workload, SharedPrefixIsExactAndFollowsBos) {
  const auto path = test::tiny_model("stories260K.gguf");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const GgufFile f = GgufFile::open(path);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  for (int64_t n : {0, 1, 16, 40, 700}) {
    SCOPED_TRACE(n);
    const auto p = shared_prefix_ids(tok, n);
    ASSERT_EQ(static_cast<int64_t>(p.size()), n);
    const std::vector<int32_t> plain = tok.encode("Lily went home.", tok.add_bos_default(), false);
    EXPECT_EQ(prompt_ids(tok, "Lily went home.", {}), plain);
    const auto ids = prompt_ids(tok, "Lily went home.", p);
    ASSERT_EQ(ids.size(), plain.size() + p.size());
    ASSERT_TRUE(tok.add_bos_default());
    EXPECT_EQ(ids[0], tok.bos_id());
    EXPECT_TRUE(std::equal(p.begin(), p.end(), ids.begin() + 1));
    EXPECT_TRUE(std::equal(plain.begin() + 1, plain.end(), ids.begin() + 1 + n));
  }
  EXPECT_EQ(shared_prefix_ids(tok, 40), shared_prefix_ids(tok, 40));
}

TEST(Workload, SimulateTwoSlotsByHand) {
  // 2 slots, lengths {1, 3, 2}, a step of 1 row costs 1 ms, of 2 rows 1.5 ms.
  const std::vector<int64_t> len = {1, 3, 2};
  const std::vector<double> cost = {1.0, 1.5};
  // Continuous: step 1 {A, B} -> A done at 1.5; step 2 {B, C}; step 3 {B, C}
  // -> B and C done at 4.5.
  const SimResult c = simulate(BatchPolicy::kContinuous, len, {}, 2, cost);
  ASSERT_EQ(c.finish_s.size(), 3u);
  EXPECT_DOUBLE_EQ(c.finish_s[0], 0.0015);
  EXPECT_DOUBLE_EQ(c.finish_s[1], 0.0045);
  EXPECT_DOUBLE_EQ(c.finish_s[2], 0.0045);
  EXPECT_DOUBLE_EQ(c.total_s, 0.0045);
  EXPECT_EQ(c.steps, 3);
  EXPECT_EQ(c.busy_slot_steps, 6);
  EXPECT_EQ(c.padding_slot_steps, 0);
  EXPECT_EQ(c.tokens, 6);
  EXPECT_DOUBLE_EQ(c.mean_latency_s(), 0.0035);
  // Static: batch {A, B} for 3 steps of 2 rows (A padding in steps 2 and 3),
  // A's last token at 1.5 but delivered with B's at 4.5; then batch {C}: 2
  // steps of 1 row, done at 6.5.
  const SimResult s = simulate(BatchPolicy::kStatic, len, {}, 2, cost);
  EXPECT_DOUBLE_EQ(s.finish_s[0], 0.0045);
  EXPECT_DOUBLE_EQ(s.finish_s[1], 0.0045);
  EXPECT_DOUBLE_EQ(s.finish_s[2], 0.0065);
  EXPECT_DOUBLE_EQ(s.total_s, 0.0065);
  EXPECT_EQ(s.steps, 5);
  EXPECT_EQ(s.busy_slot_steps, 6);
  EXPECT_EQ(s.padding_slot_steps, 2);
  EXPECT_NEAR(s.mean_latency_s(), 0.0155 / 3, 1e-15);
  EXPECT_NEAR(c.tokens_per_s() / s.tokens_per_s(), 6.5 / 4.5, 1e-12);
}

TEST(Workload, SimulateArrivalsAndIdleTime) {
  // One slot, A (2 tokens) at 0, B (1 token) at 10 ms, 1 ms a step: A runs
  // 0..2 ms, nothing runs until B arrives, B is done at 11 ms.
  const std::vector<int64_t> len = {2, 1};
  const std::vector<double> arrivals = {0.0, 0.010}, cost = {1.0};
  for (BatchPolicy p : {BatchPolicy::kContinuous, BatchPolicy::kStatic}) {
    const SimResult r = simulate(p, len, arrivals, 1, cost);
    EXPECT_DOUBLE_EQ(r.finish_s[0], 0.002);
    EXPECT_DOUBLE_EQ(r.finish_s[1], 0.011);
    EXPECT_NEAR(r.latency_s[1], 0.001, 1e-15);
    EXPECT_DOUBLE_EQ(r.total_s, 0.011);
    EXPECT_EQ(r.steps, 3);
  }
  // Static does not admit a late arrival into a running batch; continuous does.
  const std::vector<int64_t> len2 = {4, 1};
  const std::vector<double> arr2 = {0.0, 0.0015}, cost2 = {1.0, 1.0};
  EXPECT_DOUBLE_EQ(simulate(BatchPolicy::kContinuous, len2, arr2, 2, cost2).finish_s[1], 0.003);
  EXPECT_DOUBLE_EQ(simulate(BatchPolicy::kStatic, len2, arr2, 2, cost2).finish_s[1], 0.005);
}

TEST(Workload, SimulateOnReference64FavoursContinuous) {
  const auto len = reference64_lengths();
  std::vector<double> cost;
  for (int b = 1; b <= 8; ++b) cost.push_back(10.0 + 0.5 * b);  // nearly flat: memory bound
  const SimResult s = simulate(BatchPolicy::kStatic, len, {}, 8, cost);
  const SimResult c = simulate(BatchPolicy::kContinuous, len, {}, 8, cost);
  EXPECT_EQ(s.tokens, 1874);
  EXPECT_EQ(s.busy_slot_steps, 1874);
  EXPECT_EQ(c.busy_slot_steps, 1874);
  EXPECT_GT(s.padding_slot_steps, 0);
  EXPECT_GT(c.tokens_per_s(), 1.5 * s.tokens_per_s());
  EXPECT_LT(c.mean_latency_s(), s.mean_latency_s());
}

TEST(Workload, SimulateRejectsBadInput) {
  const std::vector<int64_t> len = {1, 2};
  const std::vector<double> cost = {1.0, 2.0};
  EXPECT_NE(error_of([&] { simulate(BatchPolicy::kStatic, len, {}, 0, cost); }), "");
  EXPECT_NE(error_of([&] { simulate(BatchPolicy::kStatic, len, {}, 3, cost); }), "");
  const std::vector<int64_t> zero = {0};
  EXPECT_NE(error_of([&] { simulate(BatchPolicy::kStatic, zero, {}, 1, cost); }), "");
  const std::vector<double> one_arrival = {0.0};
  EXPECT_NE(error_of([&] { simulate(BatchPolicy::kStatic, len, one_arrival, 1, cost); }), "");
  const SimResult none = simulate(BatchPolicy::kContinuous, {}, {}, 1, cost);
  EXPECT_EQ(none.total_s, 0.0);
  EXPECT_EQ(none.steps, 0);
}

}  // namespace
}  // namespace barata
