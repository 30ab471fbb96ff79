#include "barata/sampler.h"

#include <algorithm>
#include <cmath>

namespace barata {

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(SamplerOptions opts) : opts_(opts), rng_(opts.seed) {
  if (opts_.repeat_last_n > 0) recent_.reserve(static_cast<size_t>(opts_.repeat_last_n));
}

void Sampler::accept(int32_t token) {
  if (opts_.repeat_last_n <= 0) return;
  if (recent_.size() < static_cast<size_t>(opts_.repeat_last_n)) {
    recent_.push_back(token);
    return;
  }
  recent_[recent_head_] = token;  // full: the oldest makes room
  recent_head_ = (recent_head_ + 1) % recent_.size();
}

int32_t Sampler::sample(std::span<float> logits) {
  // Repetition penalty (CTRL paper form, as llama.cpp applies it): each token
  // seen in the window once, positive logits divided, negative multiplied.
  const bool counted = opts_.presence_penalty != 0.0f || opts_.frequency_penalty != 0.0f;
  if ((opts_.repeat_penalty != 1.0f || counted) && !recent_.empty()) {
    if (penalized_at_.size() < logits.size()) penalized_at_.resize(logits.size(), 0);
    if (counted && counts_.size() < logits.size()) counts_.resize(logits.size(), 0);
    if (++penalty_calls_ == 0) {  // wrapped: no stale mark may equal a new one
      std::fill(penalized_at_.begin(), penalized_at_.end(), 0);
      penalty_calls_ = 1;
    }
    if (counted)
      for (int32_t t : recent_)
        if (t >= 0 && static_cast<size_t>(t) < logits.size()) ++counts_[static_cast<size_t>(t)];
    for (int32_t t : recent_) {
      if (t < 0 || static_cast<size_t>(t) >= logits.size()) continue;
      if (penalized_at_[static_cast<size_t>(t)] == penalty_calls_) continue;
      penalized_at_[static_cast<size_t>(t)] = penalty_calls_;
      float& l = logits[static_cast<size_t>(t)];
      if (opts_.repeat_penalty != 1.0f)
        l = l > 0.0f ? l / opts_.repeat_penalty : l * opts_.repeat_penalty;
      if (counted) {
        uint32_t& c = counts_[static_cast<size_t>(t)];
        l -= opts_.presence_penalty + opts_.frequency_penalty * static_cast<float>(c);
        c = 0;
      }
    }
  }
  if (opts_.temperature <= 0.0f) return argmax(logits);
  sampling_candidates(opts_, logits, cand_);
  std::uniform_real_distribution<double> u(0.0, cand_.total);
  double r = u(rng_);
  const size_t keep = cand_.ids.size();
  for (size_t i = 0; i < keep; ++i) {
    if (r < cand_.w[i]) return cand_.ids[i];
    r -= cand_.w[i];
  }
  return cand_.ids[keep - 1];
}

void sampling_candidates(const SamplerOptions& opts, std::span<const float> logits,
                         SamplingCandidates& out) {
  // Candidates sorted by logit, most likely first; top-k cuts the sort short.
  const size_t n = logits.size();
  size_t keep = opts.top_k > 0 ? std::min(n, static_cast<size_t>(opts.top_k)) : n;
  auto& cand = out.scratch;
  cand.resize(n);
  for (size_t i = 0; i < n; ++i) cand[i] = {logits[i], static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(cand.begin(), cand.begin() + static_cast<long>(keep), cand.end(), by_logit);
  cand.resize(keep);
  // Room for the most any cut below keeps, so that later calls allocate nothing.
  out.ids.reserve(keep);
  out.w.reserve(keep);
  out.p.reserve(keep);

  // Probabilities at temperature 1 for top-p and min-p.
  std::vector<float>& p = out.p;
  p.resize(keep);
  const float mx = cand[0].first;
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(cand[i].first - mx);
  for (auto& x : p) x = static_cast<float>(x / sum);
  if (opts.top_p < 1.0f) {
    double cum = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i];
      if (cum >= opts.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
  }
  if (opts.min_p > 0.0f) {
    const float floor = opts.min_p * p[0];
    size_t cut = 1;
    while (cut < keep && p[cut] >= floor) ++cut;
    keep = cut;
  }

  // Temperature: the weights of what is left.
  const float t = opts.temperature > 0.0f ? opts.temperature : 1.0f;
  out.ids.resize(keep);
  out.w.resize(keep);
  out.total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    out.ids[i] = cand[i].second;
    out.total += out.w[i] = std::exp(static_cast<double>(cand[i].first - mx) / t);
  }
}

std::vector<std::pair<int32_t, float>> top_probs(std::span<const float> logits, float temperature,
                                                 int k) {
  const float t = temperature > 0.0f ? temperature : 1.0f;
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - mx) / t);
  std::vector<std::pair<float, int32_t>> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c[i] = {logits[i], static_cast<int32_t>(i)};
  const size_t kk = std::min(logits.size(), static_cast<size_t>(std::max(k, 0)));
  std::partial_sort(c.begin(), c.begin() + static_cast<long>(kk), c.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::pair<int32_t, float>> out;
  for (size_t i = 0; i < kk; ++i)
    out.emplace_back(c[i].second,
                     static_cast<float>(std::exp(static_cast<double>(c[i].first - mx) / t) / sum));
  return out;
}

}  // namespace barata
