// Sampler semantics (llama.cpp's meaning of each knob) and reproducibility.
#include <map>

#include <gtest/gtest.h>

#include "barata/chat_template.h"
#include "barata/error.h"
#include "barata/sampler.h"

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
