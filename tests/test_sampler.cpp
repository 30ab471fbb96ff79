// Sampler semantics (llama.cpp's meaning of each knob) and reproducibility.
#include <cmath>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "barata/chat_template.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/model.h"
#include "barata/sampler.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

std::map<int32_t, int> histogram(SamplerOptions o, std::vector<float> logits, int n) {
  Sampler s(o);
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    ++h[s.sample(l)];
  }
  return h;
}

TEST(Sampler, GreedyIsArgmax) {
  Sampler s({.temperature = 0.0f});
  std::vector<float> l = {0.1f, 3.0f, 2.9f, -1.0f};
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, TopKKeepsOnlyTheKLargest) {
  const auto h = histogram({.temperature = 5.0f, .top_k = 2, .top_p = 1.0f, .min_p = 0.0f},
                           {1.0f, 0.9f, 0.8f, 0.7f, 0.6f}, 2000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.count(0) && h.count(1));
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // probabilities at T=1: ~0.64, 0.24, 0.09, 0.03 -> top-p 0.8 keeps the first two
  const auto h = histogram({.temperature = 1.0f, .top_k = 0, .top_p = 0.8f, .min_p = 0.0f},
                           {3.0f, 2.0f, 1.0f, 0.0f}, 3000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_GT(h.at(0), h.at(1));
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  // p ~ 0.66, 0.24, 0.09: min-p 0.2 keeps p >= 0.13
  const auto h = histogram({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.2f},
                           {3.0f, 2.0f, 1.0f}, 3000);
  EXPECT_EQ(h.size(), 2u);
}

TEST(Sampler, TemperatureSharpens) {
  const std::vector<float> l = {1.0f, 0.0f};
  const auto hot =
      histogram({.temperature = 2.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f}, l, 4000);
  const auto cold =
      histogram({.temperature = 0.25f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f}, l, 4000);
  EXPECT_GT(cold.at(0), hot.at(0));
  EXPECT_GT(hot.at(1), 800);  // p(1) = 1/(1+e^0.5) ~ 0.38 at T=2
}

TEST(Sampler, SameSeedSameTokens) {
  SamplerOptions o{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 99};
  Sampler a(o), b(o);
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(i % 7) * 0.3f;
  for (int i = 0; i < 100; ++i) {
    auto la = l, lb = l;
    EXPECT_EQ(a.sample(la), b.sample(lb));
  }
}

TEST(Sampler, RepetitionPenaltyFollowsLlamaCpp) {
  Sampler s({.temperature = 0.0f, .repeat_penalty = 2.0f, .repeat_last_n = 2});
  s.accept(0);
  s.accept(1);
  s.accept(2);  // window of 2: tokens 1 and 2 are penalised, 0 no longer
  std::vector<float> l = {1.0f, 4.0f, -1.0f, 1.5f};
  s.sample(l);
  EXPECT_FLOAT_EQ(l[0], 1.0f);
  EXPECT_FLOAT_EQ(l[1], 2.0f);   // positive: divided
  EXPECT_FLOAT_EQ(l[2], -2.0f);  // negative: multiplied
  EXPECT_FLOAT_EQ(l[3], 1.5f);
}

// OpenAI's presence and frequency penalties over the window: once per token
// present, and per occurrence; twice in a row, the same (counts are reset).
TEST(Sampler, PresenceAndFrequencyPenaltiesCountTheWindow) {
  Sampler s({.temperature = 0.0f,
             .repeat_last_n = 4,
             .presence_penalty = 0.5f,
             .frequency_penalty = 0.25f});
  for (int32_t t : {9, 1, 2, 1, 1}) s.accept(t);  // window: 1 2 1 1 (9 left it)
  for (int round = 0; round < 2; ++round) {
    std::vector<float> l = {0.0f, 3.0f, -1.0f, 1.0f, 0, 0, 0, 0, 0, 0.0f};
    s.sample(l);
    EXPECT_FLOAT_EQ(l[1], 3.0f - 0.5f - 3 * 0.25f) << round;
    EXPECT_FLOAT_EQ(l[2], -1.0f - 0.5f - 0.25f) << round;
    EXPECT_FLOAT_EQ(l[3], 1.0f) << round;
    EXPECT_FLOAT_EQ(l[9], 0.0f) << round;
  }
  // With the repetition penalty too: divided first, then subtracted.
  Sampler r(
      {.temperature = 0.0f, .repeat_penalty = 2.0f, .repeat_last_n = 4, .presence_penalty = 1.0f});
  r.accept(0);
  std::vector<float> l = {4.0f, 0.0f};
  r.sample(l);
  EXPECT_FLOAT_EQ(l[0], 1.0f);
}

TEST(Sampler, TopProbsIsASoftmaxAtTemperature) {
  const std::vector<float> l = {2.0f, 1.0f, 0.0f};
  const auto p = top_probs(l, 1.0f, 3);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].first, 0);
  EXPECT_NEAR(p[0].second + p[1].second + p[2].second, 1.0, 1e-6);
  EXPECT_NEAR(p[0].second / p[1].second, std::exp(1.0), 1e-4);
  const auto p2 = top_probs(l, 2.0f, 1);
  EXPECT_NEAR(p2[0].second, std::exp(1.0) / (std::exp(1.0) + std::exp(0.5) + 1.0), 1e-5);
}

// Soft labels at temperature T are softmax(logits / T), so
// p_i / p_j = exp((l_i - l_j) / T): at T = 2 every ratio is the square root
// of its value at T = 1. Checked on the most likely tokens (whose
// probabilities are far from float underflow) against every other of them.
// Returns the number of pairs checked whose ratio at T = 1 is at least 2 (the
// property is not trivially 1 == sqrt(1) there).
int check_sqrt_ratios(std::span<const float> logits, int k) {
  const auto p1 = top_probs(logits, 1.0f, static_cast<int>(logits.size()));
  const auto p2 = top_probs(logits, 2.0f, static_cast<int>(logits.size()));
  std::map<int32_t, float> at2(p2.begin(), p2.end());
  int strong = 0;
  for (int a = 0; a < k; ++a) {
    for (int b = a + 1; b < k; ++b) {
      const auto [i, pi] = p1[static_cast<size_t>(a)];
      const auto [j, pj] = p1[static_cast<size_t>(b)];
      const double r1 = static_cast<double>(pi) / pj;
      const double r2 = static_cast<double>(at2.at(i)) / at2.at(j);
      EXPECT_NEAR(r2, std::sqrt(r1), 1e-6 * std::sqrt(r1)) << "tokens " << i << " and " << j;
      strong += r1 >= 2.0 ? 1 : 0;
    }
  }
  return strong;
}

TEST(Sampler, TemperatureTwoTakesTheSquareRootOfProbabilityRatiosOnRandomLogits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<float> logits(2000);
    for (float& l : logits) l = nd(rng);
    EXPECT_GT(check_sqrt_ratios(logits, 40), 0);
  }
}

TEST(Sampler, TemperatureTwoTakesTheSquareRootOfProbabilityRatiosOnModelLogits) {
  const Model m = Model::load(test::tiny_model("aidreams260K.gguf"));
  const Tokenizer tok = Tokenizer::from_gguf(m.file());
  Engine e(m, {.n_threads = 1, .n_ctx = 64});
  const std::vector<int32_t> ids = tok.encode("Once upon a time, there was a", true, false);
  std::vector<float> logits(ids.size() * static_cast<size_t>(m.config().n_vocab));
  e.prefill(e.new_sequence(), ids, logits.data(), true);
  for (size_t row = 0; row < ids.size(); ++row) {
    const std::span<const float> l(logits.data() + row * static_cast<size_t>(m.config().n_vocab),
                                   static_cast<size_t>(m.config().n_vocab));
    EXPECT_GT(check_sqrt_ratios(l, 20), 0) << "position " << row;
  }
}

TEST(ChatTemplate, FamiliesAndDetection) {
  const std::vector<ChatMessage> m = {{"system", "S"}, {"user", "U"}};
  EXPECT_EQ(
      apply_chat_template(ChatFamily::kChatML, m, true),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(ChatFamily::kLlama3, m, true),
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_"
            "header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(apply_chat_template(ChatFamily::kGemma, m, true),
            "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(apply_chat_template(ChatFamily::kLlama2, m, true),
            "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]");
  EXPECT_EQ(detect_chat_family("{{ '<|im_start|>' + role }}"), ChatFamily::kChatML);
  EXPECT_EQ(detect_chat_family("<|start_header_id|>"), ChatFamily::kLlama3);
  EXPECT_EQ(detect_chat_family("<start_of_turn>"), ChatFamily::kGemma);
  EXPECT_EQ(detect_chat_family("[INST]"), ChatFamily::kLlama2);
  EXPECT_EQ(detect_chat_family("{{ messages }}"), std::nullopt);
  EXPECT_THROW(chat_family_from_name("vicuna"), Error);
  EXPECT_EQ(default_system_prompt("{{ '<|im_start|>system\nBe kind<|im_end|>\n' }}"), "Be kind");
  EXPECT_EQ(default_system_prompt("{{'<|im_start|>' + message['role']}}"), "");
}

}  // namespace
}  // namespace barata
