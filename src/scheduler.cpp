#include "barata/scheduler.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

#include "barata/engine.h"
#include "barata/error.h"
#include "barata/speculative.h"
#include "barata/tokenizer.h"

namespace barata {

KvBlockManager& EngineSteps::blocks() {
  return e_.blocks();
}
int64_t EngineSteps::n_ctx() const {
  return e_.n_ctx();
}
int64_t EngineSteps::n_vocab() const {
  return e_.model().config().n_vocab;
}
void EngineSteps::forward(Batch& batch, float* logits) {
  e_.forward(batch, logits);
}

const char* policy_name(BatchPolicy p) {
  return p == BatchPolicy::kStatic ? "static" : "continuous";
}

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kEos:
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
    case FinishReason::kContext:
      return "length";
    default:
      return nullptr;
  }
}

const char* run_stop_name(FinishReason r) {
  switch (r) {
    case FinishReason::kEos:
      return "eog";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kContext:
      return "context_full";
    case FinishReason::kCancelled:
      return "interrupted";
    default:
      return "n_predict";
  }
}

Scheduler::Scheduler(StepEngine& engine, SchedulerOptions opts)
    : engine_(engine), opts_(std::move(opts)) {
  if (opts_.slots < 1) fail("scheduler: {} slots (need at least 1)", opts_.slots);
  if (opts_.max_batch_tokens < 1)
    fail("scheduler: a token budget of {} per step (need at least 1)", opts_.max_batch_tokens);
  if (!opts_.clock) {
    const auto t0 = std::chrono::steady_clock::now();
    opts_.clock = [t0] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
  }
  if (opts_.draft_max < 1 || opts_.draft_max > 64)
    fail("scheduler: --draft-max {} is outside [1, 64]", opts_.draft_max);
  if (opts_.draft_min < 0 || opts_.draft_min > 64)
    fail("scheduler: --draft-min {} is outside [0, 64]", opts_.draft_min);
  if (opts_.recompute && opts_.drafter_for)
    fail("scheduler: speculative decoding needs the KV cache (--no-kv-cache recomputes it)");
  engine_.blocks().set_prefix_caching(opts_.prefix_cache);
  logits_.resize(static_cast<size_t>(engine_.n_vocab()));
}

Scheduler::~Scheduler() {
  // The sequences' blocks go back to the engine (which outlives us).
  for (int id : running_) {
    Sequence& s = seq(id);
    if (s.kv >= 0 && engine_.blocks().exists(s.kv)) release(s, true);
  }
}

int Scheduler::submit(Request r) {
  int id;
  if (!free_ids_.empty()) {  // the smallest forgotten id
    std::pop_heap(free_ids_.begin(), free_ids_.end(), std::greater<>());
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<int>(seqs_.size());
    seqs_.emplace_back();
  }
  seqs_[static_cast<size_t>(id)] = std::make_unique<Sequence>(r);
  Sequence& s = *seqs_[static_cast<size_t>(id)];
  ++n_held_;
  s.id = id;
  s.req = std::move(r);
  s.tokens = s.req.prompt;
  s.n_prompt = static_cast<int64_t>(s.tokens.size());
  if (opts_.tokenizer) s.decoder = std::make_unique<StreamDecoder>(*opts_.tokenizer);

  const int64_t n_ctx = engine_.n_ctx(), n_vocab = engine_.n_vocab();
  const KvBlockManager& kv = engine_.blocks();
  if (s.tokens.empty()) {
    fail_request(s, "the prompt is empty");
    return id;
  }
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    if (s.tokens[i] < 0 || s.tokens[i] >= n_vocab) {
      fail_request(s, fmt::format("prompt token {} has id {}, outside the vocabulary (0..{})", i,
                                  s.tokens[i], n_vocab - 1));
      return id;
    }
  }
  if (s.n_prompt >= n_ctx) {
    fail_request(
        s, fmt::format("the prompt has {} tokens but the context holds {}", s.n_prompt, n_ctx));
    return id;
  }
  // A sliding-window model's sequence holds only its windows' blocks in its
  // sliding groups, chunk by chunk: it may run past max_tokens().
  if (kv.peak_blocks(s.n_prompt + 1, opts_.max_batch_tokens) > kv.max_blocks()) {
    fail_request(s, fmt::format("the prompt has {} tokens but the whole KV pool holds {}",
                                s.n_prompt, kv.max_sequence_tokens(opts_.max_batch_tokens)));
    return id;
  }
  if (s.req.max_tokens < 0) {
    fail_request(s, fmt::format("max_tokens is {}", s.req.max_tokens));
    return id;
  }
  if (s.req.kv_seq >= 0 && (!kv.exists(s.req.kv_seq) || kv.length(s.req.kv_seq) > s.n_prompt)) {
    fail_request(s, fmt::format("internal: sequence {} to continue does not exist or holds more "
                                "than the prompt",
                                s.req.kv_seq));
    return id;
  }
  if (!s.req.stop.empty() && !opts_.tokenizer) {
    fail_request(s, "stop strings need a tokenizer");
    return id;
  }
  if (opts_.drafter_for) {
    if (std::unique_ptr<Drafter> d = opts_.drafter_for(s.req)) {
      if (s.sampler->options().repeat_penalty != 1.0f) {
        fail_request(s, fmt::format("speculative decoding does not take a repetition penalty ({})",
                                    s.sampler->options().repeat_penalty));
        return id;
      }
      s.spec = std::make_shared<SpecSlot>(std::move(d), s.sampler->options().seed);
      if (opts_.draft_auto) {
        const double c = opts_.draft_c_prior >= 0        ? opts_.draft_c_prior
                         : s.spec->drafter->uses_model() ? 0.5
                                                         : 0.0;
        s.spec->autog = std::make_unique<AutoGamma>(opts_.draft_max, c);
      }
    }
  }
  // Room for the whole generation up front: a step appends without allocating.
  s.tokens.reserve(
      static_cast<size_t>(std::min(n_ctx, s.n_prompt + std::min(s.req.max_tokens, n_ctx))));
  if (s.decoder)
    s.text.reserve(static_cast<size_t>(
        std::min<int64_t>(std::min(s.req.max_tokens, n_ctx) * 8, int64_t{1} << 20)));
  for (int32_t t : s.tokens) s.sampler->accept(t);
  if (s.req.max_tokens == 0 && !s.req.prefill_only) {
    s.status = SeqStatus::kFinished;
    s.finish = FinishReason::kLength;
    s.t_first_token = s.t_finished = std::max(now(), s.req.arrival_s);
    if (on_finish) on_finish(s);
    return id;
  }
  enqueue(s);
  return id;
}

// Into the waiting queue in arrival order (ties: submission order);
// preempted sequences stay at the front.
void Scheduler::enqueue(const Sequence& s) {
  auto pos = waiting_.end();
  while (pos != waiting_.begin()) {
    const Sequence& w = seq(*(pos - 1));
    if (w.n_preemptions > 0 || w.req.arrival_s <= s.req.arrival_s) break;
    --pos;
  }
  waiting_.insert(pos, s.id);
}

std::vector<int> Scheduler::submit_samples(Request r, int n) {
  if (n < 1) fail("internal: Scheduler::submit_samples with n = {}", n);
  if (n > 1 && (r.kv_seq >= 0 || r.sampler))
    fail("internal: Scheduler::submit_samples: a caller's cache or sampler cannot be shared");
  std::vector<Request> rest;
  for (int i = 1; i < n; ++i) {
    rest.push_back(r);
    rest.back().sampling.seed = r.sampling.seed + static_cast<uint64_t>(i);
    rest.back().tag = r.tag + static_cast<uint64_t>(i);
  }
  std::vector<int> ids{submit(std::move(r))};
  for (Request& q : rest) {
    const int id = submit(std::move(q));
    ids.push_back(id);
    Sequence& s = seq(id);
    Sequence& first = seq(ids[0]);
    if (s.done() || first.done() || s.status != SeqStatus::kWaiting) continue;
    // Held until the first's prompt is computed (not queued meanwhile).
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    s.sample_of = first.id;
    first.samples.push_back(id);
  }
  return ids;
}

// The first sample's others into the queue: with `fork`, each continues a
// fork of its cache, which holds the whole prompt now.
void Scheduler::release_samples(Sequence& first, bool fork) {
  KvBlockManager& kv = engine_.blocks();
  std::vector<int> ids;
  ids.swap(first.samples);
  for (int id : ids) {
    Sequence& s = seq(id);
    s.sample_of = -1;
    if (fork && first.kv >= 0) {
      s.req.kv_seq = kv.fork(first.kv);
      s.owns_fork = true;
      ++stats_.sample_forks;
    }
    enqueue(s);
  }
}

bool Scheduler::idle() const {
  return waiting_.empty() && running_.empty();
}

void Scheduler::fail_request(Sequence& s, std::string why) {
  if (!s.samples.empty()) release_samples(s, false);
  if (s.owns_fork && s.kv < 0) release(s, false);
  s.status = SeqStatus::kFailed;
  s.finish = FinishReason::kError;
  s.error = std::move(why);
  s.spec.reset();
  s.t_finished = std::max(now(), s.req.arrival_s);
  ++stats_.failed;
  if (on_finish) on_finish(s);
}

// Gives back a sequence's blocks; a caller's sequence keeps what it has
// computed (keep_computed) or is emptied.
void Scheduler::release(Sequence& s, bool keep_computed) {
  if (s.owns_fork) {  // the scheduler's fork: freed whole, never kept
    if (engine_.blocks().exists(s.req.kv_seq)) engine_.blocks().free_sequence(s.req.kv_seq);
    if (s.kv == s.req.kv_seq) s.kv = -1;
    s.req.kv_seq = -1;
    s.owns_fork = false;
  }
  if (s.kv >= 0) {
    if (s.kv == s.req.kv_seq)
      engine_.blocks().truncate(s.kv, keep_computed ? s.n_computed : 0);
    else
      engine_.blocks().free_sequence(s.kv);
  }
  s.kv = -1;
  s.n_computed = 0;
}

void Scheduler::finish(Sequence& s, FinishReason r) {
  if (!s.samples.empty()) release_samples(s, false);
  s.status = SeqStatus::kFinished;
  s.finish = r;
  s.spec.reset();  // the drafter and its cache go now (a verify in flight holds its own reference)
  s.t_last_token = s.t_finished = now();
  s.step_finished = stats_.steps;
  if (s.decoder) {
    const std::string tail = s.decoder->flush();
    if (r != FinishReason::kStop) s.text += tail;
    stream_text(s, true);
  }
  if (on_finish) on_finish(s);
}

void Scheduler::preempt(Sequence& s) {
  release(s, false);
  s.status = SeqStatus::kWaiting;
  ++s.n_preemptions;
  ++stats_.preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), s.id));
  waiting_.push_front(s.id);
}

void Scheduler::cancel(int id) {
  Sequence& s = seq(id);
  if (s.done()) return;
  if (s.sample_of >= 0) {  // held for the first sample's prompt
    std::vector<int>& v = seq(s.sample_of).samples;
    v.erase(std::find(v.begin(), v.end(), id));
    s.sample_of = -1;
  } else if (s.status == SeqStatus::kWaiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    release(s, false);  // a fork it was queued with
  } else {
    release(s, true);
    running_.erase(std::find(running_.begin(), running_.end(), id));
  }
  finish(s, FinishReason::kCancelled);
}

void Scheduler::forget(int id) {
  Sequence& s = seq(id);
  if (!s.done()) fail("internal: Scheduler::forget({}): the sequence is not done", id);
  // A finished member of a static batch keeps its slot until the batch ends.
  if (std::find(running_.begin(), running_.end(), id) != running_.end())
    fail("internal: Scheduler::forget({}): the sequence still holds a slot", id);
  seqs_[static_cast<size_t>(id)].reset();
  --n_held_;
  free_ids_.push_back(id);
  std::push_heap(free_ids_.begin(), free_ids_.end(), std::greater<>());
}

Sequence& Scheduler::seq(int id) const {
  if (!has(id)) fail("internal: scheduler: no sequence {} (forgotten, or never submitted)", id);
  return *seqs_[static_cast<size_t>(id)];
}

bool Scheduler::has(int id) const {
  return id >= 0 && id < n_sequences() && seqs_[static_cast<size_t>(id)] != nullptr;
}

// Passes on_text the text that is final: everything when the sequence ends,
// else all but a tail that could be the start of a stop string.
void Scheduler::stream_text(Sequence& s, bool all) {
  size_t end = s.text.size();
  if (!all) {
    for (const std::string& st : s.req.stop) {
      if (st.empty()) continue;
      // The longest suffix of the text that is a proper prefix of st.
      for (size_t k = std::min(st.size() - 1, s.text.size()); k > 0; --k) {
        if (s.text.compare(s.text.size() - k, k, st, 0, k) == 0) {
          end = std::min(end, s.text.size() - k);
          break;
        }
      }
    }
  }
  if (end > s.n_streamed) {
    if (on_text) on_text(s, std::string_view(s.text).substr(s.n_streamed, end - s.n_streamed));
    s.n_streamed = end;
  }
}

bool Scheduler::constrain(Sequence& s, std::span<float> logits) {
  int64_t allowed = 0;
  try {
    allowed = s.grammar->apply(logits);
  } catch (const Error& e) {
    fail_request(s, e.what());
    return false;
  }
  if (allowed > 0) return true;
  if (s.grammar->complete()) {
    finish(s, FinishReason::kEos);  // only an end-of-generation token was left, and it is ignored
  } else {
    fail_request(s, "grammar: no token of the vocabulary continues the text here");
  }
  return false;
}

// Appends a sampled token and checks the stop conditions; true when it stops.
bool Scheduler::emit(Sequence& s, int32_t token) {
  s.tokens.push_back(token);
  s.sampler->accept(token);
  ++stats_.generated_tokens;
  if (s.t_first_token < 0) {
    s.t_first_token = now();
    s.step_first_token = stats_.steps;
  }
  const bool eog = !s.req.ignore_eos && opts_.is_eog && opts_.is_eog(token);
  FinishReason stop = FinishReason::kNone;
  if (s.decoder && !eog) {
    // A stop string may straddle pieces: search the new text with enough of the old.
    size_t longest = 0;
    for (const std::string& st : s.req.stop) longest = std::max(longest, st.size());
    size_t from = s.text.size() > longest ? s.text.size() - longest : 0;
    s.decoder->push(token, s.text);
    if (s.req.stop_after_text) {
      const size_t lead = s.text.find_first_not_of(" \t\r\n");
      from = lead == std::string::npos ? s.text.size() : std::max(from, lead + 1);
    }
    size_t cut = std::string::npos;
    for (const std::string& st : s.req.stop) {
      if (st.empty()) continue;
      const size_t at = s.text.find(st, from);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {
      s.text.resize(cut);
      stop = FinishReason::kStop;
    }
  }
  // The grammar follows the text; when it can take no more bytes the
  // sequence is done (its end-of-generation token would be the only choice).
  bool grammar_done = false;
  if (s.grammar && !eog) {
    if (!s.grammar->accept(token)) {
      // Only a caller bypassing the mask gets here.
      if (on_token) on_token(s, token);
      fail_request(s, fmt::format("token {} is not allowed by the grammar here", token));
      return true;
    }
    grammar_done = !s.grammar->can_continue();
  }
  if (on_token) on_token(s, token);
  stream_text(s, stop != FinishReason::kNone);
  if (stop == FinishReason::kNone) {
    if (eog || grammar_done)
      stop = FinishReason::kEos;
    else if (static_cast<int64_t>(s.output().size()) >= s.req.max_tokens)
      stop = FinishReason::kLength;
    else if (static_cast<int64_t>(s.tokens.size()) >= engine_.n_ctx())
      stop = FinishReason::kContext;
  }
  if (stop == FinishReason::kNone) return false;
  finish(s, stop);
  return true;
}

bool Scheduler::admissible(const Sequence& s, bool new_batch) const {
  if (s.req.arrival_s > now()) return false;
  if (opts_.policy == BatchPolicy::kContinuous) return true;
  // Static: a new batch only once the last one has wholly finished; a
  // member preempted out of the running batch may come back into it.
  return new_batch || s.n_preemptions > 0;
}

void Scheduler::admit(Sequence& s) {
  waiting_.pop_front();
  s.status = SeqStatus::kRunning;
  s.admit_order = admit_counter_++;
  if (s.t_admitted < 0) {
    s.t_admitted = now();
    s.step_admitted = stats_.steps;
    stats_.prompt_tokens += s.n_prompt;
  }
  running_.push_back(s.id);
}

StepInfo Scheduler::step() {
  if (!schedule()) return plan_.info;
  run_forward();
  postprocess();
  if (on_step) on_step(plan_.info, plan_.busy);
  return plan_.info;
}

// Rows per running sequence: decode rows first (and a static batch's
// padding), then prefill chunks, oldest first, from what is left of the
// budget. Returns the budget left.
int64_t Scheduler::plan_running() {
  std::vector<Work>& work = plan_.work;
  work.clear();
  int64_t budget = opts_.max_batch_tokens;
  for (int id : running_) {  // decode rows and padding
    Sequence& s = seq(id);
    if (s.done()) {
      if (opts_.compute_padding && s.kv >= 0 && budget > 0) {
        work.push_back({&s, 1, true});
        --budget;
      }
    } else if (s.n_computed + 1 == static_cast<int64_t>(s.tokens.size()) && budget > 0) {
      if (opts_.recompute && s.n_computed > 0) {
        // Without a cache: the whole context again, as a prefill (below).
        engine_.blocks().truncate(s.kv, 0);
        s.n_computed = 0;
        continue;
      }
      work.push_back({&s, 1, false});
      --budget;
    }
  }
  for (int id : running_) {  // prefill chunks, oldest first
    Sequence& s = seq(id);
    const int64_t left = static_cast<int64_t>(s.tokens.size()) - s.n_computed;
    if (s.done() || left <= (s.req.prefill_only ? 0 : 1) || budget <= 0) continue;
    const int64_t n = std::min(left, budget);
    work.push_back({&s, n, false});
    budget -= n;
  }
  return budget;
}

bool Scheduler::schedule() {
  plan_.info = {};
  plan_.finished.clear();
  StepInfo& info = plan_.info;
  std::vector<Work>& work = plan_.work;
  KvBlockManager& kv = engine_.blocks();
  const bool is_static = opts_.policy == BatchPolicy::kStatic;

  // Static: the batch ends when every member has finished.
  if (is_static && !running_.empty()) {
    bool all_done = true;
    for (int id : running_) all_done = all_done && seq(id).done();
    if (all_done) {
      // The batch's results are delivered together, when its last member ends.
      double end = 0;
      for (int id : running_) end = std::max(end, seq(id).t_finished);
      for (int id : running_) {
        Sequence& s = seq(id);
        release(s, true);
        s.t_finished = end;
      }
      running_.clear();
    }
  }

  // The running sequences' rows, blocks checked: when the pool cannot hold
  // them, padding goes first, then the youngest sequence is preempted.
  int64_t budget = plan_running();
  for (;;) {
    int64_t need = 0;
    for (const Work& w : work) need += kv.blocks_needed(w.s->kv, w.n);
    if (need <= kv.free_blocks()) break;
    // Out of blocks: padding goes first (finished members of a static batch
    // stop being computed), then the youngest running sequence is preempted.
    Sequence* victim = nullptr;
    for (int id : running_) {
      Sequence& s = seq(id);
      if (s.done() && s.kv >= 0) {
        victim = &s;
        break;
      }
    }
    if (victim) {
      release(*victim, true);  // its result is kept; it stays in the batch as a slot, uncomputed
    } else {
      for (int id : running_) {
        Sequence& s = seq(id);
        if (!s.done() && (!victim || s.admit_order > victim->admit_order)) victim = &s;
      }
      if (!victim) break;
      int64_t live = 0;
      for (int id : running_) live += seq(id).done() ? 0 : 1;
      if (live == 1) {
        // Alone and still too big: the pool holds no more of it.
        release(*victim, true);
        running_.erase(std::find(running_.begin(), running_.end(), victim->id));
        finish(*victim, FinishReason::kContext);
      } else {
        preempt(*victim);
        ++info.preempted;
      }
    }
    budget = plan_running();
  }

  // Admissions: first come, first served (no skipping: nobody starves),
  // while a slot is free and the pool can hold the whole remaining prompt.
  int64_t planned = 0;
  for (const Work& w : work) planned += kv.blocks_needed(w.s->kv, w.n);
  const bool new_batch = running_.empty();
  while (!waiting_.empty() && static_cast<int>(running_.size()) < opts_.slots) {
    Sequence& s = seq(waiting_.front());
    if (!admissible(s, new_batch)) break;
    if (!is_static && budget <= 0) break;
    int64_t hit = 0;
    if (s.req.kv_seq >= 0) {  // the caller's cache holds the start
      s.kv = s.req.kv_seq;
      hit = std::min(kv.length(s.kv), static_cast<int64_t>(s.tokens.size()) - 1);
      kv.truncate(s.kv, hit);
    } else {
      s.kv = kv.new_sequence();
      hit = kv.attach_prefix(s.kv, s.tokens);
    }
    if (kv.prefix_caching() && s.req.kv_seq < 0) {
      ++stats_.prefix_lookups;
      stats_.prefix_hit_blocks += hit / kKvBlockTokens;
    }
    const int64_t left = static_cast<int64_t>(s.tokens.size()) - hit;
    // The whole remaining prompt must fit; with sliding groups it holds only
    // its windows' blocks at a time, chunk by chunk (peak_blocks).
    int64_t whole = kv.blocks_needed(s.kv, left);
    if (kv.has_sliding_groups())
      whole =
          std::min(whole, std::max<int64_t>(0, kv.peak_blocks(static_cast<int64_t>(s.tokens.size()),
                                                              opts_.max_batch_tokens) -
                                                   kv.blocks_held(s.kv)));
    if (planned + whole > kv.free_blocks()) {
      if (s.kv != s.req.kv_seq) kv.free_sequence(s.kv);
      s.kv = -1;
      break;
    }
    s.n_computed = hit;
    if (s.n_preemptions == 0) {
      s.prefix_hit_tokens = hit;
      stats_.prefix_hit_tokens += hit;
    }
    admit(s);
    ++info.admitted;
    if (budget > 0) {
      const int64_t n = std::min(left, budget);
      work.push_back({&s, n, false});
      planned += kv.blocks_needed(s.kv, n);
      budget -= n;
    }
  }

  // Drafts last, from what the budget and the pool have left: speculation
  // never delays a prompt or another sequence's token.
  if (opts_.drafter_for) {
    int64_t sharing = 0;  // sequences in the step: a draft delays them all
    for (const Work& w : work) sharing += w.padding ? 0 : 1;
    for (Work& w : work) {
      Sequence& s = *w.s;
      if (w.padding || !s.spec || w.n != 1 || s.t_first_token < 0 ||
          s.n_computed + 1 != static_cast<int64_t>(s.tokens.size()))
        continue;
      s.spec->draft.tokens.clear();
      s.spec->draft.q.clear();
      s.spec->step_draft_ms = 0;
      if (budget <= 0) continue;
      draft(s, budget, sharing);
      int g = static_cast<int>(s.spec->draft.tokens.size());
      const int64_t one = kv.blocks_needed(s.kv, 1);
      while (g > 0 && planned + kv.blocks_needed(s.kv, 1 + g) - one > kv.free_blocks()) --g;
      if (g < std::max(opts_.draft_min, 1)) g = 0;
      s.spec->draft.tokens.resize(static_cast<size_t>(g));
      if (!s.spec->draft.q.empty()) s.spec->draft.q.resize(static_cast<size_t>(g));
      if (g == 0) continue;
      planned += kv.blocks_needed(s.kv, 1 + g) - one;
      budget -= g;
      w.n = 1 + g;
      w.g = g;
    }
  }

  if (work.empty()) return false;
  // Slots: a sequence still generating is busy; a finished member of a
  // static batch is padding, computed or not.
  plan_.busy = plan_.padding_slots = 0;
  for (int id : running_) (seq(id).done() ? plan_.padding_slots : plan_.busy) += 1;
  info.running = static_cast<int64_t>(running_.size());

  batch_.clear();
  for (const Work& w : work) {
    Sequence& s = *w.s;
    if (w.padding) {
      batch_.add(s.tokens[static_cast<size_t>(s.n_computed)], s.n_computed, s.kv, true);
      ++info.padding_rows;
      continue;
    }
    if (w.g > 0) {  // a verify chunk: the last token and the drafts, every row's logits
      batch_.add(s.tokens.back(), s.n_computed, s.kv, true);
      for (int i = 0; i < w.g; ++i)
        batch_.add(s.spec->draft.tokens[static_cast<size_t>(i)], s.n_computed + 1 + i, s.kv, true);
      ++info.decode_rows;
      info.draft_rows += w.g;
      continue;
    }
    for (int64_t i = 0; i < w.n; ++i) {
      const int64_t p = s.n_computed + i;
      const bool last = p + 1 == static_cast<int64_t>(s.tokens.size());
      batch_.add(s.tokens[static_cast<size_t>(p)], p, s.kv, last);
    }
    if (w.n == 1 && s.n_computed + 1 == static_cast<int64_t>(s.tokens.size()) &&
        s.t_first_token >= 0)
      ++info.decode_rows;
    else
      info.prefill_rows += w.n;
    if (s.t_first_token < 0) s.prefill_rows += w.n;
  }
  info.rows = batch_.size();
  return true;
}

void Scheduler::run_forward() {
  const int64_t n_logits = batch_.n_logits();
  if (static_cast<int64_t>(logits_.size()) < n_logits * engine_.n_vocab())
    logits_.resize(static_cast<size_t>(n_logits * engine_.n_vocab()));
  const auto t0 = std::chrono::steady_clock::now();
  engine_.forward(batch_, logits_.data());
  plan_.info.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.steps;
}

// Each sequence's new tokens are in the cache; the last row of a finished
// prompt (or a decode row) gives its next token.
void Scheduler::postprocess() {
  StepInfo& info = plan_.info;
  KvBlockManager& kv = engine_.blocks();
  const bool is_static = opts_.policy == BatchPolicy::kStatic;
  int64_t logit_row = 0;
  for (const Work& w : plan_.work) {
    Sequence& s = *w.s;
    if (w.padding) {
      kv.truncate(s.kv, s.n_computed);  // the padding row is taken back
      ++logit_row;
      continue;
    }
    if (w.g > 0) {
      float* lg = logits_.data() + logit_row * engine_.n_vocab();
      logit_row += w.g + 1;
      if (verify(s, w.g, lg)) plan_.finished.push_back(&s);
      continue;
    }
    s.n_computed += w.n;
    kv.publish(s.kv, s.tokens);
    if (s.spec) measure_plain(s, w.n, info.ms);
    if (s.n_computed != static_cast<int64_t>(s.tokens.size())) continue;
    std::span<float> lg(logits_.data() + logit_row * engine_.n_vocab(),
                        static_cast<size_t>(engine_.n_vocab()));
    ++logit_row;
    if (s.req.prefill_only) {  // the prompt is in the cache: nothing to sample
      finish(s, FinishReason::kLength);
      plan_.finished.push_back(&s);
      continue;
    }
    // The prompt is computed: the other samples fork its cache now.
    if (!s.samples.empty()) release_samples(s, true);
    if (on_logits) on_logits(s, lg);
    if (s.grammar && !constrain(s, lg)) {
      plan_.finished.push_back(&s);
      continue;
    }
    // The sampled token is not in the cache yet: the next step feeds it. A
    // speculating sequence draws every token as its verify passes do.
    const int32_t next =
        s.spec ? spec_choose(s.sampler->options(), lg, *s.spec) : s.sampler->sample(lg);
    if (emit(s, next)) plan_.finished.push_back(&s);
  }
  for (Sequence* s : plan_.finished) {
    ++info.finished;
    if (!is_static) {
      release(*s, true);
      running_.erase(std::find(running_.begin(), running_.end(), s->id));
    }
  }

  stats_.rows += info.rows;
  stats_.decode_rows += info.decode_rows;
  stats_.prefill_rows += info.prefill_rows;
  stats_.padding_rows += info.padding_rows;
  stats_.draft_rows += info.draft_rows;
  stats_.accepted += info.accepted;
  stats_.busy_slot_steps += plan_.busy;
  stats_.padding_slot_steps += plan_.padding_slots;
  stats_.forward_ms += info.ms;
}

// Up to max_g tokens continuing s (fewer near max_tokens and the context's
// end). A drafter that fails (a draft model's full pool) proposes nothing.
void Scheduler::draft(Sequence& s, int64_t max_g, int64_t sharing) {
  SpecSlot& sp = *s.spec;
  const int64_t L = static_cast<int64_t>(s.tokens.size());
  const int64_t left = s.req.max_tokens - static_cast<int64_t>(s.output().size());
  int64_t want = opts_.draft_max;
  if (sp.autog) want = sp.autog->choose(left, sp.drafter->pending(s.tokens), sharing);
  const int64_t gamma = std::min({want, max_g, left - 1, engine_.n_ctx() - L});
  if (gamma <= 0) return;
  // A round that first reads a long lag (the prompt, or what plain steps
  // wrote) does not measure c: that is the catch-up, costed apart.
  const int64_t lag = sp.autog && sp.drafter->uses_model() ? sp.drafter->pending(s.tokens) : 0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    sp.drafter->propose(s.tokens, static_cast<int>(gamma), sp.draft);
  } catch (const Error& e) {
    spdlog::debug("sequence {}: the drafter proposed nothing: {}", s.id, e.what());
    sp.draft.tokens.clear();
    sp.draft.q.clear();
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  sp.draft_ms += ms;
  sp.step_draft_ms = ms;
  stats_.draft_ms += ms;
  if (static_cast<int64_t>(sp.draft.tokens.size()) > gamma) {
    sp.draft.tokens.resize(static_cast<size_t>(gamma));
    if (!sp.draft.q.empty()) sp.draft.q.resize(static_cast<size_t>(gamma));
  }
  if (sp.autog && sp.drafter->uses_model() && !sp.draft.tokens.empty() && lag <= 2)
    sp.autog->draft(static_cast<int>(sp.draft.tokens.size()), ms);
}

// The verify chunk's g + 1 rows of logits: the agreeing drafts and the
// target's own token are kept, the cache is cut back behind them (rejection
// is a truncation), and each kept token is emitted in turn until one stops
// the sequence.
bool Scheduler::verify(Sequence& s, int g, float* logits) {
  const std::shared_ptr<SpecSlot> hold = s.spec;  // finish() drops s.spec
  SpecSlot& sp = *hold;
  KvBlockManager& kv = engine_.blocks();
  const int64_t nv = engine_.n_vocab();
  const int64_t L = static_cast<int64_t>(s.tokens.size());
  int32_t next = -1;
  if (s.grammar) {
    // Row i follows drafts 0..i-1: each is masked by the grammar's state
    // after them, so that a draft the grammar refuses is rejected like any
    // other. Rows past the first refused draft are never read.
    GrammarMatcher probe = *s.grammar;
    for (int i = 0; i <= g; ++i) {
      probe.apply(std::span<float>(logits + static_cast<size_t>(i) * static_cast<size_t>(nv),
                                   static_cast<size_t>(nv)));
      if (i < g && !probe.accept(sp.draft.tokens[static_cast<size_t>(i)])) break;
    }
  }
  const int k = spec_verify(s.sampler->options(), logits, nv, sp, &next);
  kv.truncate(s.kv, L + k);  // the context and the kept drafts
  s.n_computed = L + k;
  sp.drafted += g;
  sp.accepted += k;
  ++sp.verify_passes;
  if (sp.autog) {
    sp.autog->verify(g + 1, plan_.info.ms);
    sp.autog->outcome(g, k);
  }
  if (SpecStats* st = s.req.spec_stats) {
    st->drafted += g;
    st->accepted += k;
    st->draft_ms += sp.step_draft_ms;
    st->verify_ms += plan_.info.ms;
    ++st->verify_passes;
    st->steps.push_back({g, k, sp.step_draft_ms, plan_.info.ms});
  }
  ++stats_.verify_passes;
  plan_.info.accepted += k;
  bool stopped = false;
  for (int i = 0; i <= k && !stopped; ++i) {
    if (on_logits)
      on_logits(s, std::span<const float>(logits + static_cast<size_t>(i) * static_cast<size_t>(nv),
                                          static_cast<size_t>(nv)));
    stopped = emit(s, i < k ? sp.draft.tokens[static_cast<size_t>(i)] : next);
  }
  // Stopped early: the cache holds no more than the tokens before the last.
  const int64_t held = static_cast<int64_t>(s.tokens.size()) - 1;
  if (s.n_computed > held) {
    kv.truncate(s.kv, held);
    s.n_computed = held;
  }
  kv.publish(s.kv, s.tokens);
  return stopped;
}

// A speculating sequence's step without a verify: a prompt chunk (its cost
// per row is AutoGamma's first guess at a verify pass's) or a plain decode
// row (the step a verify pass is weighed against).
void Scheduler::measure_plain(Sequence& s, int64_t rows, double ms) {
  SpecSlot& sp = *s.spec;
  if (s.t_first_token < 0) {
    sp.prefill_ms += ms;
    sp.prefill_rows += rows;
    if (sp.autog && s.n_computed == static_cast<int64_t>(s.tokens.size()))
      sp.autog->set_row_ms(sp.prefill_rows >= 8 ? sp.prefill_ms / sp.prefill_rows : 0.0);
    return;
  }
  if (rows != 1) return;  // recomputing after a preemption
  if (sp.autog) sp.autog->plain(ms);
  if (SpecStats* st = s.req.spec_stats) {
    st->draft_ms += sp.step_draft_ms;
    st->plain_ms += ms;
    ++st->plain_steps;
    st->steps.push_back({0, 0, sp.step_draft_ms, ms});
  }
}

void Scheduler::run(const std::function<bool()>& keep_going) {
  while (!idle()) {
    if (keep_going && !keep_going()) return;
    const StepInfo info = step();
    if (info.rows > 0 || idle()) continue;
    // Nothing could run: the next request has not arrived yet.
    double next = -1;
    for (int id : waiting_) {
      const double a = seq(id).req.arrival_s;
      if (next < 0 || a < next) next = a;
    }
    const double wait = next - now();
    if (next < 0 || (wait <= 0 && running_.empty()))
      fail("internal: scheduler: nothing can run ({} waiting, {} running, {} free blocks)",
           waiting_.size(), running_.size(), engine_.blocks().free_blocks());
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait, 0.05)));
  }
}

}  // namespace barata
