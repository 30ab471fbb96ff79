// Teacher-forced top-1 agreement between a base model and a candidate (a
// quantized copy, a draft model for speculative decoding): the base writes N
// greedy tokens after each prompt, the candidate reads exactly those sequences
// and, at each of the N generated positions, its argmax is compared with the
// base's token. agreement = matches / observations, per prompt and overall;
// for a draft model it is the acceptance rate of greedy speculative decoding
// with one drafted token.
#pragma once

#include <cstdint>
#include <vector>

#include "barata/engine.h"

namespace barata {

// A prompt and what the base model generated greedily after it.
struct GreedyTrace {
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
  int64_t n_vocab = 0;  // the base model's vocabulary size
};

// For each prompt: prefill, then n_gen greedy tokens (argmax, no penalty).
// Generation does NOT stop at an end-of-generation token (the token is fed
// back and generation goes on), so every prompt gives n_gen observations; it
// stops early only at the end of the base's context (the trace is then
// shorter). Each sequence is freed before the next prompt. Throws
// barata::Error for n_gen < 1, an empty prompt, or a prompt longer than the
// context.
std::vector<GreedyTrace> greedy_traces(Engine& base,
                                       const std::vector<std::vector<int32_t>>& prompts, int n_gen);

struct PromptAgreement {
  int64_t matches = 0;
  int64_t n = 0;  // observations: the trace's generated tokens
  double rate() const {
    return n > 0 ? static_cast<double>(matches) / static_cast<double>(n) : 0.0;
  }
};

struct AgreementResult {
  std::vector<PromptAgreement> per_prompt;  // in the order of the traces
  int64_t matches = 0;                      // over all prompts
  int64_t n = 0;
  double rate() const {
    return n > 0 ? static_cast<double>(matches) / static_cast<double>(n) : 0.0;
  }
};

// One forward pass per trace over prompt + generated[0 .. N-2], logits only at
// the N positions that predict a generated token; generated[i] counts as a
// match when it is the candidate's argmax there (ties go to the lowest id).
// The sequence is freed afterwards. Throws barata::Error when the candidate's
// vocabulary size differs from the trace's base model, or when a trace does
// not fit the candidate's context.
AgreementResult teacher_forced_agreement(Engine& cand, const std::vector<GreedyTrace>& traces);

// Throws barata::Error when the two vocabularies differ in size.
void check_same_vocabulary(const Model& base, const Model& cand);

// Both steps; the vocabularies are compared before anything runs.
AgreementResult teacher_forced_agreement(Engine& base, Engine& cand,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         int n_gen);

}  // namespace barata
