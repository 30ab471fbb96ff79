// Greedy generation on the committed tiny models (tests/data/models) against
// llama.cpp b4748's outputs in tests/data/reference (tests/data/README.md says
// how they were made and how close is close).
#include <algorithm>
#include <cmath>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/engine.h"
#include "test_util.h"

namespace barata {
namespace {

using nlohmann::json;

int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

std::vector<json> read_jsonl(const std::filesystem::path& p) {
  std::vector<json> out;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// Runs greedy decoding with or without the cache; returns the ids and logits.
std::vector<int32_t> greedy(Engine& e, const std::vector<int32_t>& prompt, int n, bool use_cache,
                            std::vector<std::vector<float>>* all_logits) {
  const int64_t V = e.model().config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> seq = prompt, out;
  int s = e.new_sequence();
  e.prefill(s, prompt, logits.data());
  for (int i = 0; i < n; ++i) {
    if (all_logits) all_logits->push_back(logits);
    const int32_t next = argmax(logits.data(), V);
    out.push_back(next);
    seq.push_back(next);
    if (i + 1 == n) break;
    if (use_cache) {
      const int ss[1] = {s};
      const int32_t tt[1] = {next};
      e.decode(ss, tt, logits.data());
    } else {
      e.truncate(s, 0);
      e.prefill(s, seq, logits.data());
    }
  }
  e.free_sequence(s);
  return out;
}

class EngineReference : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineReference, GreedyIdsAndTopLogitsMatchLlamaCpp) {
  const auto ref = test::data_dir() / "reference" / ("public_" + GetParam() + ".jsonl");
  const auto model_path = test::tiny_model(GetParam() + ".gguf");
  ASSERT_TRUE(std::filesystem::exists(ref)) << ref;  // committed: no skip
  ASSERT_TRUE(std::filesystem::exists(model_path)) << model_path;
  const Model model = Model::load(model_path);
  Engine engine(model, {.n_threads = 2, .n_ctx = 128});
  for (const json& r : read_jsonl(ref)) {
    SCOPED_TRACE(r["prompt"].get<std::string>());
    const auto prompt = r["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = r["generated_ids"].get<std::vector<int32_t>>();
    const auto& top5 = r["top5_logits_per_step"];
    std::vector<std::vector<float>> logits;
    const auto got = greedy(engine, prompt, static_cast<int>(want.size()), true, &logits);
    int compared = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const auto& step = top5[i];
      const float l0 = step[0][1].get<float>(), l1 = step[1][1].get<float>();
      float scale = 0.0f;
      for (const auto& p : step) scale = std::max(scale, std::fabs(p[1].get<float>()));
      // Top logits of the reference, in our logits, within 1e-2 of the step's largest |logit|.
      for (const auto& p : step) {
        const int id = p[0].get<int>();
        EXPECT_NEAR(logits[i][static_cast<size_t>(id)], p[1].get<float>(), 1e-2f * scale)
            << "step " << i << " id " << id;
      }
      ++compared;
      if (l0 - l1 < 0.01f * std::fabs(l0)) break;  // a near-tie: order may flip from here on
      ASSERT_EQ(got[i], want[i]) << "step " << i;
    }
    EXPECT_GT(compared, 0);
  }
}

TEST_P(EngineReference, NoCacheModeGivesIdenticalIds) {
  const auto ref = test::data_dir() / "reference" / ("public_" + GetParam() + ".jsonl");
  const auto model_path = test::tiny_model(GetParam() + ".gguf");
  ASSERT_TRUE(std::filesystem::exists(ref)) << ref;  // committed: no skip
  ASSERT_TRUE(std::filesystem::exists(model_path)) << model_path;
  const Model model = Model::load(model_path);
  Engine engine(model, {.n_threads = 2, .n_ctx = 128});
  for (const json& r : read_jsonl(ref)) {
    const auto prompt = r["prompt_ids"].get<std::vector<int32_t>>();
    std::vector<std::vector<float>> a, b;
    const auto with = greedy(engine, prompt, 48, true, &a);
    const auto without = greedy(engine, prompt, 48, false, &b);
    EXPECT_EQ(with, without);
    // The same per-row kernels run either way: the logits agree bit for bit.
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shared, EngineReference,
                         ::testing::Values("stories260K", "stories260K-f16", "aidreams260K"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace barata
