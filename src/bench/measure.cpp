// Timed measurements on a live Engine: prefill, decode against a filled
// cache, the batch sweep, and the roofline (streaming bandwidth against the
// bytes a decode step reads).
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "barata/bench.h"
#include "barata/sampler.h"
#include "timing.h"

namespace barata::bench {
namespace {

std::vector<int32_t> synthetic_tokens(int64_t first, int64_t n, int64_t n_vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = synthetic_token(first + i, n_vocab);
  return t;
}

// Grows `seq` (which holds `have` tokens or more) to exactly n tokens.
void fill_to(Engine& e, int seq, int64_t n, float* logits) {
  // Sliding-window layers may have released what going back needs: refill.
  if (!e.blocks().can_truncate(seq, n)) e.truncate(seq, 0);
  const int64_t have = e.length(seq);
  if (have > n) e.truncate(seq, n);
  if (have >= n) return;
  const auto toks = synthetic_tokens(have, n - have, e.model().config().n_vocab);
  e.prefill(seq, toks, logits);
}

// Repetitions of s.decode_steps one-token steps on `seq`, each starting from
// a cache of exactly n_cached tokens; samples are ms per step.
std::vector<double> time_decode(Engine& e, int seq, int64_t n_cached, const Settings& s,
                                const Hooks& h, const std::string& what, float* logits) {
  const int64_t V = e.model().config().n_vocab;
  auto samples = repeat(s, h, what, [&](int) {
    fill_to(e, seq, n_cached, logits);
    const int seqs[1] = {seq};
    const auto t0 = Clock::now();
    for (int64_t k = 0; k < s.decode_steps; ++k) {
      const int32_t tok[1] = {synthetic_token(n_cached + k, V)};
      e.decode(seqs, tok, logits);
    }
    return ms_since(t0) / static_cast<double>(s.decode_steps);
  });
  fill_to(e, seq, n_cached, logits);
  return samples;
}

// K/V bytes read by the timed decode steps, per step: step k attends over
// n_cached + k + 1 positions (of a windowed layer: at most its window).
int64_t kv_bytes_per_step(const Engine& e, int64_t n_cached, int64_t steps) {
  const ModelConfig& c = e.model().config();
  int64_t layer_positions = 0;
  for (int64_t k = 0; k < steps; ++k) layer_positions += c.attended_positions(n_cached + k);
  // Per layer and position: K and V in the cache's types.
  return layer_positions * e.kv_layout().pair_bytes() / steps;
}

}  // namespace

std::vector<PrefillRow> run_prefill(Engine& e, const Settings& s, const Hooks& h) {
  const int64_t V = e.model().config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(V)), scratch(logits.size());
  std::vector<PrefillRow> rows;
  const int seq = e.new_sequence();
  for (int64_t P : s.prefill_tokens) {
    const auto toks = synthetic_tokens(0, P, V);
    std::vector<double> sample_ms;
    auto ms = repeat(s, h, fmt::format("prefill P={}", P), [&](int rep) {
      e.truncate(seq, 0);
      const auto t0 = Clock::now();
      e.prefill(seq, toks, logits.data());
      const double prefill_ms = ms_since(t0);
      scratch = logits;  // the sampler may edit its logits
      Sampler sampler{SamplerOptions{}};
      const auto t1 = Clock::now();
      volatile int32_t id = sampler.sample(scratch);
      (void)id;
      if (rep >= 0) sample_ms.push_back(ms_since(t1));
      return prefill_ms;
    });
    if (ms.empty()) break;
    PrefillRow r;
    r.n_tokens = P;
    r.ms = summarize(ms);
    r.ms_per_token = derive(ms, [P](double x) { return x / static_cast<double>(P); });
    r.tokens_per_s = derive(ms, [P](double x) { return static_cast<double>(P) * 1e3 / x; });
    std::vector<double> ttft(ms.size());
    for (size_t i = 0; i < ms.size(); ++i) ttft[i] = ms[i] + sample_ms[i];
    r.ttft_ms = summarize(ttft);
    rows.push_back(r);
  }
  e.free_sequence(seq);
  return rows;
}

std::vector<DecodeRow> run_decode(Engine& e, const Settings& s, const Hooks& h) {
  std::vector<float> logits(static_cast<size_t>(e.model().config().n_vocab));
  std::vector<int64_t> cs = s.cache_tokens;
  std::sort(cs.begin(), cs.end());  // each cache grows from the previous one
  std::vector<DecodeRow> rows;
  const int seq = e.new_sequence();
  for (int64_t C : cs) {
    if (h.stopped()) break;
    h.progress(fmt::format("decode C={} filling the cache", C));
    fill_to(e, seq, C, logits.data());
    auto ms = time_decode(e, seq, C, s, h, fmt::format("decode C={}", C), logits.data());
    if (ms.empty()) break;
    DecodeRow r;
    r.n_cached = C;
    r.bytes_per_step = e.model().weight_bytes() + kv_bytes_per_step(e, C, s.decode_steps);
    r.ms_per_step = summarize(ms);
    r.tokens_per_s = derive(ms, [](double x) { return 1e3 / x; });
    const double bytes = static_cast<double>(r.bytes_per_step);
    r.gb_per_s = derive(ms, [bytes](double x) { return bytes / (x * 1e6); });
    rows.push_back(r);
  }
  e.free_sequence(seq);
  return rows;
}

std::vector<BatchRow> run_batch(Engine& e, const Settings& s, const Hooks& h) {
  const int64_t V = e.model().config().n_vocab;
  const int64_t n = s.batch_cached;
  const int64_t max_b = *std::max_element(s.batch_sizes.begin(), s.batch_sizes.end());
  std::vector<float> logits(static_cast<size_t>(V * max_b));
  std::vector<int> seqs;
  std::vector<BatchRow> rows;
  // Independent sequences, each with its own cache of n tokens (different
  // tokens, so no two share a block).
  for (int64_t i = 0; i < max_b && !h.stopped(); ++i) {
    h.progress(fmt::format("batch: filling cache {}/{}", i + 1, max_b));
    seqs.push_back(e.new_sequence());
    e.prefill(seqs.back(), synthetic_tokens(i * n, n, V), logits.data());
  }
  for (int64_t B : s.batch_sizes) {
    if (static_cast<int64_t>(seqs.size()) < max_b) break;  // interrupted while filling
    const std::span<const int> batch(seqs.data(), static_cast<size_t>(B));
    const auto toks = synthetic_tokens(n * max_b, B, V);
    auto ms = repeat(s, h, fmt::format("batch B={}", B), [&](int) {
      for (int q : batch) fill_to(e, q, n, logits.data());
      const auto t0 = Clock::now();
      e.decode(batch, toks, logits.data());
      return ms_since(t0);
    });
    if (ms.empty()) break;
    BatchRow r;
    r.batch = B;
    r.n_cached = n;
    r.step_ms = summarize(ms);
    r.tokens_per_s = derive(ms, [B](double x) { return static_cast<double>(B) * 1e3 / x; });
    rows.push_back(r);
  }
  for (int q : seqs) e.free_sequence(q);
  return rows;
}

RooflineResult run_roofline(Engine& e, const Settings& s, const Hooks& h) {
  RooflineResult r;
  if (h.stopped()) return r;
  // Bandwidth: a streaming read over a buffer far larger than any cache, in
  // the backend's memory (all threads of the CPU pool; the GPU's HBM).
  const int64_t n = std::max<int64_t>(s.bandwidth_bytes / 8, 1 << 16);
  r.buffer_bytes = n * 8;
  h.progress(fmt::format("roofline: touching {} MiB", r.buffer_bytes >> 20));
  std::vector<double> gb_samples;
  {
    auto probe = e.backend().bandwidth_probe(r.buffer_bytes);
    gb_samples =
        repeat(s, h, "roofline: streaming read", [&](int) { return probe->run_gb_per_s(); });
  }
  if (gb_samples.empty()) return r;
  r.bandwidth_gb_per_s = summarize(gb_samples);

  // Decode at the smallest cache length, where the weights dominate.
  std::vector<float> logits(static_cast<size_t>(e.model().config().n_vocab));
  r.n_cached = *std::min_element(s.cache_tokens.begin(), s.cache_tokens.end());
  r.weight_bytes = e.model().weight_bytes();
  r.kv_bytes = kv_bytes_per_step(e, r.n_cached, s.decode_steps);
  const int seq = e.new_sequence();
  h.progress("roofline: filling the cache");
  fill_to(e, seq, r.n_cached, logits.data());
  auto ms = time_decode(e, seq, r.n_cached, s, h, fmt::format("roofline: decode C={}", r.n_cached),
                        logits.data());
  e.free_sequence(seq);
  if (ms.empty()) return r;
  r.ran = true;
  r.decode_ms_per_step = summarize(ms);
  r.weight_gb_per_s = static_cast<double>(r.weight_bytes) / (r.decode_ms_per_step.median * 1e6);
  r.fraction = r.weight_gb_per_s / r.bandwidth_gb_per_s.median;
  r.bound_tokens_per_s = r.bandwidth_gb_per_s.median * 1e9 / static_cast<double>(r.weight_bytes);
  return r;
}

}  // namespace barata::bench
