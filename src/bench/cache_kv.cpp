// Cache against no cache (same greedy ids, counted multiply-accumulates, time)
// and KV memory against its formula.
#include <algorithm>
#include <vector>

#include "barata/bench.h"
#include "barata/kv_cache.h"
#include "barata/error.h"
#include "barata/sampler.h"
#include "barata/scheduler.h"
#include "timing.h"

namespace barata::bench {
namespace {

// One greedy generation: ids and, after each generated token, the cumulative
// time and counted multiply-accumulates.
struct Trace {
  std::vector<int32_t> ids;
  std::vector<double> ms;
  std::vector<int64_t> proj_macs, attn_macs;
  void record(const Engine& e, Clock::time_point t0, int32_t id) {
    const int64_t p = proj_macs.empty() ? 0 : proj_macs.back();
    const int64_t a = attn_macs.empty() ? 0 : attn_macs.back();
    ids.push_back(id);
    proj_macs.push_back(p + e.last_counts().proj_macs);
    attn_macs.push_back(a + e.last_counts().attn_macs);
    ms.push_back(ms_since(t0));
  }
};

// Greedy requests on one scheduler (a batch of one), recording each token.
// The scheduler is made once per trace, outside the timed requests' work.
class GreedyRun {
 public:
  GreedyRun(Engine& e, Trace& tr) : e_(e), tr_(tr), steps_(e), sch_(steps_, options(e)) {
    sch_.on_token = [this](const Sequence&, int32_t id) { tr_.record(e_, t0_, id); };
    t0_ = Clock::now();
  }
  // Runs `tokens` as one request of up to n tokens on sequence seq; returns the sequence's tokens.
  std::vector<int32_t> request(int seq, std::vector<int32_t> tokens, int64_t n) {
    Request r;
    r.prompt = std::move(tokens);
    r.sampling.temperature = 0;
    r.max_tokens = n;
    r.ignore_eos = true;
    r.kv_seq = seq;
    const int id = sch_.submit(r);
    sch_.run();
    const Sequence& q = sch_.sequence(id);
    if (q.status == SeqStatus::kFailed) fail("{}", q.error);
    return q.tokens;
  }

 private:
  static SchedulerOptions options(const Engine& e) {
    SchedulerOptions o;
    o.slots = 1;
    o.max_batch_tokens = std::max<int64_t>(e.n_ctx(), 1);  // the prompt in one call
    o.prefix_cache = false;
    return o;
  }
  Engine& e_;
  Trace& tr_;
  EngineSteps steps_;
  Scheduler sch_;
  Clock::time_point t0_;
};

// The KV cache: prefill the prompt once, then one decode step per token.
Trace generate_cached(Engine& e, int seq, std::span<const int32_t> prompt, int64_t T) {
  Trace tr;
  e.truncate(seq, 0);
  GreedyRun g(e, tr);
  g.request(seq, {prompt.begin(), prompt.end()}, T);
  return tr;
}

// No cache: every token recomputes the whole sequence from scratch.
Trace generate_uncached(Engine& e, int seq, std::span<const int32_t> prompt, int64_t T) {
  Trace tr;
  std::vector<int32_t> all(prompt.begin(), prompt.end());
  GreedyRun g(e, tr);
  for (int64_t i = 0; i < T; ++i) {
    e.truncate(seq, 0);
    all = g.request(seq, std::move(all), 1);
  }
  return tr;
}

int64_t first_mismatch(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(n);
}

}  // namespace

CacheResult run_cache(Engine& e, std::span<const int32_t> prompt, const Settings& s,
                      const Hooks& h) {
  CacheResult r;
  const int64_t T = s.n_generate;
  if (h.stopped() || T < 1) return r;
  const int seq = e.new_sequence();
  const std::string what = fmt::format("cache vs no cache T={}", T);
  h.progress(what + " warm-up");
  const Trace warm_c = generate_cached(e, seq, prompt, T);
  const Trace warm_n = generate_uncached(e, seq, prompt, T);
  r.ran = true;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  r.n_generate = T;
  r.ids_cache = warm_c.ids;
  r.ids_no_cache = warm_n.ids;
  r.first_mismatch = first_mismatch(warm_c.ids, warm_n.ids);
  r.ids_identical = r.first_mismatch < 0;

  // Timed repetitions alternate the two ways, so that drift in the machine's
  // load hits both alike.
  std::vector<Trace> cached, uncached;
  for (int rep = 0; rep < s.reps && !h.stopped(); ++rep) {
    h.progress(fmt::format("{} rep {}/{}", what, rep + 1, s.reps));
    cached.push_back(generate_cached(e, seq, prompt, T));
    uncached.push_back(generate_uncached(e, seq, prompt, T));
    if (cached.back().ids != warm_c.ids || uncached.back().ids != warm_c.ids) {
      r.ids_identical = false;
      if (r.first_mismatch < 0)
        r.first_mismatch = std::max(first_mismatch(warm_c.ids, cached.back().ids),
                                    first_mismatch(warm_c.ids, uncached.back().ids));
    }
  }
  e.free_sequence(seq);

  std::vector<int64_t> at;
  for (int64_t t = 1; t < T; t *= 2) at.push_back(t);
  at.push_back(T);
  for (int64_t t : at) {
    const size_t i = static_cast<size_t>(t - 1);
    CachePoint p;
    p.n_generated = t;
    std::vector<double> c, n;
    for (const Trace& tr : cached) c.push_back(tr.ms[i]);
    for (const Trace& tr : uncached) n.push_back(tr.ms[i]);
    p.cache_ms = summarize(c);
    p.no_cache_ms = summarize(n);
    p.cache_proj_macs = warm_c.proj_macs[i];
    p.cache_attn_macs = warm_c.attn_macs[i];
    p.no_cache_proj_macs = warm_n.proj_macs[i];
    p.no_cache_attn_macs = warm_n.attn_macs[i];
    r.points.push_back(p);
  }
  return r;
}

std::vector<KvShape> default_kv_shapes(const ModelConfig& c) {
  std::vector<KvShape> v;
  // Lengths around the 16-token block: one token still takes a whole block.
  for (int64_t n : {1, 16, 17, 100, 1000})
    v.push_back({"this model", c.n_layer, c.n_head_kv, c.head_dim, n});
  v.push_back({"SmolLM2-135M", 30, 3, 64, 333});
  v.push_back({"Qwen2.5-0.5B", 24, 2, 64, 1000});
  v.push_back({"Llama-3-8B", 32, 8, 128, 100});
  v.push_back({"Llama-2-7B", 32, 32, 128, 40});
  return v;
}

std::vector<KvRow> run_kv(std::span<const KvShape> shapes, const Hooks& h) {
  std::vector<KvRow> rows;
  for (const KvShape& sh : shapes) {
    if (h.stopped()) break;
    h.progress(fmt::format("kv {} x {} x {} x {} tokens", sh.n_layer, sh.n_head_kv, sh.head_dim,
                           sh.n_tokens));
    PagedKvCache cache(sh.n_layer, sh.n_head_kv, sh.head_dim, sh.n_tokens);
    const int seq = cache.new_sequence();
    const int64_t kv_dim = sh.n_head_kv * sh.head_dim;
    // Token by token, as decode fills it; every slot written (fp16 1.0).
    for (int64_t pos = 0; pos < sh.n_tokens; ++pos) {
      cache.append(seq, 1);
      for (int64_t l = 0; l < sh.n_layer; ++l) {
        std::fill_n(cache.k(l, seq, pos), kv_dim, uint16_t{0x3c00});
        std::fill_n(cache.v(l, seq, pos), kv_dim, uint16_t{0x3c00});
      }
    }
    KvRow r;
    r.shape = sh;
    r.bytes_per_token = cache.bytes_per_token();
    r.n_blocks = (sh.n_tokens + PagedKvCache::kBlockTokens - 1) / PagedKvCache::kBlockTokens;
    r.rounded_tokens = r.n_blocks * PagedKvCache::kBlockTokens;
    const int64_t per_token = 2 * sh.n_layer * sh.n_head_kv * sh.head_dim * 2;
    r.formula_bytes = per_token * r.rounded_tokens;
    r.exact_bytes = per_token * sh.n_tokens;
    r.bytes_allocated = cache.bytes_allocated();
    r.equal = r.bytes_allocated == r.formula_bytes && r.bytes_per_token == per_token;
    rows.push_back(r);
  }
  return rows;
}

}  // namespace barata::bench
