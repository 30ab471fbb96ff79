// Turning logits into the next token: greedy, or temperature sampling after
// repetition penalty, top-k, top-p and min-p (llama.cpp's order and meaning:
// penalties -> top-k -> top-p -> min-p -> temperature -> draw).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace barata {

struct SamplerOptions {
  float temperature = 0.8f;     // <= 0: greedy (argmax)
  int top_k = 40;               // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off; > 1 discourages repeats
  int repeat_last_n = 64;       // window of the penalties
  // OpenAI's: each token in the window loses presence_penalty once and
  // frequency_penalty per occurrence from its logit (0: off).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0xba7a7a;
};

// What a temperature draw chooses from, after top-k, top-p, min-p and the
// temperature (no penalty; temperature <= 0 is read as 1): ids, most likely
// first, their unnormalized weights and the weights' sum. Sampler::sample
// draws from exactly this; speculative decoding compares two of them.
struct SamplingCandidates {
  std::vector<int32_t> ids;
  std::vector<double> w;
  double total = 0.0;
  std::vector<std::pair<float, int32_t>> scratch;  // (logit, id)
  std::vector<float> p;                            // probabilities at temperature 1
};
void sampling_candidates(const SamplerOptions& opts, std::span<const float> logits,
                         SamplingCandidates& out);

class Sampler {
 public:
  explicit Sampler(SamplerOptions opts);

  // Chooses the next token; logits may be modified (penalties applied).
  int32_t sample(std::span<float> logits);
  // Tells the sampler a token was emitted (or was part of the prompt), for
  // the repetition penalty.
  void accept(int32_t token);

  const SamplerOptions& options() const { return opts_; }

 private:
  SamplerOptions opts_;
  std::mt19937_64 rng_;
  // The penalty's window, a ring: the last repeat_last_n accepted tokens
  // end at recent_head_ (oldest first from there once full).
  std::vector<int32_t> recent_;
  size_t recent_head_ = 0;
  // Per vocabulary id, the penalty call that last changed its logit (so
  // that a token repeated in the window is penalized once).
  std::vector<uint32_t> penalized_at_;
  std::vector<uint32_t> counts_;  // occurrences in the window (zeroed after each use)
  uint32_t penalty_calls_ = 0;
  SamplingCandidates cand_;
};

// The K most likely tokens under softmax(logits / temperature), most likely
// first, with their probabilities (the "soft labels" of distillation).
std::vector<std::pair<int32_t, float>> top_probs(std::span<const float> logits, float temperature,
                                                 int k);
int32_t argmax(std::span<const float> logits);

}  // namespace barata
