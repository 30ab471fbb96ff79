#include "barata/session.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "barata/error.h"
#include "barata/plan.h"
#include "barata/scheduler.h"

namespace barata {
namespace {

double ms_since(Session::Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Session::Clock::now() - t).count();
}

}  // namespace

Session::Session(const SessionOptions& o)
    : t_start(Clock::now()),
      path(o.model.string()),
      model(Model::load(o.model)),
      tok(Tokenizer::from_gguf(model.file())),
      n_ctx(o.n_ctx > 0 ? o.n_ctx : std::min<int64_t>(model.config().n_ctx_train, 4096)),
      engine(model, {.n_threads = o.n_threads,
                     .n_ctx = n_ctx,
                     .cache_tokens = o.kv_tokens > 0 ? o.kv_tokens : o.kv_contexts * n_ctx,
                     .device = o.device,
                     .swa_full = o.swa_full,
                     .cache_k = o.cache_k,
                     .cache_v = o.cache_v,
                     .experts_on_cpu = o.experts_on_cpu}),
      load_ms(ms_since(t_start)) {
  spdlog::info("{}", kv_pool_line(engine));
}

std::string kv_pool_line(const Engine& e) {
  if (!e.blocks().has_sliding_groups())
    return plan::describe_kv_pool(e.blocks().max_tokens(), e.n_ctx(), e.kv_bytes_per_token(),
                                  kv_cache_label(e.kv_layout().k_type, e.kv_layout().v_type));
  return plan::describe_kv_pool_bytes(
      e.blocks().max_blocks() * e.kv_layout().bytes_per_block(), e.n_ctx(),
      [&e](int64_t len) { return e.kv_sequence_bytes(len); },
      kv_cache_label(e.kv_layout().k_type, e.kv_layout().v_type));
}

Generation generate(Session& s, int seq, std::span<const int32_t> prompt, std::vector<int32_t>& all,
                    Sampler& sampler, const GenerateOptions& o,
                    const std::function<void(std::string_view)>& on_text) {
  Generation g;
  const Tokenizer& tok = s.tok;
  all.insert(all.end(), prompt.begin(), prompt.end());
  g.prefill_tokens = static_cast<int64_t>(prompt.size());

  // One request on the scheduler, a batch of one: -n 0 fills the cache and
  // samples nothing; without the cache, each token recomputes the sequence;
  // with a drafter, each decode step may be a verify pass.
  EngineSteps steps(s.engine);
  SchedulerOptions so;
  so.slots = 1;
  so.max_batch_tokens = std::max<int64_t>(s.n_ctx, 1);  // the prompt in one call
  so.prefix_cache = false;
  so.recompute = o.no_cache;
  so.tokenizer = &tok;
  so.is_eog = [&tok](int32_t t) { return tok.is_eog(t); };
  if (o.drafter) {
    Drafter* d = o.drafter;
    so.drafter_for = [d](const Request&) { return borrow_drafter(*d); };
    so.draft_max = o.draft_max;
    so.draft_min = o.draft_min;
    so.draft_auto = o.draft_auto;
    so.draft_c_prior = o.draft_c_prior;
  }
  Scheduler sch(steps, so);
  sch.on_logits = [&](const Sequence&, std::span<const float> logits) {
    if (o.top_logits <= 0 && o.show_probs <= 0) return;
    nlohmann::json step;
    if (o.top_logits > 0) {
      nlohmann::json tl = nlohmann::json::array();
      for (auto [id, p] : top_probs(logits, 1.0f, o.top_logits)) {
        (void)p;
        tl.push_back({id, logits[static_cast<size_t>(id)]});
      }
      step["top_logits"] = tl;
    }
    if (o.show_probs > 0) {
      const float temp = sampler.options().temperature > 0 ? sampler.options().temperature : 1.0f;
      nlohmann::json tp = nlohmann::json::array();
      for (auto [id, p] : top_probs(logits, temp, o.show_probs)) tp.push_back({id, p});
      step["probs"] = tp;
    }
    if (o.on_step) o.on_step(step);
    g.steps.push_back(std::move(step));
  };
  const auto t_start = Session::Clock::now();
  Session::Clock::time_point t_decode;
  sch.on_token = [&](const Sequence&, int32_t id) {
    if (g.generated.empty()) {
      g.ttft_ms = ms_since(t_start);
      t_decode = Session::Clock::now();
    }
    g.generated.push_back(id);
  };
  // The scheduler's text: whole characters, held back while it could be
  // the start of a stop string, the stop string itself never passed on.
  sch.on_text = [&](const Sequence&, std::string_view text) {
    g.text += text;
    on_text(text);
  };

  Request r;
  r.prompt = all;
  r.sampler = &sampler;
  r.kv_seq = seq;
  r.max_tokens = o.n_predict;
  r.prefill_only = o.n_predict == 0;
  r.stop = o.stop;
  r.grammar = o.grammar;
  if (o.drafter) r.spec_stats = &g.spec;
  const int id = sch.submit(std::move(r));
  bool prefill_timed = false;
  while (!sch.idle()) {
    if (o.interrupted && o.interrupted()) {
      sch.cancel(id);
      break;
    }
    const StepInfo info = sch.step();
    if (!prefill_timed) g.prefill_ms = info.ms;  // the first call reads the prompt
    prefill_timed = true;
  }
  const Sequence& q = sch.sequence(id);
  if (q.status == SeqStatus::kFailed) fail("{}", q.error);
  all.assign(q.tokens.begin(), q.tokens.end());
  if (!g.generated.empty()) g.decode_ms = ms_since(t_decode);
  g.finish = q.finish;
  if (q.grammar) g.grammar_us = q.grammar->apply_us();
  if (o.drafter) finish_spec_stats(g.spec, o.draft_max, o.drafter->uses_model());
  return g;
}

}  // namespace barata
