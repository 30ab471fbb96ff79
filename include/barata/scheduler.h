// Who runs in the next forward call: waiting and running queues over an
// engine's paged KV cache, with continuous or static batching, chunked
// prefill, preemption by recompute when blocks run out, and prefix caching.
// One loop drives every generation in barata (run, bench, batch): a single
// request is a batch of one.
//
// A step: (1) every running sequence that has finished its prompt gets one
// decode row; (2) sequences still in their prompt get prefill rows (chunks)
// from what is left of the token budget; (3) waiting requests are admitted
// into free slots while the budget and the pool allow. When the pool cannot
// hold a step's rows, the youngest running sequence is preempted: its blocks
// are freed and it goes back to the front of the queue, to be recomputed
// (prompt and the tokens generated so far) when it is admitted again. Its
// sampler lives on, so its output is what it would have been.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "barata/batch.h"
#include "barata/kv_cache.h"
#include "barata/sampler.h"
#include "barata/sequence.h"
#include "barata/tokenizer.h"

namespace barata {

class Engine;
class Drafter;

// What the scheduler drives: a KV block manager and a forward call over it.
// Engine is one (EngineSteps below); tests drive a fake.
class StepEngine {
 public:
  virtual ~StepEngine() = default;
  virtual KvBlockManager& blocks() = 0;
  virtual int64_t n_ctx() const = 0;
  virtual int64_t n_vocab() const = 0;
  // As Engine::forward: checks the batch, appends its rows, and writes
  // batch.n_logits() x n_vocab logits in row order.
  virtual void forward(Batch& batch, float* logits) = 0;
};

// An Engine as a StepEngine.
class EngineSteps final : public StepEngine {
 public:
  explicit EngineSteps(Engine& e) : e_(e) {}
  KvBlockManager& blocks() override;
  int64_t n_ctx() const override;
  int64_t n_vocab() const override;
  void forward(Batch& batch, float* logits) override;

 private:
  Engine& e_;
};

enum class BatchPolicy { kContinuous, kStatic };
const char* policy_name(BatchPolicy p);

struct SchedulerOptions {
  BatchPolicy policy = BatchPolicy::kContinuous;
  int slots = 8;                   // sequences running at once
  int64_t max_batch_tokens = 512;  // rows per forward call (decode rows + prefill chunks)
  bool prefix_cache = true;        // share cached full blocks of common prompt prefixes
  // End-of-generation ids (EOS, end of turn); a request with ignore_eos
  // ignores them.
  std::function<bool(int32_t)> is_eog;
  // For text and stop strings; may be null (then Request::stop must be empty).
  const Tokenizer* tokenizer = nullptr;
  // Seconds since some zero; the default is a steady clock from construction.
  std::function<double()> clock;
  // Static batching only: padding rows (finished slots of the batch) are
  // computed like the others, as a padded static batch does, and counted.
  bool compute_padding = true;
  // Speculative decoding as a mode of the step: a drafter for a request
  // (null, or a null result: it decodes plainly). A running sequence with
  // one drafts up to draft_max tokens (fewer near max_tokens and the
  // context's end; fewer than draft_min: a plain row) and its verify rows
  // ride in the step's batch beside other sequences' rows. Greedy output is
  // the target's own; sampled output keeps its distribution (Leviathan et
  // al.). Drafts are the first thing given up when the budget or the pool is
  // short: never a preemption for them.
  std::function<std::unique_ptr<Drafter>(const Request&)> drafter_for;
  int draft_max = 8;
  int draft_min = 0;
  // --draft-auto: each speculating sequence chooses its gamma (0 included)
  // from its measured acceptance, draft cost and verify cost (AutoGamma,
  // speculative.h), draft_max the largest. draft_c_prior: the draft's cost
  // per token against a target step before it is measured (< 0: 0.5 for a
  // model drafter, 0 for lookup).
  bool draft_auto = false;
  double draft_c_prior = -1;
  // No KV cache (`run --no-kv-cache`): before each of its tokens a sequence
  // drops its cache and recomputes its whole context, so a step costs what
  // the cache saves.
  bool recompute = false;
};

// What one step did.
struct StepInfo {
  // rows = decode + prefill + padding + draft rows; a verify chunk counts
  // one decode row and its drafted tokens' rows.
  int64_t rows = 0, decode_rows = 0, prefill_rows = 0, padding_rows = 0, draft_rows = 0;
  int64_t accepted = 0;  // drafted tokens kept
  int64_t running = 0;   // sequences holding a slot during the step (padding included)
  int64_t admitted = 0, finished = 0, preempted = 0;
  double ms = 0;  // the forward call
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t rows = 0, decode_rows = 0, prefill_rows = 0, padding_rows = 0, draft_rows = 0;
  int64_t accepted = 0, verify_passes = 0;  // drafted tokens kept; verify chunks
  double draft_ms = 0;                      // in the drafters' propose
  int64_t busy_slot_steps = 0;              // sum over steps of sequences doing useful work
  int64_t padding_slot_steps = 0;           // static: finished sequences kept in the batch
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;      // over admitted requests (first admission)
  int64_t prefix_hit_tokens = 0;  // prompt tokens taken from the prefix cache
  int64_t prefix_lookups = 0, prefix_hit_blocks = 0;
  int64_t sample_forks = 0;  // samples that forked the first sample's cache
  int64_t generated_tokens = 0;
  int64_t failed = 0;
  double forward_ms = 0;
};

class Scheduler {
 public:
  Scheduler(StepEngine& engine, SchedulerOptions opts);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; returns its sequence id. A request that can never run
  // (empty prompt, a prompt that with one generated token would not fit the
  // context or the whole pool, a token outside the vocabulary, stop strings
  // without a tokenizer) fails at once with an error; the others are
  // unaffected.
  int submit(Request r);
  // n samples of one prompt (the API's `n`): the request runs as the first;
  // once its prompt is computed, each other sample forks its cache (the
  // prompt's blocks shared, copy on write) and recomputes only the prompt's
  // last token for its own logits, instead of the whole prompt. Sample i
  // samples with seed r.sampling.seed + i, so it generates what that seed
  // alone would, and carries tag r.tag + i. Returns the n ids in order. A caller's kv_seq or
  // sampler cannot be shared: with n > 1 they are an error.
  std::vector<int> submit_samples(Request r, int n);

  // One forward call, or none when nothing can run (nothing waiting, or
  // every waiting request still to arrive). Throws what the engine throws.
  StepInfo step();
  // Steps until every request is done or keep_going() returns false. When
  // nothing can run until a request arrives, sleeps until it does.
  void run(const std::function<bool()>& keep_going = {});
  bool idle() const;  // nothing waiting or running
  void cancel(int id);
  // Sequences queued for a slot, and holding one.
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  // Frees a finished sequence whole (tokens, text, sampler, decoder), so that
  // a long-running server's memory stays bounded; sequence(id) is then an
  // error and has(id) false.
  void forget(int id);

  // Called after each generated token (the sequence's tokens include it).
  std::function<void(const Sequence&, int32_t token)> on_token;
  // With a tokenizer: generated text as it becomes final, in order; text
  // that could be the start of a stop string is held back until it is known
  // not to be (or the sequence ends), and a stop string is never passed on.
  // The pieces add up to Sequence::text.
  std::function<void(const Sequence&, std::string_view text)> on_text;
  // After each step that ran a forward call, with the slots that did useful
  // work in it (a static batch's finished members not counted).
  std::function<void(const StepInfo&, int64_t busy)> on_step;
  // Called once when a sequence finishes or fails.
  std::function<void(const Sequence&)> on_finish;
  // Called with a sequence's logits just before its next token is sampled
  // (the sampler may change them afterwards); for --top-logits and the like.
  std::function<void(const Sequence&, std::span<const float> logits)> on_logits;

  // A submitted sequence not yet forgotten.
  const Sequence& sequence(int id) const { return seq(id); }
  bool has(int id) const;
  // Ids issued: every id is below this. Ids are 0, 1, 2, ... in submission
  // order until one is forgotten; then the smallest forgotten id is the next
  // submit's (so that a server's tables stay as small as its live requests).
  int64_t n_sequences() const { return static_cast<int64_t>(seqs_.size()); }
  // Sequences held in memory (submitted, not yet forgotten).
  int64_t n_held() const { return n_held_; }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerOptions& options() const { return opts_; }
  double now() const { return opts_.clock(); }

 private:
  // One step in three parts (nano-vllm's shape): schedule() decides the
  // rows (admission, preemption, chunked prefill) and fills batch_;
  // run_forward() runs it; postprocess() takes the logits (sampling, stop
  // strings, text, finish). Their state is plan_, kept between steps so that
  // a step allocates nothing once warm.
  struct Work {
    Sequence* s;
    int64_t n;  // rows (a verify chunk's: 1 + its drafted tokens)
    bool padding;
    int g = 0;  // drafted tokens verified (a verify chunk)
  };
  struct StepPlan {
    std::vector<Work> work;
    std::vector<Sequence*> finished;
    StepInfo info;
    int64_t busy = 0, padding_slots = 0;  // slots doing useful work / padding
  };
  bool schedule();  // false: nothing can run this step
  void run_forward();
  void postprocess();
  int64_t plan_running();  // decode rows and prefill chunks of the running; the budget left
  // A decode-ready speculating sequence's proposal, in a step `sharing` sequences share.
  void draft(Sequence& s, int64_t max_g, int64_t sharing);
  bool verify(Sequence& s, int g, float* logits);  // true when it stops
  void measure_plain(Sequence& s, int64_t rows,
                     double ms);  // a speculating sequence's non-verify step
  bool admissible(const Sequence& s, bool new_batch) const;
  void admit(Sequence& s);
  void preempt(Sequence& s);
  void finish(Sequence& s, FinishReason r);
  void fail_request(Sequence& s, std::string why);
  void release(Sequence& s, bool keep_computed);
  bool emit(Sequence& s, int32_t token);  // true when the sequence stops
  // Masks a row of logits by the sequence's grammar; false when it failed
  // or finished (nothing the grammar allows is left).
  bool constrain(Sequence& s, std::span<float> logits);
  void stream_text(Sequence& s, bool all);
  StepEngine& engine_;
  SchedulerOptions opts_;
  Sequence& seq(int id) const;
  // By id; a forgotten one is null, its id in free_ids_ (a min-heap) for reuse.
  std::vector<std::unique_ptr<Sequence>> seqs_;
  std::vector<int> free_ids_;
  int64_t n_held_ = 0;
  void enqueue(const Sequence& s);
  void release_samples(Sequence& first, bool fork);
  std::deque<int> waiting_;   // ids, front first
  std::vector<int> running_;  // ids holding slots, admission order
  SchedulerStats stats_;
  int64_t admit_counter_ = 0;
  StepPlan plan_;
  Batch batch_;
  std::vector<float> logits_;
};

}  // namespace barata
