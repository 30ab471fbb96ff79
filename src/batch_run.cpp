#include "barata/batch_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "barata/bench.h"
#include "barata/error.h"

namespace barata {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

const char* status_name(SeqStatus s) {
  switch (s) {
    case SeqStatus::kWaiting:
      return "waiting";
    case SeqStatus::kRunning:
      return "running";
    case SeqStatus::kFinished:
      return "finished";
    case SeqStatus::kFailed:
      return "failed";
  }
  return "?";
}

// Every block back in the pool and the prefix cache cold, as if the engine
// were new (the Scheduler frees what it holds when it dies).
void reset_pool(Engine& engine) {
  KvBlockManager& kv = engine.blocks();
  kv.clear_prefix_cache();
  if (kv.blocks_in_use() != 0)
    fail("internal: {} KV blocks still in use after a policy's run", kv.blocks_in_use());
}

PolicyRun run_policy(
    Engine& engine, const Tokenizer& tok, SchedulerOptions o, const std::vector<Request>& requests,
    const std::vector<std::string>& ids, const std::function<bool()>& interrupted,
    const std::function<void(const Scheduler&, int64_t, int64_t, bool)>& on_progress) {
  reset_pool(engine);
  PolicyRun out;
  out.policy = o.policy;
  o.is_eog = [&tok](int32_t t) { return tok.is_eog(t); };
  o.tokenizer = &tok;
  EngineSteps steps(engine);
  {
    Scheduler sch(steps, o);
    int64_t finished = 0;
    sch.on_finish = [&finished](const Sequence&) { ++finished; };
    std::vector<int> sid;
    for (const Request& r : requests) sid.push_back(sch.submit(r));
    const int64_t total = static_cast<int64_t>(sid.size());
    sch.on_step = [&](const StepInfo& info, int64_t busy) {
      out.steps.push_back({sch.now(), info.running, busy, info.rows});
    };
    // Scheduler::run steps, and sleeps while the next request has not arrived.
    sch.run([&] {
      if (on_progress) on_progress(sch, finished, total, false);
      return !(interrupted && interrupted());
    });
    if (!sch.idle()) {  // interrupted: every request left is cancelled
      out.interrupted = true;
      for (int id : sid) sch.cancel(id);
    }
    out.wall_s = sch.now();
    if (on_progress) on_progress(sch, finished, total, true);
    out.stats = sch.stats();
    for (size_t i = 0; i < sid.size(); ++i) {
      const Sequence& q = sch.sequence(sid[i]);
      BatchRow r;
      r.id = i < ids.size() ? ids[i] : std::to_string(i);
      r.prompt_tokens = q.n_prompt;
      r.output.assign(q.output().begin(), q.output().end());
      r.text = q.text;
      r.status = status_name(q.status);
      r.finish = finish_name(q.finish);
      r.error = q.error;
      r.arrival_s = q.req.arrival_s;
      if (q.t_finished >= 0) r.latency_s = q.latency_s();
      if (q.t_first_token >= 0) r.ttft_s = q.ttft_s();
      r.preemptions = q.n_preemptions;
      r.prefix_hit_tokens = q.prefix_hit_tokens;
      out.rows.push_back(std::move(r));
    }
  }
  reset_pool(engine);
  return out;
}

// ---- the simulation's step costs -----------------------------------------------

// Median ms of one Engine::decode step of B sequences, for B = 1..slots: B
// sequences each prefilled with a short synthetic prompt, one untimed step,
// then kTimed timed steps. B beyond what the pool holds is extrapolated
// linearly from the last two measured points.
std::vector<double> measure_step_costs(Engine& engine, int slots) {
  constexpr int64_t kTimed = 5;
  const int64_t n_vocab = engine.model().config().n_vocab;
  const int64_t n_ctx = engine.n_ctx();
  const int64_t prompt = std::clamp<int64_t>(n_ctx - kTimed - 2, 1, 8);
  const int64_t steps = std::min<int64_t>(kTimed + 1, n_ctx - prompt);
  if (steps < 2)
    fail("--simulate: the context of {} tokens is too small to time decode steps", n_ctx);
  reset_pool(engine);
  const int64_t per_seq =
      (prompt + steps + KvBlockManager::kBlockTokens - 1) / KvBlockManager::kBlockTokens;
  const int max_b = static_cast<int>(
      std::min<int64_t>(slots, engine.blocks().free_blocks() / std::max<int64_t>(per_seq, 1)));
  if (max_b < 1) fail("--simulate: the KV pool cannot hold one sequence to time");
  std::vector<int32_t> ids(static_cast<size_t>(prompt));
  for (int64_t i = 0; i < prompt; ++i)
    ids[static_cast<size_t>(i)] = bench::synthetic_token(i, n_vocab);
  std::vector<double> cost;
  std::vector<float> logits;
  for (int b = 1; b <= max_b; ++b) {
    std::vector<int> seqs;
    logits.resize(static_cast<size_t>(b * n_vocab));
    for (int i = 0; i < b; ++i) {
      seqs.push_back(engine.new_sequence());
      engine.prefill(seqs.back(), ids, logits.data());
    }
    std::vector<double> ms;
    for (int64_t t = 0; t < steps; ++t) {
      std::vector<int32_t> toks(static_cast<size_t>(b),
                                bench::synthetic_token(prompt + t, n_vocab));
      const auto t0 = Clock::now();
      engine.decode(seqs, toks, logits.data());
      if (t > 0) ms.push_back(ms_since(t0));  // the first step is the warm-up
    }
    for (int q : seqs) engine.free_sequence(q);
    cost.push_back(workload::quantile(ms, 0.5));
  }
  while (static_cast<int>(cost.size()) < slots) {
    const size_t n = cost.size();
    const double slope = n >= 2 ? std::max(0.0, cost[n - 1] - cost[n - 2]) : 0.0;
    cost.push_back(cost[n - 1] + slope);
  }
  reset_pool(engine);
  return cost;
}

// Both policies replayed over the lengths the first measured run produced
// (requests that failed or produced nothing left out) and its arrivals.
Simulation simulate_both(const PolicyRun& measured, int slots, std::vector<double> cost) {
  Simulation sim;
  sim.cost_ms = std::move(cost);
  std::vector<int64_t> lengths;
  std::vector<double> arrivals;
  for (const BatchRow& r : measured.rows) {
    if (!r.ok() || r.output.empty()) continue;
    lengths.push_back(static_cast<int64_t>(r.output.size()));
    arrivals.push_back(r.arrival_s);
  }
  sim.stat = workload::simulate(BatchPolicy::kStatic, lengths, arrivals, slots, sim.cost_ms);
  sim.cont = workload::simulate(BatchPolicy::kContinuous, lengths, arrivals, slots, sim.cost_ms);
  return sim;
}

const PolicyRun* find_run(const std::vector<PolicyRun>& runs, BatchPolicy p) {
  for (const PolicyRun& r : runs)
    if (r.policy == p) return &r;
  return nullptr;
}

std::optional<Comparison> compare(const std::vector<PolicyRun>& runs) {
  const PolicyRun *st = find_run(runs, BatchPolicy::kStatic),
                  *co = find_run(runs, BatchPolicy::kContinuous);
  if (!st || !co) return std::nullopt;
  const auto ls = workload::summarize_latency(st->latencies()),
             lc = workload::summarize_latency(co->latencies());
  Comparison c;
  c.throughput_ratio = st->tokens_per_s() > 0 ? co->tokens_per_s() / st->tokens_per_s() : 0;
  c.latency_ratio = lc.mean > 0 ? ls.mean / lc.mean : 0;
  return c;
}

}  // namespace barata
