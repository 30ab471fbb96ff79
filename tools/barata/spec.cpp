// The draft flags, the drafter they name and its statistics' reports.
#include "spec.h"

#include <fmt/core.h>

#include "barata/error.h"
#include "barata/plan.h"

namespace barata::cli {

void add_spec_options(CLI::App* sub, SpecArgs& a, bool with_tuning) {
  auto* d = sub->add_option("--draft", a.draft,
                            "Draft model (GGUF) for speculative decoding; same vocabulary")
                ->check(CLI::ExistingFile);
  auto* s = sub->add_option("--draft-self", a.draft_self,
                            "Draft with the target itself quantized in memory to this scheme "
                            "(int4-g128, nf4, q4_0, ... as barata quantize --type)");
  auto* l = sub->add_option("--lookup", a.lookup,
                            "Draft by n-gram lookup in the context: the longest n-gram, at most "
                            "N tokens, whose earlier occurrence is continued")
                ->check(CLI::Range(1, 64));
  d->excludes(s)->excludes(l);
  s->excludes(l);
  if (with_tuning) {
    sub->add_option("--draft-max", a.draft_max,
                    "Tokens drafted per verify pass (gamma; with --draft-auto the largest tried)")
        ->check(CLI::Range(1, 64));
    sub->add_option("--draft-min", a.draft_min,
                    "A draft shorter than this is not verified (a plain step instead)")
        ->check(CLI::Range(0, 64));
    sub->add_flag("--draft-auto", a.draft_auto,
                  "Choose gamma (0: plain decoding) from the measured acceptance, draft cost "
                  "and verify cost as it runs");
  }
  sub->add_option("--draft-p-min", a.p_min,
                  "Stop drafting when the draft's probability of its token is below P")
      ->check(CLI::Range(0.0f, 1.0f));
}

void check_spec_args(const SpecArgs& a) {
  if (!a.any() && (a.draft_auto || a.p_min > 0))
    throw CLI::ValidationError("--draft-auto/--draft-p-min",
                               "need a drafter (--draft, --draft-self or --lookup)");
}

DraftSetup make_drafter(const SpecArgs& a, Session& s, const SamplerOptions& sampling,
                        int contexts) {
  DraftSetup d;
  const ModelDrafterOptions mo{.sampling = sampling, .p_min = a.p_min};
  if (a.lookup > 0) {
    d.drafter = std::make_unique<LookupDrafter>(a.lookup, std::min(a.lookup, 2));
    d.name = fmt::format("lookup {}", a.lookup);
    return d;
  }
  if (!a.draft_self.empty()) {
    d.model = std::make_unique<Model>(quantized_copy(s.path, a.draft_self, s.engine.n_threads()));
    d.name = fmt::format("self {}", a.draft_self);
  } else {
    d.model = std::make_unique<Model>(Model::load(a.draft));
    d.name = a.draft;
  }
  d.tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(d.model->file()));
  check_same_tokens(s.tok, s.model, *d.tok, *d.model);
  // The draft's cache takes the target's types (--cache-type-k / -v).
  d.engine = std::make_unique<Engine>(*d.model,
                                      EngineOptions{.n_threads = s.engine.n_threads(),
                                                    .n_ctx = s.n_ctx,
                                                    .cache_tokens = std::max(contexts, 1) * s.n_ctx,
                                                    .device = s.engine.backend().kind(),
                                                    .cache_k = s.engine.kv_layout().k_type,
                                                    .cache_v = s.engine.kv_layout().v_type});
  d.drafter = std::make_unique<ModelDrafter>(*d.engine, mo, d.name);
  d.c_prior = static_cast<double>(d.model->weight_bytes()) /
              static_cast<double>(std::max<int64_t>(s.model.weight_bytes(), 1));
  return d;
}

DraftFactory make_draft_factory(const SpecArgs& a, Session& s, int slots) {
  DraftFactory f;
  f.setup = make_drafter(a, s, SamplerOptions{}, slots);
  f.setup.drafter.reset();  // one per request instead
  if (a.lookup > 0) {
    const int n = a.lookup;
    f.drafter_for = [n](const Request&) -> std::unique_ptr<Drafter> {
      return std::make_unique<LookupDrafter>(n, std::min(n, 2));
    };
  } else {
    Engine* engine = f.setup.engine.get();
    const std::string name = f.setup.name;
    const float p_min = a.p_min;
    f.drafter_for = [engine, name, p_min](const Request& r) -> std::unique_ptr<Drafter> {
      return std::make_unique<ModelDrafter>(
          *engine, ModelDrafterOptions{.sampling = r.sampling, .p_min = p_min}, name);
    };
  }
  return f;
}

nlohmann::json spec_json(const SpecStats& st, const SpecArgs& a, const std::string& name) {
  nlohmann::json vc = nlohmann::json::object();
  for (size_t k = 2; k < st.verify_cost.size(); ++k)
    if (st.verify_cost[k] > 0) vc[std::to_string(k)] = st.verify_cost[k];
  return {{"drafter", name},
          {"draft_max", a.draft_max},
          {"draft_auto", a.draft_auto},
          {"drafted", st.drafted},
          {"accepted", st.accepted},
          {"acceptance", st.acceptance()},
          {"alpha", st.alpha},
          {"verify_passes", st.verify_passes},
          {"plain_steps", st.plain_steps},
          {"tokens_per_verify", st.tokens_per_verify()},
          {"draft_ms", st.draft_ms},
          {"verify_ms", st.verify_ms},
          {"plain_ms", st.plain_ms},
          {"c", st.c},
          {"target_step_ms", st.target_step_ms},
          {"verify_cost", vc}};
}

std::string spec_line(const SpecStats& st, const SpecArgs& a, const std::string& name) {
  std::string line = fmt::format(
      "speculative ({}, {}gamma {}): {} verify passes + {} plain steps | drafted {}, accepted {} "
      "({:.1f}%, alpha {:.3f}) | {:.2f} tokens per verify",
      name, a.draft_auto ? "auto, " : "", a.draft_max, st.verify_passes, st.plain_steps, st.drafted,
      st.accepted, 100.0 * st.acceptance(), st.alpha, st.tokens_per_verify());
  if (st.drafted) line += fmt::format(" | draft {:.2f} ms/token", st.draft_ms / st.drafted);
  if (st.c > 0) line += fmt::format(" (c = {:.3f})", st.c);
  return line;
}

}  // namespace barata::cli
