// A mixture of experts' routing: which experts each token's FFN runs and how
// their outputs are weighed, as llama.cpp's build_moe_ffn (src/llama-graph.cpp,
// build of 2025-08) does it for the architectures barata runs (softmax
// gating, no selection bias, no scale):
//   probs = softmax(router logits)            over all n_expert
//   chosen = the first n_used of ggml_argsort(probs, descending)
//   w_j = probs[chosen_j], divided by sum_j w_j when expert_weights_norm
//   out = sum_j w_j * expert_{chosen_j}(x), summed in the order j
// ggml's CPU argsort is an exchange sort (for each position in turn, swap in
// any later element strictly greater): ties keep the lower index first, and
// route_token runs the same exchanges for the first n_used positions, so
// its choice among equal probabilities is the reference's.
//
// ExpertGroups groups a batch's (token, choice) pairs by expert, so each
// expert's weights are read once per step for every row that chose it.
#pragma once

#include <cstdint>
#include <vector>

#include "barata/model_config.h"

namespace barata {

// One token: logits (n_expert) to ids and weights (n_used each); probs is
// scratch of n_expert floats (left holding the softmax).
void route_token(const ModelConfig& c, const float* logits, float* probs, int32_t* ids,
                 float* weights);

struct ExpertGroups {
  int64_t n_tokens = 0, n_used = 0;
  std::vector<int32_t> ids;      // (n_tokens x n_used) the chosen experts, in the order chosen
  std::vector<float> weights;    // (n_tokens x n_used) their weights
  std::vector<int32_t> start;    // (n_expert + 1) expert e's pairs are [start[e], start[e + 1])
  std::vector<int32_t> token;    // (n_tokens x n_used) the token of each grouped pair
  std::vector<int32_t> slot_at;  // (n_tokens x n_used) pair t * n_used + j -> its grouped index
  std::vector<int32_t> active;   // the experts at least one token chose, ascending
  std::vector<float> probs;      // scratch

  // Routes n_tokens rows of router logits (n_expert each) and groups them:
  // by expert, and within an expert by token (ascending). Reuses its
  // vectors: no allocation once they have grown.
  void route(const ModelConfig& c, const float* logits, int64_t n_tokens);
};

}  // namespace barata
