// `barata batch`'s logic: a request list through the scheduler under one
// batching policy, with each request's outcome and each step's occupancy
// (run_policy); decode step costs measured for the simulation and both
// policies replayed on them; the policies compared. The command adds flags,
// progress and printing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "barata/engine.h"
#include "barata/scheduler.h"
#include "barata/tokenizer.h"
#include "barata/workload.h"

namespace barata {

// One request's outcome under one policy.
struct BatchRow {
  std::string id;
  int64_t prompt_tokens = 0;
  std::vector<int32_t> output;
  std::string text, status, finish, error;
  double arrival_s = 0, latency_s = -1, ttft_s = -1;
  int64_t preemptions = 0, prefix_hit_tokens = 0;
  bool ok() const { return status == "finished" && finish != "cancelled"; }
};

// One step as the charts need it.
struct StepRecord {
  double t_s = 0;  // the scheduler clock at the end of the step
  int64_t running = 0, busy = 0, rows = 0;
};

struct PolicyRun {
  BatchPolicy policy = BatchPolicy::kContinuous;
  double wall_s = 0;
  SchedulerStats stats;
  std::vector<BatchRow> rows;
  std::vector<StepRecord> steps;
  bool interrupted = false;

  int64_t failed() const {
    return std::count_if(rows.begin(), rows.end(),
                         [](const BatchRow& r) { return r.status == "failed"; });
  }
  int64_t finished() const {
    return std::count_if(rows.begin(), rows.end(), [](const BatchRow& r) { return r.ok(); });
  }
  std::vector<double> latencies() const {
    std::vector<double> v;
    for (const BatchRow& r : rows)
      if (r.ok()) v.push_back(r.latency_s);
    return v;
  }
  std::vector<double> ttfts() const {
    std::vector<double> v;
    for (const BatchRow& r : rows)
      if (r.ok() && r.ttft_s >= 0) v.push_back(r.ttft_s);
    return v;
  }
  double tokens_per_s() const {
    return wall_s > 0 ? static_cast<double>(stats.generated_tokens) / wall_s : 0;
  }
  double requests_per_s() const {
    return wall_s > 0 ? static_cast<double>(finished()) / wall_s : 0;
  }
  // Sequences holding a slot per step (the pool can hold fewer than --slots).
  double running_mean() const {
    double n = 0;
    for (const StepRecord& s : steps) n += static_cast<double>(s.running);
    return steps.empty() ? 0 : n / static_cast<double>(steps.size());
  }
  int64_t running_max() const {
    int64_t m = 0;
    for (const StepRecord& s : steps) m = std::max(m, s.running);
    return m;
  }
  double slot_utilization(int slots) const {
    return stats.steps > 0 ? static_cast<double>(stats.busy_slot_steps) /
                                 (static_cast<double>(stats.steps) * slots)
                           : 0;
  }
};

// Its name in batch's JSON: waiting, running, finished, failed.
const char* status_name(SeqStatus s);

// Every block back in the pool and the prefix cache cold, as if the engine
// were new; an error naming the count when blocks are still in use.
void reset_pool(Engine& engine);

// The requests through a Scheduler with these options (its tokenizer and
// end-of-generation test set from tok), the pool reset before and after.
// ids names the rows (ids[i] for requests[i]). interrupted() is polled
// between steps: true cancels every request left (PolicyRun::interrupted).
// on_progress(scheduler, finished, total, force) after each step and wait.
PolicyRun run_policy(Engine& engine, const Tokenizer& tok, SchedulerOptions o,
                     const std::vector<Request>& requests, const std::vector<std::string>& ids,
                     const std::function<bool()>& interrupted = {},
                     const std::function<void(const Scheduler&, int64_t finished, int64_t total,
                                              bool force)>& on_progress = {});

// Median ms of one Engine::decode step of B sequences, for B = 1..slots: B
// sequences each prefilled with a short synthetic prompt, one untimed step,
// then five timed steps. B beyond what the pool holds is extrapolated
// linearly from the last two measured points.
std::vector<double> measure_step_costs(Engine& engine, int slots);

struct Simulation {
  std::vector<double> cost_ms;
  int measured_b = 0;
  workload::SimResult stat, cont;
  double throughput_ratio() const {
    return stat.tokens_per_s() > 0 ? cont.tokens_per_s() / stat.tokens_per_s() : 0;
  }
  double latency_ratio() const {
    return cont.mean_latency_s() > 0 ? stat.mean_latency_s() / cont.mean_latency_s() : 0;
  }
};
// Both policies replayed over the lengths the measured run produced
// (requests that failed or produced nothing left out) and its arrivals.
Simulation simulate_both(const PolicyRun& measured, int slots, std::vector<double> cost);

const PolicyRun* find_run(const std::vector<PolicyRun>& runs, BatchPolicy p);
struct Comparison {
  double throughput_ratio = 0, latency_ratio = 0;  // continuous/static, static/continuous
};
// Continuous against static, when both ran.
std::optional<Comparison> compare(const std::vector<PolicyRun>& runs);

}  // namespace barata
