// Speculative decoding: a cheap drafter proposes gamma tokens, the target
// verifies them in one forward pass over gamma + 1 positions of its sequence
// and keeps the longest prefix it agrees with, plus one token of its own.
//
// - Greedy (temperature <= 0): a drafted token is kept only when it is the
//   target's argmax there, so the output ids are the target's own.
// - Sampling: the rule of Leviathan et al. (2023), "Fast Inference from
//   Transformers via Speculative Decoding", keeps the output distribution the
//   target's: draft token x is kept with probability min(1, p(x) / q(x)); on
//   a rejection the token is drawn from norm(max(0, p - q)); when all gamma
//   are kept a bonus token is drawn from the target's next distribution. p
//   and q are the distributions the sampler would draw from (top-k, top-p,
//   min-p and temperature applied to each). A deterministic drafter (lookup)
//   has q = a point mass on its token.
//
// Drafters: another model with its own KV cache (the same vocabulary), the
// target itself quantized in memory, and n-gram lookup in the context.
//
// With acceptance rate alpha, gamma drafted tokens give (1 - alpha^(gamma+1))
// / (1 - alpha) tokens per verify pass; its cost is gamma * c (the draft's
// cost per token against one target decode step) plus v(gamma + 1) (a
// (gamma + 1)-position target pass against a one-position pass; on a CPU it
// is not 1). --draft-auto measures alpha, c and v as it goes and picks the
// gamma, zero (plain decoding) included, that maximizes the ratio.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "barata/engine.h"
#include "barata/sampler.h"
#include "barata/sequence.h"
#include "barata/tokenizer.h"

namespace barata {

// The tokens a drafter proposes and, for a model drafter when sampling, the
// distribution each was drawn from (q; ids and probabilities summing to 1).
struct Draft {
  std::vector<int32_t> tokens;
  struct Dist {
    std::vector<int32_t> ids;
    std::vector<double> p;
  };
  std::vector<Dist> q;  // empty: each token has q = 1 (a point mass)
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to n tokens continuing ctx (the whole sequence so far). May propose
  // fewer (none at all: nothing to offer).
  virtual void propose(std::span<const int32_t> ctx, int n, Draft& out) = 0;
  virtual std::string describe() const = 0;
  // Whether proposing costs model forward passes (then c is measured).
  virtual bool uses_model() const = 0;
  // Tokens of ctx it must read before it can draft (its cache's lag).
  virtual int64_t pending(std::span<const int32_t> ctx) const { return 0; }
};

struct ModelDrafterOptions {
  SamplerOptions sampling;  // the target's settings: greedy draws argmax
  float p_min = 0.0f;       // stop drafting when the draft's own p of its token < p_min
};

// A draft model with its own engine and one sequence; its cache follows the
// contexts it is given (the common prefix is kept, the rest truncated).
class ModelDrafter : public Drafter {
 public:
  ModelDrafter(Engine& engine, ModelDrafterOptions opts, std::string name);
  ~ModelDrafter() override;
  void propose(std::span<const int32_t> ctx, int n, Draft& out) override;
  std::string describe() const override { return name_; }
  bool uses_model() const override { return true; }
  int64_t pending(std::span<const int32_t> ctx) const override;

 private:
  Engine& engine_;
  ModelDrafterOptions opts_;
  std::string name_;
  int seq_;
  std::vector<int32_t> cached_;  // what the draft's cache holds
  std::vector<float> logits_;
  std::mt19937_64 rng_;
  SamplingCandidates cand_;
};

// Prompt lookup: the continuation of the most recent earlier occurrence of
// the context's last n-gram (n from max_ngram down to min_ngram).
class LookupDrafter : public Drafter {
 public:
  explicit LookupDrafter(int max_ngram, int min_ngram = 1);
  void propose(std::span<const int32_t> ctx, int n, Draft& out) override;
  std::string describe() const override;
  bool uses_model() const override { return false; }

 private:
  int max_ngram_, min_ngram_;
};

// The target quantized in memory for --draft-self: every 2-D tensor of the
// GGUF at `path` quantized to `scheme` (a barata quantize --type name such as
// int4-g128, nf4, q4_0), written to a temporary file that is loaded and
// removed at once (the mapping keeps it readable).
Model quantized_copy(const std::filesystem::path& path, const std::string& scheme, int threads);

// Throws barata::Error naming the first id whose token text differs, or the
// two sizes, when draft and target do not share a vocabulary.
void check_same_tokens(const Tokenizer& target, const Model& target_model, const Tokenizer& draft,
                       const Model& draft_model);

struct SpeculativeOptions {
  SamplerOptions sampling;  // repeat_penalty must be 1 (see speculative_generate)
  int draft_max = 8;        // gamma, or the largest gamma --draft-auto tries
  int draft_min = 0;        // fewer drafted tokens than this: a plain step instead
  bool auto_gamma = false;  // choose gamma (0 included) from measured alpha, c, v
  // --draft-auto's estimate of c before it is measured (e.g. the draft's
  // weight bytes over the target's); < 0: 0.5 for a model drafter, else 0.
  double c_prior = -1;
  int n_predict = 256;
  std::function<bool(int32_t)> is_eog;  // stops generation after such a token
  bool keep_sequence = false;           // leave the target's sequence allocated (SpecResult::seq)
};

// What one verify pass (or plain step) did.
struct SpecStep {
  int gamma = 0;     // tokens drafted (0: a plain decode step)
  int accepted = 0;  // of them kept
  double draft_ms = 0, verify_ms = 0;
};

struct SpecStats {
  int64_t drafted = 0, accepted = 0;
  int64_t verify_passes = 0, plain_steps = 0;
  double draft_ms = 0, verify_ms = 0, plain_ms = 0;
  // Measured once the run ends (0 where nothing measured it).
  double alpha = 0;                 // per-token acceptance: accepted / (accepted + rejections)
  double c = 0;                     // draft ms per drafted token / target ms per plain step
  double target_step_ms = 0;        // one-position target pass
  std::vector<double> verify_cost;  // [k]: a k-position pass / a one-position pass (0: unmeasured)
  std::vector<SpecStep> steps;
  double acceptance() const {  // accepted / drafted
    return drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0;
  }
  double tokens_per_verify() const {  // kept drafts + the target's own token, per pass
    return verify_passes
               ? static_cast<double>(accepted + verify_passes) / static_cast<double>(verify_passes)
               : 0.0;
  }
};

struct SpecResult {
  std::vector<int32_t> generated;  // the end-of-generation token included
  // kLength (n_predict), kEos, kContext, kCancelled (on_token said stop).
  FinishReason finish = FinishReason::kNone;
  double prefill_ms = 0, decode_ms = 0;
  SpecStats stats;
  // With keep_sequence: the target's sequence, holding every token but the
  // last generated one. Else -1 (freed).
  int seq = -1;
};

// A drafter the caller keeps, lent for one request (SchedulerOptions::drafter_for).
std::unique_ptr<Drafter> borrow_drafter(Drafter& d);
// The measurements of a run from its recorded steps: alpha, the plain
// step's ms, each verify pass's cost against it and (a model drafter) c.
void finish_spec_stats(SpecStats& st, int draft_max, bool uses_model);

// Prefills `prompt` into a new sequence of `target` and generates up to
// n_predict tokens with the drafter's proposals; the first token comes from
// the prefill. on_token sees every kept token in order; returning false stops
// ("interrupted"). The sequence is freed at the end. Throws barata::Error for
// a repetition penalty other than 1, an empty prompt, or draft_max outside
// [1, 64].
SpecResult speculative_generate(Engine& target, Drafter& drafter, std::span<const int32_t> prompt,
                                const SpeculativeOptions& opts,
                                const std::function<bool(int32_t)>& on_token = {});

// What --draft-auto knows about one sequence: the acceptance rate, the
// draft's cost per token, the one-position step and each k-position verify
// pass, measured as it goes, with priors until they are: alpha 0.8 (worth
// two tokens), c the caller's estimate (the weights' bytes), v from the
// prompt's prefill (its cost per row against one step).
//
// In a step shared by n sequences, one sequence's draft and verify rows
// delay all n: with the step's plain time T, its draft costs gamma c T and
// the step v T, for n - 1 + E(gamma) tokens where a plain step gives n. So
// the rate against plain is (n - 1 + E) / (n (gamma c + v)); at n = 1 the
// reference text's E / (gamma c + v). c and v are measured on the steps the
// sequence is in, whoever shares them.
class AutoGamma {
 public:
  AutoGamma(int gmax, double c_prior, double prefill_row_ms = 0);
  void set_row_ms(double ms) { row_ms_ = ms; }
  void plain(double ms) { step_.add(ms); }
  void draft(int n, double ms) {
    if (n > 0) draft_.add(ms / n);
  }
  void verify(int k, double ms) { verify_[static_cast<size_t>(k)].add(ms); }
  void outcome(int gamma, int accepted);
  double alpha() const;
  double c() const;
  double v(int k) const;  // a k-position pass against a one-position pass
  // The gamma to draft (0: a plain step) with `left` tokens still to
  // generate, `pending` context tokens the drafter must read first, in a
  // step shared by n_batch sequences.
  int choose(int64_t left, int64_t pending, int64_t n_batch = 1);

 private:
  struct Ema {
    double v = 0;
    bool set = false;
    void add(double x, double w = 0.25) {
      v = set ? (1 - w) * v + w * x : x;
      set = true;
    }
  };
  double catch_up(int64_t pending) const;
  int gmax_;
  double c_prior_, row_ms_;
  Ema step_, draft_;
  std::vector<Ema> verify_;
  double succ_ = 0, trials_ = 0;
  int since_probe_ = 0;
  int explores_ = 0;
};

// One sequence's speculative decoding inside the scheduler (the step's
// mode: SchedulerOptions::drafter_for gives a request its drafter). The
// drafter proposes in schedule(); the verify rows [last, d1..dg] are a
// chunk of the step's batch that wants every row's logits; postprocess keeps
// the agreeing prefix and the target's own token (greedy: argmax; sampled:
// Leviathan's rule with this rng) and truncates the cache behind them.
struct SpecSlot {
  SpecSlot(std::unique_ptr<Drafter> d, uint64_t seed) : drafter(std::move(d)), rng(seed) {}
  std::unique_ptr<Drafter> drafter;
  Draft draft;  // this step's proposal (empty: a plain row)
  std::mt19937_64 rng;
  SamplingCandidates cand;
  Draft::Dist p;
  int64_t drafted = 0, accepted = 0, verify_passes = 0;
  double draft_ms = 0;
  double step_draft_ms = 0;  // this step's propose
  // --draft-auto: this sequence's own choice of gamma (null: draft_max).
  std::unique_ptr<AutoGamma> autog;
  double prefill_ms = 0;  // steps the prompt rode in, and its rows (AutoGamma's row cost)
  int64_t prefill_rows = 0;
};
// The target's token for one row of logits, as speculative decoding draws
// it: argmax when greedy, else a draw from the sampling distribution.
int32_t spec_choose(const SamplerOptions& o, std::span<const float> logits, SpecSlot& slot);
// Keeps the longest prefix of slot.draft the target agrees with, given the
// g + 1 rows of verify logits (row i follows draft token i - 1); returns
// how many drafted tokens are kept and sets *next to the target's own token.
int spec_verify(const SamplerOptions& o, const float* logits, int64_t n_vocab, SpecSlot& slot,
                int32_t* next);

// The expected tokens per verify pass, (1 - alpha^(gamma+1)) / (1 - alpha).
double expected_tokens_per_verify(double alpha, int gamma);
// The reference text's predicted speedup: expected tokens / (gamma c + 1).
double predicted_speedup(double alpha, int gamma, double c);
// With the verify pass's cost: expected tokens / (gamma c + v).
double predicted_speedup(double alpha, int gamma, double c, double v);

// The Leviathan et al. accept/resample step for one drafted token, exposed
// for tests: p is the target's distribution (ids, probabilities), q the
// draft's (empty: a point mass on x). Returns x when accepted, else a token
// drawn from norm(max(0, p - q)), and sets *accepted.
int32_t speculative_accept(const Draft::Dist& p, const Draft::Dist* q, int32_t x,
                           std::mt19937_64& rng, bool* accepted);

}  // namespace barata
