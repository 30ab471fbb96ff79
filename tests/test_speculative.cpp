// Speculative decoding (include/barata/speculative.h): greedy output equals
// the target alone for every drafter kind and gamma; sampled output has the
// target's distribution (a chi-square test over fixed seeds with a draft
// that differs on purpose); the caches after rejections equal a fresh
// prefill; n-gram lookup; the formula; vocabulary checks; the CLI.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/agreement.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/model.h"
#include "barata/sampler.h"
#include "barata/speculative.h"
#include "barata/tokenizer.h"
#include "sanitizer.h"
#include "loaded_model.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using Loaded = test::LoadedModel;  // tiny models at a context of 128

const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog ran",
                                           "She had a red ball and"};

std::vector<int32_t> encode(const Loaded& m, const std::string& text) {
  return m.tok.encode(text, m.tok.add_bos_default(), false);
}

SpeculativeOptions greedy_options(int gamma, int n) {
  SpeculativeOptions o;
  o.sampling.temperature = 0.0f;
  o.draft_max = gamma;
  o.n_predict = n;
  return o;
}

// The target alone, greedy, one decode step per token (no stop at EOS).
std::vector<int32_t> alone(Engine& target, const std::vector<int32_t>& prompt, int n) {
  return greedy_traces(target, {prompt}, n).at(0).generated;
}

void expect_greedy_exact(Loaded& target, Drafter& drafter, const std::string& what) {
  for (const std::string& text : kPrompts) {
    const auto prompt = encode(target, text);
    const auto want = alone(target.engine, prompt, 40);
    for (int gamma : {1, 3, 8}) {
      const SpecResult r =
          speculative_generate(target.engine, drafter, prompt, greedy_options(gamma, 40));
      EXPECT_EQ(r.generated, want) << what << ", gamma " << gamma << ", \"" << text << "\"";
      EXPECT_LE(r.stats.accepted, r.stats.drafted);
    }
    SpeculativeOptions ao = greedy_options(8, 40);
    ao.auto_gamma = true;
    EXPECT_EQ(speculative_generate(target.engine, drafter, prompt, ao).generated, want)
        << what << ", --draft-auto, \"" << text << "\"";
  }
  EXPECT_EQ(target.engine.blocks().blocks_in_use(), 0) << "the target's sequences were freed";
}

TEST(Speculative, FormulaOfTheReferenceText) {
  // alpha 0.9, gamma 8: 3.40x; alpha 0.3: 0.79x (c = 0.1).
  EXPECT_NEAR(predicted_speedup(0.9, 8, 0.1), 3.40, 0.005);
  EXPECT_NEAR(predicted_speedup(0.3, 8, 0.1), 0.79, 0.005);
  EXPECT_NEAR(expected_tokens_per_verify(0.3, 8), 1.4285, 1e-3);
  EXPECT_DOUBLE_EQ(expected_tokens_per_verify(1.0, 4), 5.0);
  EXPECT_DOUBLE_EQ(expected_tokens_per_verify(0.0, 4), 1.0);
  // A verify pass dearer than one step lowers it: gamma c + v.
  EXPECT_NEAR(predicted_speedup(0.9, 8, 0.1, 2.0), 6.1258 / 2.8, 1e-3);
}

TEST(Speculative, GreedyWithItselfAsDraftIsExactAndAcceptsEverything) {
  Loaded target(test::tiny_model("stories260K.gguf"));
  Loaded draft(test::tiny_model("stories260K.gguf"));
  ModelDrafter d(draft.engine, {.sampling = {.temperature = 0.0f}}, "self");
  expect_greedy_exact(target, d, "itself");
  const auto prompt = encode(target, kPrompts[0]);
  const SpecResult r = speculative_generate(target.engine, d, prompt, greedy_options(4, 31));
  EXPECT_EQ(r.stats.accepted, r.stats.drafted);
  EXPECT_EQ(r.stats.verify_passes, 6);  // 1 token from the prefill, then 6 x (4 + 1)
  EXPECT_DOUBLE_EQ(r.stats.alpha, 1.0);
}

TEST(Speculative, GreedyWithTheF16CopyIsExact) {
  Loaded target(test::tiny_model("stories260K.gguf"));
  Loaded draft(test::tiny_model("stories260K-f16.gguf"));
  ModelDrafter d(draft.engine, {.sampling = {.temperature = 0.0f}}, "f16");
  expect_greedy_exact(target, d, "F16 copy");
}

TEST(Speculative, GreedyWithAQuantizedSelfDraftIsExactAndRejectsSometimes) {
  Loaded target(test::tiny_model("stories260K.gguf"));
  Loaded draft(quantized_copy(test::tiny_model("stories260K.gguf"), "int4-tensor", 1));
  ModelDrafter d(draft.engine, {.sampling = {.temperature = 0.0f}}, "int4-tensor");
  expect_greedy_exact(target, d, "int4-tensor self-draft");
  // Rejections happened, so the truncations were exercised.
  int64_t drafted = 0, accepted = 0;
  for (const std::string& text : kPrompts) {
    const SpecResult r =
        speculative_generate(target.engine, d, encode(target, text), greedy_options(8, 40));
    drafted += r.stats.drafted;
    accepted += r.stats.accepted;
  }
  EXPECT_GT(drafted, accepted);
  EXPECT_GT(accepted, 0);
}

TEST(Speculative, GreedyWithLookupIsExact) {
  Loaded target(test::tiny_model("stories260K.gguf"));
  LookupDrafter d(3);
  expect_greedy_exact(target, d, "lookup");
}

TEST(Speculative, TheTargetCacheAfterRejectionsEqualsAFreshPrefill) {
  Loaded target(test::tiny_model("stories260K.gguf"));
  Loaded draft(quantized_copy(test::tiny_model("stories260K.gguf"), "int4-tensor", 1));
  ModelDrafter d(draft.engine, {.sampling = {.temperature = 0.0f}}, "int4-tensor");
  const auto prompt = encode(target, kPrompts[1]);
  SpeculativeOptions o = greedy_options(6, 30);
  o.keep_sequence = true;
  const SpecResult r = speculative_generate(target.engine, d, prompt, o);
  ASSERT_GE(r.seq, 0);
  ASSERT_GT(r.stats.drafted, r.stats.accepted) << "no rejection to test";
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r.generated.begin(), r.generated.end());
  ASSERT_EQ(target.engine.length(r.seq), static_cast<int64_t>(all.size()) - 1);
  // The last token through the kept cache against the whole sequence afresh.
  const size_t nv = static_cast<size_t>(target.model.config().n_vocab);
  std::vector<float> kept(nv), fresh(nv);
  const int32_t last = all.back();
  target.engine.decode(std::span<const int>(&r.seq, 1), std::span<const int32_t>(&last, 1),
                       kept.data());
  target.engine.free_sequence(r.seq);
  const int s = target.engine.new_sequence();
  target.engine.prefill(s, all, fresh.data());
  target.engine.free_sequence(s);
  for (size_t i = 0; i < nv; ++i) ASSERT_NEAR(kept[i], fresh[i], 1e-4f) << "logit " << i;
}

TEST(Speculative, TheDraftCacheFollowsADivergingContext) {
  // Propose after context A, then after B (A's prefix with other tokens):
  // the proposal equals a fresh drafter's for B.
  Loaded a(test::tiny_model("stories260K.gguf"));
  Loaded b(test::tiny_model("stories260K.gguf"));
  ModelDrafter used(a.engine, {.sampling = {.temperature = 0.0f}}, "used");
  ModelDrafter fresh(b.engine, {.sampling = {.temperature = 0.0f}}, "fresh");
  std::vector<int32_t> ctx = encode(a, kPrompts[2]);
  Draft d1, d2;
  used.propose(ctx, 6, d1);
  ASSERT_EQ(d1.tokens.size(), 6u);
  std::vector<int32_t> other = ctx;
  other.push_back(d1.tokens[0]);
  other.push_back(d1.tokens[1] == 5 ? 6 : 5);  // a rejection after one kept token
  used.propose(other, 6, d1);
  fresh.propose(other, 6, d2);
  EXPECT_EQ(d1.tokens, d2.tokens);
  // A shorter context than the cache (the caller went back).
  used.propose(ctx, 4, d1);
  fresh.propose(ctx, 4, d2);
  EXPECT_EQ(d1.tokens, d2.tokens);
}

TEST(Speculative, LookupProposesTheContinuationOfTheLastNgram) {
  LookupDrafter d(3, 1);
  Draft out;
  const std::vector<int32_t> ctx = {1, 2, 3, 4, 5, 9, 1, 2, 3};
  d.propose(ctx, 2, out);  // "1 2 3" occurred at 0: then 4 5
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(out.q.empty());
  d.propose(std::vector<int32_t>{7, 8, 7}, 5, out);  // "7" at 0: then 8 7 (up to the end)
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{8, 7}));
  d.propose(std::vector<int32_t>{1, 2, 3}, 4, out);  // nothing repeats
  EXPECT_TRUE(out.tokens.empty());
  // The most recent occurrence wins.
  d.propose(std::vector<int32_t>{5, 1, 6, 5, 2, 6, 5}, 1, out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{2}));
}

TEST(Speculative, AcceptRuleOnKnownDistributions) {
  std::mt19937_64 rng(7);
  const Draft::Dist p{{0, 1, 2}, {0.5, 0.3, 0.2}};
  // q == p: always accepted.
  for (int i = 0; i < 200; ++i) {
    bool ok = false;
    EXPECT_EQ(speculative_accept(p, &p, 1, rng, &ok), 1);
    EXPECT_TRUE(ok);
  }
  // A token outside p's support is never accepted; the replacement comes from p - q.
  const Draft::Dist q{{3}, {1.0}};
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) {
    bool ok = true;
    ++seen[speculative_accept(p, &q, 3, rng, &ok)];
    EXPECT_FALSE(ok);
  }
  EXPECT_EQ(seen.count(3), 0u);
  EXPECT_NEAR(seen[0] / 2000.0, 0.5, 0.05);
  // A point mass (lookup) on token 0: accepted with probability p(0).
  int acc = 0;
  for (int i = 0; i < 4000; ++i) {
    bool ok = false;
    const int32_t t = speculative_accept(p, nullptr, 0, rng, &ok);
    acc += ok;
    if (!ok) EXPECT_NE(t, 0);
  }
  EXPECT_NEAR(acc / 4000.0, 0.5, 0.04);
}

// The chi-square statistic of counts against probabilities, bins with an
// expected count under 5 merged into one; and the critical value at 1e-4
// (the Wilson-Hilferty approximation; z = 3.719).
struct Chi2 {
  double stat = 0;
  int df = 0;
  double critical() const {
    const double k = df, z = 3.719;
    return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
  }
};
Chi2 chi_square(const std::map<int32_t, int>& counts, const Draft::Dist& p, int n) {
  Chi2 c;
  double merged_obs = 0, merged_exp = 0;
  int bins = 0;
  double covered_obs = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double e = p.p[i] * n;
    const auto it = counts.find(p.ids[i]);
    const double o = it == counts.end() ? 0 : it->second;
    covered_obs += o;
    if (e < 5) {
      merged_obs += o;
      merged_exp += e;
      continue;
    }
    c.stat += (o - e) * (o - e) / e;
    ++bins;
  }
  // Tokens outside p's support land in the merged bin (expected ~0: any is a failure).
  merged_obs += n - covered_obs;
  if (merged_exp > 0 || merged_obs > 0) {
    c.stat += (merged_obs - merged_exp) * (merged_obs - merged_exp) / std::max(merged_exp, 1e-9);
    ++bins;
  }
  c.df = std::max(bins - 1, 1);
  return c;
}

Draft::Dist target_dist(Loaded& m, const std::vector<int32_t>& ctx, const SamplerOptions& s) {
  std::vector<float> logits(static_cast<size_t>(m.model.config().n_vocab));
  const int seq = m.engine.new_sequence();
  m.engine.prefill(seq, ctx, logits.data());
  m.engine.free_sequence(seq);
  SamplingCandidates c;
  sampling_candidates(s, logits, c);
  Draft::Dist d{c.ids, {}};
  for (double w : c.w) d.p.push_back(w / c.total);
  return d;
}

TEST(Speculative, SamplingKeepsTheTargetsDistribution) {
  // Target at T = 1, top-k 8; the draft is the same weights at T = 2.5 and
  // top-k 16: a different q (wider, with tokens p never gives), so the rule
  // must both reject and resample for the output to match p.
  Loaded target(test::tiny_model("stories260K.gguf"));
  Loaded draft(test::tiny_model("stories260K-f16.gguf"));
  const SamplerOptions ts{.temperature = 1.0f, .top_k = 8, .top_p = 1.0f, .min_p = 0.0f};
  const SamplerOptions ds{.temperature = 2.5f, .top_k = 16, .top_p = 1.0f, .min_p = 0.0f};
  const auto prompt = encode(target, "Once upon a time, there was a");
  const int runs = test::sanitized() ? 1500 : 3000;
  std::map<int32_t, int> first;
  std::map<int32_t, std::map<int32_t, int>> second;
  int64_t drafted = 0, accepted = 0;
  for (int i = 0; i < runs; ++i) {
    ModelDrafterOptions dopt{.sampling = ds};
    dopt.sampling.seed = 1000 + static_cast<uint64_t>(i);
    ModelDrafter d(draft.engine, dopt, "T2.5");
    SpeculativeOptions o;
    o.sampling = ts;
    o.sampling.seed = static_cast<uint64_t>(i);
    o.draft_max = 3;
    o.n_predict = 3;
    const SpecResult r = speculative_generate(target.engine, d, prompt, o);
    ASSERT_EQ(r.generated.size(), 3u);
    ++first[r.generated[0]];
    ++second[r.generated[0]][r.generated[1]];
    drafted += r.stats.drafted;
    accepted += r.stats.accepted;
  }
  EXPECT_GT(drafted, accepted) << "the draft must be rejected sometimes";
  EXPECT_GT(accepted, 0);
  // The first token comes from the prefill (a plain draw): the second is the
  // first drafted and verified one, the third (not tested) the next.
  const Draft::Dist p1 = target_dist(target, prompt, ts);
  const Chi2 c1 = chi_square(first, p1, runs);
  EXPECT_LT(c1.stat, c1.critical()) << "first token, df " << c1.df;
  // The second token given the most common first one.
  int32_t mode = first.begin()->first;
  for (const auto& [t, n] : first)
    if (n > first[mode]) mode = t;
  std::vector<int32_t> ctx = prompt;
  ctx.push_back(mode);
  const Draft::Dist p2 = target_dist(target, ctx, ts);
  const Chi2 c2 = chi_square(second[mode], p2, first[mode]);
  EXPECT_LT(c2.stat, c2.critical()) << "second token after " << mode << ", df " << c2.df;
  // The test has power: the draft's own distribution fails it by far.
  const Draft::Dist q2 = target_dist(draft, ctx, ds);
  std::map<int32_t, int> as_q;
  for (size_t i = 0; i < q2.ids.size(); ++i)
    as_q[q2.ids[i]] = static_cast<int>(std::lround(q2.p[i] * first[mode]));
  const Chi2 cq = chi_square(as_q, p2, first[mode]);
  EXPECT_GT(cq.stat, 10 * cq.critical());
}

TEST(Speculative, AVocabularyMismatchNamesTheFirstDifferingId) {
  Loaded a(test::tiny_model("stories260K.gguf"));
  Loaded b(test::tiny_model("aidreams260K.gguf"));
  EXPECT_NO_THROW(check_same_tokens(a.tok, a.model, a.tok, a.model));
  try {
    check_same_tokens(a.tok, a.model, b.tok, b.model);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("draft"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(Speculative, BadOptionsAreErrors) {
  Loaded target(test::tiny_model("stories260K.gguf"));
  LookupDrafter d(2);
  const auto prompt = encode(target, kPrompts[0]);
  SpeculativeOptions o = greedy_options(4, 8);
  o.sampling.repeat_penalty = 1.1f;
  EXPECT_THROW(speculative_generate(target.engine, d, prompt, o), Error);
  o = greedy_options(0, 8);
  EXPECT_THROW(speculative_generate(target.engine, d, prompt, o), Error);
  EXPECT_THROW(speculative_generate(target.engine, d, {}, greedy_options(4, 8)), Error);
  EXPECT_THROW(LookupDrafter(0), Error);
}

TEST(Speculative, StopsAtEndOfGenerationAndAtNPredict) {
  Loaded target(test::tiny_model("stories260K.gguf"));
  LookupDrafter d(2);
  const auto prompt = encode(target, kPrompts[0]);
  const auto want = alone(target.engine, prompt, 20);
  SpeculativeOptions o = greedy_options(4, 20);
  const int32_t stop_at = want[7];
  o.is_eog = [&](int32_t t) { return t == stop_at; };
  const SpecResult r = speculative_generate(target.engine, d, prompt, o);
  EXPECT_EQ(r.finish, FinishReason::kEos);
  const auto first = std::find(want.begin(), want.end(), stop_at);
  EXPECT_EQ(r.generated, std::vector<int32_t>(want.begin(), first + 1));
  o.is_eog = nullptr;
  o.n_predict = 5;
  EXPECT_EQ(speculative_generate(target.engine, d, prompt, o).generated.size(), 5u);
}

TEST(Speculative, SmolLM2WithAQuantizedSelfDraftIsExact) {
  const fs::path smol = test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  BARATA_NEED_FETCHED(smol, test::fetch_script_for(smol));
  Loaded target(smol, 512);
  Loaded draft(quantized_copy(smol, "q4_0", 2), 512);
  ModelDrafter d(draft.engine, {.sampling = {.temperature = 0.0f}}, "q4_0");
  const int n = test::sanitized() ? 8 : 24;
  const auto prompt = encode(target, "The capital of France is");
  const auto want = alone(target.engine, prompt, n);
  for (int gamma : {2, 5}) {
    const SpecResult r = speculative_generate(target.engine, d, prompt, greedy_options(gamma, n));
    EXPECT_EQ(r.generated, want) << "gamma " << gamma;
  }
}

TEST(Speculative, Qwen15BWithThe05BDraftIsExact) {
  // The real pair: Qwen2.5-Coder-1.5B (Q4_K_M) verifying Qwen2.5-Coder-0.5B's drafts.
  const fs::path big = test::model_path("Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf");
  const fs::path small = test::model_path("Qwen2.5-Coder-0.5B-Instruct.gguf");
  BARATA_NEED_FETCHED(big, test::fetch_script_for(big));
  BARATA_NEED_FETCHED(small, test::fetch_script_for(small));
  Model tm = Model::load(big);
  Tokenizer tt = Tokenizer::from_gguf(tm.file());
  Engine target(tm, {.n_threads = 2, .n_ctx = 256});
  Model dm = Model::load(small);
  Tokenizer dt = Tokenizer::from_gguf(dm.file());
  Engine draft(dm, {.n_threads = 2, .n_ctx = 256});
  check_same_tokens(tt, tm, dt, dm);
  ModelDrafter d(draft, {.sampling = {.temperature = 0.0f}}, "0.5B");
  const auto prompt = tt.encode("def is_prime(n):\n", false, false);
  const int n = test::sanitized() ? 6 : 16;
  const auto want = greedy_traces(target, {prompt}, n).at(0).generated;
  const SpecResult r = speculative_generate(target, d, prompt, greedy_options(4, n));
  EXPECT_EQ(r.generated, want);
  EXPECT_GT(r.stats.accepted, 0);
}

// ---- the CLI ----------------------------------------------------------------

json run_json(const std::string& args) {
  const test::CliResult r = test::run_cli("run " + args + " --json");
  EXPECT_EQ(r.status, 0) << r.err;
  const auto nl = r.out.find_last_of('\n', r.out.size() - 2);
  return json::parse(nl == std::string::npos ? r.out : r.out.substr(nl + 1));
}

TEST(SpeculativeCli, DraftSelfDraftAndLookupGiveThePlainIds) {
  const std::string m = test::tiny_model("stories260K.gguf").string();
  const std::string base = "-m " + m + " -p \"Once upon a time\" -n 30 --temp 0 -t 1";
  const json plain = run_json(base);
  ASSERT_EQ(plain["generated_ids"].size(), 30u);
  for (const std::string extra :
       {"--draft " + test::tiny_model("stories260K-f16.gguf").string() + " --draft-max 4",
        std::string("--draft-self q8_0 --draft-auto"), std::string("--lookup 3 --draft-max 6")}) {
    const json j = run_json(base + " " + extra);
    EXPECT_EQ(j["generated_ids"], plain["generated_ids"]) << extra;
    ASSERT_TRUE(j.contains("speculative")) << extra;
    EXPECT_GE(j["speculative"]["drafted"].get<int64_t>(),
              j["speculative"]["accepted"].get<int64_t>());
  }
}

// spec-bench on the one loop: plain, fixed gammas and auto, each checked by
// the command to write plain's ids (it fails otherwise), one row each.
TEST(SpeculativeCli, SpecBenchPlainGammasAndAutoAgree) {
  for (const std::string drafter :
       {std::string("--lookup 3"),
        "--draft " + test::tiny_model("stories260K-f16.gguf").string()}) {
    SCOPED_TRACE(drafter);
    const test::CliResult r = test::run_cli(
        "spec-bench -m " + test::tiny_model("stories260K.gguf").string() +
        " -p \"Once upon a time\" -p \"Lily and Tom\" --plain -n 16 --reps 1 --gammas 1,3 -t 1 "
        "--no-agreement --json " +
        drafter);
    ASSERT_EQ(r.status, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["schema"], "barata.spec_bench/1");
    ASSERT_EQ(j["rows"].size(), 4u) << "plain, gamma 1, gamma 3, auto";
  }
}

TEST(SpeculativeCli, MismatchedDraftIsOneErrorLine) {
  const test::CliResult r = test::run_cli(
      "run -m " + test::tiny_model("stories260K.gguf").string() + " -p hi -n 4 --temp 0 --draft " +
      test::tiny_model("aidreams260K.gguf").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vocabulary"), std::string::npos) << r.err;
  const test::CliResult both =
      test::run_cli("run -m " + test::tiny_model("stories260K.gguf").string() +
                    " -p hi -n 4 --lookup 2 --draft-self q8_0");
  EXPECT_NE(both.status, 0);
}

}  // namespace
}  // namespace barata
