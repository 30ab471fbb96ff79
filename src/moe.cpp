#include "barata/moe.h"

#include <algorithm>
#include <cmath>

namespace barata {

void route_token(const ModelConfig& c, const float* logits, float* probs, int32_t* ids,
                 float* weights) {
  const int64_t n = c.n_expert, k = c.n_expert_used;
  // ggml_soft_max: the max subtracted, exp in fp32, the sum in double, times 1 / sum.
  float mx = -INFINITY;
  for (int64_t e = 0; e < n; ++e) mx = std::max(mx, logits[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < n; ++e) {
    probs[e] = std::exp(logits[e] - mx);
    sum += probs[e];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t e = 0; e < n; ++e) probs[e] *= inv;
  // ggml's argsort (descending), its first k positions: position j takes
  // every later index whose value is strictly greater, by swapping.
  thread_local std::vector<int32_t> order;
  order.resize(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t i = j + 1; i < n; ++i)
      if (probs[order[static_cast<size_t>(j)]] < probs[order[static_cast<size_t>(i)]])
        std::swap(order[static_cast<size_t>(j)], order[static_cast<size_t>(i)]);
  double wsum = 0.0;
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = order[static_cast<size_t>(j)];
    weights[j] = probs[ids[j]];
    wsum += weights[j];  // ggml_sum_rows: a double accumulator
  }
  if (c.expert_weights_norm) {
    const float s = static_cast<float>(wsum);
    for (int64_t j = 0; j < k; ++j) weights[j] /= s;  // ggml_div
  }
}

void ExpertGroups::route(const ModelConfig& c, const float* logits, int64_t T) {
  const int64_t n = c.n_expert, k = c.n_expert_used;
  n_tokens = T;
  n_used = k;
  const auto pairs = static_cast<size_t>(T * k);
  ids.resize(pairs);
  weights.resize(pairs);
  token.resize(pairs);
  slot_at.resize(pairs);
  probs.resize(static_cast<size_t>(n));
  start.assign(static_cast<size_t>(n + 1), 0);
  for (int64_t t = 0; t < T; ++t) {
    route_token(c, logits + t * n, probs.data(), ids.data() + t * k, weights.data() + t * k);
    for (int64_t j = 0; j < k; ++j) ++start[static_cast<size_t>(ids[t * k + j]) + 1];
  }
  active.clear();
  for (int64_t e = 0; e < n; ++e) {
    if (start[static_cast<size_t>(e) + 1] > 0) active.push_back(static_cast<int32_t>(e));
    start[static_cast<size_t>(e) + 1] += start[static_cast<size_t>(e)];
  }
  // Counting sort, tokens ascending within an expert (an expert appears at
  // most once per token).
  thread_local std::vector<int32_t> fill;
  fill.assign(start.begin(), start.end() - 1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t g = fill[static_cast<size_t>(ids[t * k + j])]++;
      token[static_cast<size_t>(g)] = static_cast<int32_t>(t);
      slot_at[static_cast<size_t>(t * k + j)] = g;
    }
}

}  // namespace barata
