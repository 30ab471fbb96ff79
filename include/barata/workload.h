// What `barata batch` runs and how it is judged: request sets (a JSONL file
// or the built-in reference workload), the shared system prefix, latency
// summaries, and a pure simulation of static against continuous batching
// from a measured cost per decode step.
//
// Nothing here runs a model: the CLI (tools/barata/batch.cpp) tokenizes the
// specs, submits them to a Scheduler (include/barata/scheduler.h) and feeds
// what it measures back into these functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "barata/sampler.h"
#include "barata/scheduler.h"

namespace barata {
class Tokenizer;
}

namespace barata::workload {

// ---- request specs ----------------------------------------------------------

// One request before tokenization: a JSONL line or a reference workload entry.
struct RequestSpec {
  std::string id;      // "id" (a string or an integer), else "" (the CLI names it by index)
  std::string prompt;  // "prompt", required
  int64_t max_tokens = 128;
  SamplerOptions sampling;  // greedy (temperature 0) unless the line says otherwise
  bool ignore_eos = false;
  std::vector<std::string> stop;
  std::string grammar;     // "grammar" (GBNF), or "json_schema" converted; "" = none
  double arrival_ms = -1;  // "arrival_ms"; < 0: not given (then --arrival-interval decides)
  int64_t line = 0;        // 1-based line of the file (0 for built-in workloads)
};

inline constexpr int64_t kDefaultMaxTokens = 128;

// Parses JSON Lines: one object per non-blank line with the keys
//   prompt (string, required), id (string or integer), max_tokens (integer
//   >= 1, default 128), temperature (>= 0, default 0: greedy), top_k (>= 0),
//   top_p ((0, 1]), min_p ([0, 1]), seed (unsigned 64-bit, default: the
//   line's 0-based index), ignore_eos (bool), stop (array of strings),
//   arrival_ms (>= 0).
// top_k/top_p/min_p default to SamplerOptions' and matter only with a
// temperature > 0. Any other key, a wrong type or an out-of-range value is an
// error "FILE: line N: ..." (barata::Error), as is a file without requests.
std::vector<RequestSpec> parse_jsonl(std::string_view text, const std::string& file_name);

// The workload names --workload accepts.
const std::vector<std::string>& workload_names();

// The reference text's workload (64 requests, median 18, max 231, total
// 1,874 output tokens): 64 distinct short English prompts (16 topics x 4
// framings), greedy, ignore_eos, max_tokens from reference64_lengths().
std::vector<RequestSpec> reference64();
// Output lengths of reference64(), in request order. Deterministic on every
// platform: 64 draws of a standard normal (splitmix64 + Box-Muller, seed
// kReference64Seed), mapped by the monotone transform
//   n = 18 * exp(c * (z - z_median)), c = ln(231 / 18) / (z_max - z_median)
// (a power transform of the lognormal exp(z)) so that the median is 18 and
// the maximum 231, rounded (at least 1), then moved by +/-1 on middle-ranked
// elements (never the two median elements nor the maximum, and never across
// the median) until the total is exactly 1,874.
std::vector<int64_t> reference64_lengths();
inline constexpr uint64_t kReference64Seed = 1156;
inline constexpr int64_t kReference64Median = 18, kReference64Max = 231, kReference64Total = 1874;

// The deterministic generator behind reference64_lengths().
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : s_(seed) {}
  uint64_t next();
  double uniform();  // in (0, 1): never 0 or 1
  // Box-Muller pairs; the second of each pair is kept for the next call.
  double normal();

 private:
  uint64_t s_;
  bool have_spare_ = false;
  double spare_ = 0;
};

// ---- prompts --------------------------------------------------------------

// Exactly n token ids of a fixed English paragraph, repeated as needed and
// tokenized without BOS (an error when the tokenizer cannot produce n ids).
std::vector<int32_t> shared_prefix_ids(const Tokenizer& tok, int64_t n);
// The prompt's ids: `text` tokenized with BOS when the vocabulary adds one
// (as `barata run` does), with `prefix` inserted right after the BOS (or at
// the start without one), so every request shares BOS + prefix exactly.
std::vector<int32_t> prompt_ids(const Tokenizer& tok, std::string_view text,
                                std::span<const int32_t> prefix);

// ---- summaries ------------------------------------------------------------

// The q-quantile (q in [0, 1]) by linear interpolation between order
// statistics (numpy's default); 0 for no samples.
double quantile(std::vector<double> v, double q);
struct LatencySummary {
  int64_t n = 0;
  double mean = 0, median = 0, p90 = 0, p99 = 0, max = 0;
};
LatencySummary summarize_latency(std::span<const double> v);

// ---- simulation -----------------------------------------------------------

// The two policies replayed over request lengths with a cost per step.
// Model: a request of length L occupies a slot for L steps: the step that
// admits it (its prompt counted as one row: prefill is approximated by one
// step's row, prompt lengths are ignored) gives its first token, each later
// step one more. A step with B rows (sequences holding a slot, padding
// included) costs cost_ms_per_B[B - 1] milliseconds. Requests are admitted in
// order, once arrived (arrivals_s empty: all at 0).
//  - continuous: at the start of every step, arrived waiting requests fill
//    free slots; a request leaves its slot as soon as it is done.
//  - static: when no batch runs, up to `slots` arrived requests form one; the
//    batch runs until its longest member is done, finished members staying as
//    padding rows (computed, as SchedulerOptions::compute_padding does).
// When nothing can run, time jumps to the next arrival.
struct SimResult {
  // Per request: when its result is delivered (its last token; static: the
  // end of its batch, as the scheduler counts it), and that minus its arrival.
  std::vector<double> finish_s;
  std::vector<double> latency_s;
  double total_s = 0;  // when the last request finished
  int64_t steps = 0;
  int64_t busy_slot_steps = 0;     // sum over steps of sequences still generating
  int64_t padding_slot_steps = 0;  // static: finished members kept in the batch
  int64_t tokens = 0;              // sum of the lengths
  double mean_latency_s() const;
  double tokens_per_s() const { return total_s > 0 ? static_cast<double>(tokens) / total_s : 0; }
};
// lengths >= 1 each; slots >= 1; cost_ms_per_B.size() >= slots; arrivals_s
// empty or one per request. Throws barata::Error otherwise.
SimResult simulate(BatchPolicy policy, std::span<const int64_t> lengths,
                   std::span<const double> arrivals_s, int slots,
                   std::span<const double> cost_ms_per_B);

}  // namespace barata::workload
