// The default model (SmolLM2-135M-Instruct, Q4_1) against llama.cpp b4748 on
// the same file (tests/data/reference). Both quantize activations to 8 bits
// for the quantized weights but round differently, so on this quantized model
// the checks are teacher-forced: feed the reference sequence, compare each
// step's top-1 and the reference's top-5 logits.
#include <algorithm>
#include <cmath>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/engine.h"
#include "barata/sampler.h"
#include "test_util.h"

namespace barata {
namespace {

using nlohmann::json;

TEST(EngineSmolLM2, TeacherForcedAgreementWithLlamaCpp) {
  const auto model_path = test::source_dir() / "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model_path))
    GTEST_SKIP() << "default model not fetched (scripts/fetch-model.sh)";
  const Model model = Model::load(model_path);
  Engine engine(model, {.n_threads = 2, .n_ctx = 256});
  const int64_t V = model.config().n_vocab;
  std::ifstream f(test::source_dir() / "tests/data/reference/smollm2_llamacpp_b4748.jsonl");
  int steps = 0, agree = 0, greedy_prefix_total = 0;
  std::vector<double>
      dev;  // per step: worst |ours - theirs| over the reference top-5 / max |logit|
  for (std::string line; std::getline(f, line);) {
    const json r = json::parse(line);
    const auto prompt = r["prompt_ids"].get<std::vector<int32_t>>();
    const auto gen = r["generated_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end() - 1);
    std::vector<float> logits(static_cast<size_t>(V) * all.size());
    const int s = engine.new_sequence();
    engine.prefill(s, all, logits.data(), /*all_logits=*/true);
    engine.free_sequence(s);
    bool prefix = true;
    for (size_t i = 0; i < gen.size(); ++i) {
      const float* lg = logits.data() + (prompt.size() - 1 + i) * static_cast<size_t>(V);
      const auto& top5 = r["top5_logits_per_step"][i];
      float scale = 0.0f;
      for (const auto& p : top5) scale = std::max(scale, std::fabs(p[1].get<float>()));
      double worst = 0.0;
      for (const auto& p : top5)
        worst = std::max(worst, std::fabs(lg[p[0].get<int>()] - p[1].get<double>()) / scale);
      dev.push_back(worst);
      const bool same = argmax({lg, static_cast<size_t>(V)}) == gen[i];
      agree += same;
      prefix = prefix && same;
      greedy_prefix_total += prefix;
      ++steps;
    }
  }
  ASSERT_GT(steps, 100);
  std::sort(dev.begin(), dev.end());
  const double median = dev[dev.size() / 2], p95 = dev[dev.size() * 95 / 100];
  std::printf(
      "[ info ] teacher-forced top-1 agreement %d/%d, greedy prefix %d; logit deviation "
      "(of the step's max |logit|): median %.4f, 95th percentile %.4f, worst %.4f\n",
      agree, steps, greedy_prefix_total, median, p95, dev.back());
  // Measured (2026-12-04, the tiled attention with its vector exp): 181/192
  // on the avx512 and scalar kernels, 185/192 on avx2; median 0.011-0.012,
  // p95 0.036-0.038. With the libm exp in the avx512 copy instead: 185/192,
  // p95 0.031. The synthetic-model test shows the engine exact against
  // float64; what is left here is the two engines' rounding (fp16 activation
  // scales and attention in llama.cpp), which this 30-layer 4-bit model
  // amplifies at a few near-tied steps: a 1-ulp change in exp moves the count
  // by 4, so the count's bound leaves that much room and the deviation's
  // bounds carry the check.
  EXPECT_GE(agree, steps * 93 / 100);
  EXPECT_LT(median, 0.02);
  EXPECT_LT(p95, 0.06);
}

// Free-running greedy generation: the ids equal llama.cpp's until the first
// step where the two differ, and that step is a near-tie in the reference
// (top-2 gap under 3 % of the top logit), where either engine's rounding may
// pick either token. Measured: divergences at steps 15, 17, 20, 17, 13 with
// gaps 2.4 %, 0.55 %, 0.38 %, 0.32 %, 0.51 %; one prompt equal for all 32.
TEST(EngineSmolLM2, GreedyRunsDivergeOnlyAtNearTies) {
  const auto model_path = test::source_dir() / "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model_path))
    GTEST_SKIP() << "default model not fetched (scripts/fetch-model.sh)";
  const Model model = Model::load(model_path);
  Engine engine(model, {.n_threads = 2, .n_ctx = 256});
  const int64_t V = model.config().n_vocab;
  std::ifstream f(test::source_dir() / "tests/data/reference/smollm2_llamacpp_b4748.jsonl");
  int full_matches = 0, prompts = 0, equal_steps = 0;
  for (std::string line; std::getline(f, line); ++prompts) {
    const json r = json::parse(line);
    const auto prompt = r["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = r["generated_ids"].get<std::vector<int32_t>>();
    std::vector<float> logits(static_cast<size_t>(V));
    const int s = engine.new_sequence();
    engine.prefill(s, prompt, logits.data());
    size_t i = 0;
    for (; i < want.size(); ++i) {
      const int32_t next = argmax(logits);
      if (next != want[i]) break;
      const int seqs[1] = {s};
      const int32_t toks[1] = {next};
      if (i + 1 < want.size()) engine.decode(seqs, toks, logits.data());
    }
    engine.free_sequence(s);
    equal_steps += static_cast<int>(i);
    if (i == want.size()) {
      ++full_matches;
      continue;
    }
    const auto& step = r["top5_logits_per_step"][i];
    const double gap = step[0][1].get<double>() - step[1][1].get<double>();
    EXPECT_LT(gap, 0.03 * std::fabs(step[0][1].get<double>()))
        << r["prompt"] << ": diverged at step " << i << " where llama.cpp's choice was clear";
  }
  std::printf(
      "[ info ] greedy: %d of %d prompts equal for all steps, %d equal steps before the "
      "first divergence\n",
      full_matches, prompts, equal_steps);
  EXPECT_GE(full_matches, 1);
  EXPECT_GE(equal_steps, 80);
}

}  // namespace
}  // namespace barata
