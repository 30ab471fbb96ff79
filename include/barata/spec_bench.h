// `barata spec-bench`'s measurement: plain decoding against speculative
// decoding at fixed gammas and --draft-auto, greedy, on the same prompts,
// every configuration through speculative_generate (the scheduler's
// speculative mode; plain is a drafter that never proposes). The command
// adds flags, the agreement, the table and the chart.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "barata/engine.h"
#include "barata/speculative.h"

namespace barata {

struct SpecBenchConfig {
  std::string name;
  int gamma = 0;  // 0: plain
  bool automatic = false;
  // Over prompts, per repetition: decode tokens and ms; and the statistics summed.
  std::vector<double> tps;  // per repetition
  double tokens = 0, ms = 0;
  int64_t drafted = 0, accepted = 0, trials = 0, verify_passes = 0, plain_steps = 0;
  double draft_ms = 0, verify_ms = 0, plain_ms = 0;
  int64_t verify_rows = 0;  // sum over passes of gamma + 1 (for the mean pass size)
};

struct SpecBenchOptions {
  int n_predict = 128;
  int reps = 2;
  int draft_min = 0;
  double c_prior = -1;                  // --draft-auto's prior for c
  std::function<bool(int32_t)> is_eog;  // generation ends after such a token
};

// Each repetition runs every configuration on every prompt in turn,
// configs[0] first (it should be plain: gamma 0); greedy, so every
// configuration must write configs[0]'s ids, else a barata::Error names it.
// on_line gets a progress line per run.
void run_spec_bench(Engine& target, Drafter& drafter,
                    const std::vector<std::vector<int32_t>>& prompts,
                    std::vector<SpecBenchConfig>& configs, const SpecBenchOptions& o,
                    const std::function<void(const std::string&)>& on_line = {});

}  // namespace barata
