#include "barata/spec_bench.h"

#include <algorithm>

#include <fmt/core.h>

#include "barata/error.h"

namespace barata {
namespace {

// No proposal at all: every step is a plain decode step, timed by the same loop.
class NoDrafter : public Drafter {
 public:
  void propose(std::span<const int32_t>, int, Draft& out) override {
    out.tokens.clear();
    out.q.clear();
  }
  std::string describe() const override { return "plain"; }
  bool uses_model() const override { return false; }
};

}  // namespace

void run_spec_bench(Engine& target, Drafter& drafter,
                    const std::vector<std::vector<int32_t>>& prompts,
                    std::vector<SpecBenchConfig>& configs, const SpecBenchOptions& b,
                    const std::function<void(const std::string&)>& on_line) {
  NoDrafter none;
  SamplerOptions greedy;
  greedy.temperature = 0.0f;
  for (int rep = 0; rep < b.reps; ++rep) {
    std::vector<double> tok_rep(configs.size(), 0), ms_rep(configs.size(), 0);
    for (size_t pi = 0; pi < prompts.size(); ++pi) {
      std::vector<int32_t> want;
      for (size_t ci = 0; ci < configs.size(); ++ci) {
        SpecBenchConfig& c = configs[ci];
        SpeculativeOptions o;
        o.sampling = greedy;
        o.n_predict = b.n_predict;
        o.draft_max = std::max(c.gamma, 1);
        o.draft_min = b.draft_min;
        o.auto_gamma = c.automatic;
        o.c_prior = b.c_prior;
        o.is_eog = b.is_eog;
        const SpecResult r = speculative_generate(
            target, c.gamma == 0 ? static_cast<Drafter&>(none) : drafter, prompts[pi], o);
        // Greedy: every configuration writes the plain run's ids.
        if (ci == 0)
          want = r.generated;
        else if (r.generated != want)
          fail(
              "{} on prompt {} wrote other ids than plain decoding (a bug: greedy "
              "speculation is exact)",
              c.name, pi + 1);
        const double steps = static_cast<double>(std::max<size_t>(r.generated.size(), 1) - 1);
        tok_rep[ci] += steps;
        ms_rep[ci] += r.decode_ms;
        c.tokens += steps;
        c.ms += r.decode_ms;
        const SpecStats& st = r.stats;
        c.drafted += st.drafted;
        c.accepted += st.accepted;
        c.verify_passes += st.verify_passes;
        c.plain_steps += st.plain_steps;
        c.draft_ms += st.draft_ms;
        c.verify_ms += st.verify_ms;
        c.plain_ms += st.plain_ms;
        for (const SpecStep& step : st.steps) {
          if (step.gamma == 0) continue;
          c.trials += step.accepted + (step.accepted < step.gamma ? 1 : 0);
          c.verify_rows += step.gamma + 1;
        }
        if (on_line)
          on_line(fmt::format("rep {} prompt {} {}: {:.1f} tokens/s", rep + 1, pi + 1, c.name,
                              r.decode_ms > 0 ? steps / (r.decode_ms / 1e3) : 0.0));
      }
    }
    for (size_t ci = 0; ci < configs.size(); ++ci)
      configs[ci].tps.push_back(ms_rep[ci] > 0 ? tok_rep[ci] / (ms_rep[ci] / 1e3) : 0);
  }
}

}  // namespace barata
