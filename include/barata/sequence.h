// A request and the scheduler's state of it: what a caller submits (Request),
// how far it got (Sequence: its tokens, text, status and accounting) and why
// generation stopped (FinishReason), the one vocabulary of every generation
// path. "Sequence" means this; the KV block manager's per-sequence tables are
// its own (KvBlockManager::SeqBlocks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "barata/grammar.h"
#include "barata/sampler.h"
#include "barata/tokenizer.h"

namespace barata {

struct SpecSlot;   // speculative.h
struct SpecStats;  // speculative.h

struct Request {
  std::string id;                 // a caller's name for it (JSONL "id"), may be empty
  std::vector<int32_t> prompt;    // token ids, BOS included when wanted
  SamplerOptions sampling;        // its own seed
  int64_t max_tokens = 256;       // tokens to generate at most
  bool ignore_eos = false;        // generate max_tokens whatever is sampled
  std::vector<std::string> stop;  // stop strings (need SchedulerOptions::tokenizer)
  // Stop strings match only after the text's first non-whitespace byte (a
  // reply that opens with blank lines goes on; the battery's "\n").
  bool stop_after_text = false;
  double arrival_s = 0;  // when it arrives, seconds after the scheduler's clock zero
  // A caller's engine sequence whose cache holds a prefix of `prompt` (a
  // chat's earlier turns): the request continues it, and at the end it is
  // left holding every token but the last sampled one. -1: the scheduler
  // makes its own and frees it.
  int kv_seq = -1;
  // The caller's own key for the request (the server's job number), carried
  // untouched: with ids reused after Scheduler::forget, it tells a stale id
  // from a live one.
  uint64_t tag = 0;
  // Compute the whole prompt into the cache and generate nothing (`run -n
  // 0`, a chat's /load): it finishes with kLength, and a kv_seq is left
  // holding every prompt token.
  bool prefill_only = false;
  // A caller's sampler (its random state and penalty window carry across
  // requests); null: one made from `sampling`.
  Sampler* sampler = nullptr;
  // Where a speculating sequence records each of its decode steps and
  // verify passes (a caller's; null: only the scheduler's totals).
  SpecStats* spec_stats = nullptr;
  // Constrained decoding: every generated token keeps the text a prefix of
  // a sentence of this grammar (its vocabulary must be the model's), and
  // generation ends where the grammar is complete (null: unconstrained).
  std::shared_ptr<const GrammarIndex> grammar;
};

enum class SeqStatus { kWaiting, kRunning, kFinished, kFailed };
// eos: an end-of-generation token; length: max_tokens; stop: a stop string;
// context: the sequence filled n_ctx; cancelled; error: refused (see error).
enum class FinishReason { kNone, kEos, kLength, kStop, kContext, kCancelled, kError };
// Its names: batch's JSON "finish" (eos, length, stop, context, cancelled,
// error); the OpenAI API's finish_reason (stop, length; null for the rest);
// and run's JSON "stop" (eog, n_predict, stop, context_full, interrupted).
const char* finish_name(FinishReason r);
const char* openai_finish_reason(FinishReason r);
const char* run_stop_name(FinishReason r);

struct Sequence {
  int id = 0;  // submission order, from 0
  Request req;
  Sampler own_sampler;
  Sampler* sampler;             // req.sampler or &own_sampler
  std::vector<int32_t> tokens;  // prompt, then every generated token
  int64_t n_prompt = 0;
  int64_t n_computed = 0;  // leading tokens whose K/V the cache holds
  int kv = -1;             // the engine's sequence while it holds blocks
  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish = FinishReason::kNone;
  std::string error;      // why it failed (status kFailed)
  std::string text;       // generated text so far (with a tokenizer), stop string excluded
  size_t n_streamed = 0;  // bytes of text passed to Scheduler::on_text

  // Accounting. Times are the scheduler clock's seconds; -1: not yet.
  // t_last_token: when its last token came out; t_finished: when its result
  // is delivered, the same except in a static batch, whose members' results
  // come back together when the batch ends (a padded batch's generate call
  // returns once its longest member is done).
  double t_admitted = -1, t_first_token = -1, t_last_token = -1, t_finished = -1;
  int64_t step_admitted = -1, step_first_token = -1, step_finished = -1;
  int64_t n_preemptions = 0;
  int64_t prefix_hit_tokens = 0;  // prompt tokens taken from the prefix cache
  int64_t prefill_rows = 0;       // rows computed before the first token (recompute included)
  int64_t admit_order = -1;       // admission counter (the youngest is preempted first)

  explicit Sequence(const Request& r)
      : own_sampler(r.sampling), sampler(r.sampler ? r.sampler : &own_sampler) {
    if (r.grammar) grammar = std::make_unique<GrammarMatcher>(r.grammar);
  }
  std::span<const int32_t> output() const {
    // Empty once Scheduler::forget dropped the tokens.
    return std::span<const int32_t>(tokens).subspan(
        std::min(static_cast<size_t>(n_prompt), tokens.size()));
  }
  bool done() const { return status == SeqStatus::kFinished || status == SeqStatus::kFailed; }
  double latency_s() const { return t_finished - req.arrival_s; }
  double ttft_s() const { return t_first_token - req.arrival_s; }

  std::unique_ptr<StreamDecoder> decoder;  // with a tokenizer
  // Speculative decoding's state while it runs (SchedulerOptions::drafter_for);
  // dropped, with its drafter and the drafter's cache, when it finishes.
  std::shared_ptr<SpecSlot> spec;
  // Where it stands in Request::grammar (null: unconstrained).
  std::unique_ptr<GrammarMatcher> grammar;

  // Several samples of one prompt (Scheduler::submit_samples). On the first:
  // the others, waiting for its prompt to be computed. On another: the
  // first's id while it waits (-1 once it is queued).
  std::vector<int> samples;
  int sample_of = -1;
  // Its req.kv_seq is a fork of the first sample's cache that the scheduler
  // made: freed when the sequence gives its blocks back, never kept.
  bool owns_fork = false;
};

}  // namespace barata
