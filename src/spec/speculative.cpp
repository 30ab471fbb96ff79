#include "barata/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/core.h>

#include <unistd.h>

#include "barata/convert.h"
#include "barata/error.h"
#include "barata/quantize.h"
#include "barata/scheduler.h"

namespace barata {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The distribution a draw at these settings chooses from, normalized.
void distribution(const SamplerOptions& s, std::span<const float> logits, SamplingCandidates& c,
                  Draft::Dist& out) {
  sampling_candidates(s, logits, c);
  out.ids = c.ids;
  out.p.resize(c.w.size());
  for (size_t i = 0; i < c.w.size(); ++i) out.p[i] = c.w[i] / c.total;
}

int32_t draw(const Draft::Dist& d, std::mt19937_64& rng) {
  double r = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  for (size_t i = 0; i < d.ids.size(); ++i) {
    if (r < d.p[i]) return d.ids[i];
    r -= d.p[i];
  }
  return d.ids.back();
}

double prob_of(const Draft::Dist& d, int32_t x) {
  for (size_t i = 0; i < d.ids.size(); ++i)
    if (d.ids[i] == x) return d.p[i];
  return 0.0;
}

// softmax(logits)[x] at temperature 1: the draft's confidence for --draft-p-min.
double softmax_at(std::span<const float> logits, int32_t x) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
  return std::exp(static_cast<double>(logits[static_cast<size_t>(x)] - mx)) / sum;
}

}  // namespace

AutoGamma::AutoGamma(int gmax, double c_prior, double prefill_row_ms)
    : gmax_(gmax),
      c_prior_(c_prior),
      row_ms_(prefill_row_ms),
      verify_(static_cast<size_t>(gmax) + 2) {}

void AutoGamma::outcome(int gamma, int accepted) {
  // Decayed counts: recent verifies weigh more.
  succ_ = succ_ * 0.9 + accepted;
  trials_ = trials_ * 0.9 + accepted + (accepted < gamma ? 1 : 0);
}

double AutoGamma::alpha() const {
  return (succ_ + 2 * 0.8) / (trials_ + 2);
}

double AutoGamma::c() const {
  if (step_.set && draft_.set) return draft_.v / step_.v;
  return c_prior_;
}

// Measured; else the line through (1, 1) and the nearest measured pass;
// else the prefill's cost per row against the step.
double AutoGamma::v(int k) const {
  if (k <= 1) return 1.0;
  if (verify_[static_cast<size_t>(k)].set) return verify_[static_cast<size_t>(k)].v / step_.v;
  int best = -1;
  for (int j = 2; j <= gmax_ + 1; ++j)
    if (verify_[static_cast<size_t>(j)].set && (best < 0 || std::abs(j - k) < std::abs(best - k)))
      best = j;
  double slope = row_ms_ > 0 ? std::min(1.0, row_ms_ / step_.v) : 0.5;
  if (best >= 0) slope = (verify_[static_cast<size_t>(best)].v / step_.v - 1.0) / (best - 1);
  return 1.0 + std::max(slope, 0.0) * (k - 1);
}

// The drafter's pending context (tokens it must read before drafting) in
// target steps: a prefill of that many rows on the draft.
double AutoGamma::catch_up(int64_t pending) const {
  const double per_row = row_ms_ > 0 ? std::min(1.0, row_ms_ / step_.v) : 1.0;
  return static_cast<double>(pending) * c() * per_row;
}

// 0: plain decoding. The first step is plain (it measures the step). The
// next two explore, at the gamma best under an optimistic alpha of 0.9,
// when that would pay over the tokens left 1.5 times over the drafter's
// catch-up (a bad draft then costs a few steps, not a run; two, so that
// one early rejection does not decide the run).
// After that: the gamma with the best predicted rate from the measured
// alpha (prior 0.8, worth two tokens), c and v, when it beats plain by 2%
// and pays for the catch-up; while plain wins, a probe every 32 steps
// where alpha + 0.15 would make speculation pay (the text may have turned
// predictable).
int AutoGamma::choose(int64_t left, int64_t pending, int64_t n_batch) {
  if (!step_.set) return 0;
  const double cc = c();
  const double n = static_cast<double>(std::max<int64_t>(n_batch, 1));
  const auto best_at = [&](double a, double* rate) {
    int best = 0;
    *rate = 1.02;
    for (int g = 1; g <= gmax_; ++g) {
      const double r = (n - 1.0 + expected_tokens_per_verify(a, g)) / (n * (g * cc + v(g + 1)));
      if (r > *rate) {
        best = g;
        *rate = r;
      }
    }
    return best;
  };
  const auto pays = [&](double rate, double times) {
    return static_cast<double>(left) * (1.0 - 1.0 / rate) > times * catch_up(pending);
  };
  double rate = 0;
  if (explores_ < 2) {
    ++explores_;
    const int g = best_at(0.9, &rate);
    if (g > 0 && pays(rate, explores_ == 1 ? 1.5 : 1.0)) return g;
    explores_ = 2;
  }
  const int g = best_at(alpha(), &rate);
  if (g > 0 && pays(rate, 1.0)) {
    since_probe_ = 0;
    return g;
  }
  if (++since_probe_ < 32) return 0;
  since_probe_ = 0;
  const int gp = best_at(std::min(1.0, alpha() + 0.15), &rate);
  return gp > 0 && rate > 1.1 && pays(rate, 2.0) ? std::min(gp, 2) : 0;
}

int32_t speculative_accept(const Draft::Dist& p, const Draft::Dist* q, int32_t x,
                           std::mt19937_64& rng, bool* accepted) {
  const double px = prob_of(p, x);
  const double qx = q ? prob_of(*q, x) : 1.0;
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  if (qx > 0 && u < std::min(1.0, px / qx)) {
    *accepted = true;
    return x;
  }
  *accepted = false;
  // norm(max(0, p - q)) over p's support (where p is 0 the difference is not
  // positive). q by id in one dense array: a search per id would be
  // quadratic in the vocabulary with top-k off.
  std::vector<double> q_of;
  if (q) {
    int32_t top = x;
    for (int32_t id : p.ids) top = std::max(top, id);
    q_of.assign(static_cast<size_t>(top) + 1, 0.0);
    for (size_t i = 0; i < q->ids.size(); ++i)
      if (q->ids[i] <= top) q_of[static_cast<size_t>(q->ids[i])] = q->p[i];
  }
  Draft::Dist r;
  double total = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double qi = q ? q_of[static_cast<size_t>(p.ids[i])] : (p.ids[i] == x ? 1.0 : 0.0);
    const double d = p.p[i] - qi;
    if (d > 0) {
      r.ids.push_back(p.ids[i]);
      r.p.push_back(d);
      total += d;
    }
  }
  if (r.ids.empty() || !(total > 0)) return draw(p, rng);  // p == q: any draw from p is exact
  for (double& v : r.p) v /= total;
  return draw(r, rng);
}

double expected_tokens_per_verify(double alpha, int gamma) {
  if (alpha >= 1.0) return gamma + 1.0;
  return (1.0 - std::pow(alpha, gamma + 1)) / (1.0 - alpha);
}

double predicted_speedup(double alpha, int gamma, double c) {
  return predicted_speedup(alpha, gamma, c, 1.0);
}

double predicted_speedup(double alpha, int gamma, double c, double v) {
  return expected_tokens_per_verify(alpha, gamma) / (gamma * c + v);
}

// ---- the scheduler's speculative mode -----------------------------------------

int32_t spec_choose(const SamplerOptions& o, std::span<const float> logits, SpecSlot& slot) {
  if (o.temperature <= 0.0f) return argmax(logits);
  distribution(o, logits, slot.cand, slot.p);
  return draw(slot.p, slot.rng);
}

int spec_verify(const SamplerOptions& o, const float* logits, int64_t n_vocab, SpecSlot& slot,
                int32_t* next) {
  const bool greedy = o.temperature <= 0.0f;
  const size_t nv = static_cast<size_t>(n_vocab);
  const Draft& d = slot.draft;
  const int g = static_cast<int>(d.tokens.size());
  for (int k = 0; k < g; ++k) {
    const std::span<const float> row(logits + static_cast<size_t>(k) * nv, nv);
    const int32_t x = d.tokens[static_cast<size_t>(k)];
    if (greedy) {
      const int32_t t = argmax(row);
      if (t != x) {
        *next = t;
        return k;
      }
    } else {
      distribution(o, row, slot.cand, slot.p);
      bool ok = false;
      const int32_t t = speculative_accept(
          slot.p, d.q.empty() ? nullptr : &d.q[static_cast<size_t>(k)], x, slot.rng, &ok);
      if (!ok) {
        *next = t;
        return k;
      }
    }
  }
  *next = spec_choose(o, std::span<const float>(logits + static_cast<size_t>(g) * nv, nv), slot);
  return g;  // every drafted token kept, and the bonus token
}

// ---- drafters ---------------------------------------------------------------

ModelDrafter::ModelDrafter(Engine& engine, ModelDrafterOptions opts, std::string name)
    : engine_(engine),
      opts_(opts),
      name_(std::move(name)),
      seq_(engine.new_sequence()),
      logits_(static_cast<size_t>(engine.model().config().n_vocab)),
      rng_(opts.sampling.seed ^ 0x5bd1e995u) {}

ModelDrafter::~ModelDrafter() {
  engine_.free_sequence(seq_);
}

void ModelDrafter::propose(std::span<const int32_t> ctx, int n, Draft& out) {
  out.tokens.clear();
  out.q.clear();
  if (ctx.empty() || n <= 0) return;
  const int64_t n_ctx = engine_.n_ctx();
  if (static_cast<int64_t>(ctx.size()) >= n_ctx) return;  // no room for the draft's context
  // Keep the common prefix, but always run the last token for its logits.
  size_t keep = 0;
  while (keep < cached_.size() && keep + 1 < ctx.size() && cached_[keep] == ctx[keep]) ++keep;
  // Sliding-window layers may have released what going back needs.
  if (!engine_.blocks().can_truncate(seq_, static_cast<int64_t>(keep))) keep = 0;
  engine_.truncate(seq_, static_cast<int64_t>(keep));
  cached_.resize(keep);
  engine_.prefill(seq_, ctx.subspan(keep), logits_.data());
  cached_.assign(ctx.begin(), ctx.end());
  const bool greedy = opts_.sampling.temperature <= 0.0f;
  for (int i = 0; i < n; ++i) {
    int32_t x;
    double px;
    if (greedy) {
      x = argmax(logits_);
      px = opts_.p_min > 0 ? softmax_at(logits_, x) : 1.0;
    } else {
      Draft::Dist q;
      distribution(opts_.sampling, logits_, cand_, q);
      x = draw(q, rng_);
      px = prob_of(q, x);
      out.q.push_back(std::move(q));
    }
    if (px < opts_.p_min) {  // not confident enough: stop drafting (llama.cpp's --draft-p-min)
      if (!greedy) out.q.pop_back();
      break;
    }
    out.tokens.push_back(x);
    if (i + 1 == n || static_cast<int64_t>(cached_.size()) + 1 >= n_ctx) break;
    const int32_t t = x;
    engine_.decode(std::span<const int>(&seq_, 1), std::span<const int32_t>(&t, 1), logits_.data());
    cached_.push_back(x);
  }
}

LookupDrafter::LookupDrafter(int max_ngram, int min_ngram)
    : max_ngram_(max_ngram), min_ngram_(std::max(1, min_ngram)) {
  if (max_ngram_ < min_ngram_) fail("--lookup {}: the n-gram size must be at least 1", max_ngram);
}

std::string LookupDrafter::describe() const {
  return fmt::format("lookup (n-grams {}..{})", max_ngram_, min_ngram_);
}

int64_t ModelDrafter::pending(std::span<const int32_t> ctx) const {
  size_t keep = 0;
  while (keep < cached_.size() && keep < ctx.size() && cached_[keep] == ctx[keep]) ++keep;
  return static_cast<int64_t>(ctx.size() - keep);
}

void LookupDrafter::propose(std::span<const int32_t> ctx, int n, Draft& out) {
  out.tokens.clear();
  out.q.clear();
  const int64_t len = static_cast<int64_t>(ctx.size());
  for (int ng = max_ngram_; ng >= min_ngram_; --ng) {
    if (len <= ng) continue;
    const auto tail = ctx.subspan(static_cast<size_t>(len - ng));
    // The most recent earlier occurrence with at least one token after it.
    for (int64_t j = len - ng - 1; j >= 0; --j) {
      if (!std::equal(tail.begin(), tail.end(), ctx.begin() + j)) continue;
      const int64_t from = j + ng;
      const int64_t to = std::min(len, from + n);
      out.tokens.assign(ctx.begin() + from, ctx.begin() + to);
      return;
    }
  }
}

void check_same_tokens(const Tokenizer& target, const Model& target_model, const Tokenizer& draft,
                       const Model& draft_model) {
  const int64_t tv = target_model.config().n_vocab, dv = draft_model.config().n_vocab;
  if (tv != dv)
    fail("the draft's vocabulary has {} entries but the target's {}: they must be the same", dv,
         tv);
  const int32_t n = std::min(target.n_vocab(), draft.n_vocab());
  for (int32_t id = 0; id < n; ++id)
    if (target.token_text(id) != draft.token_text(id))
      fail("the draft's token {} is {:?} but the target's is {:?}: not the same vocabulary", id,
           draft.token_text(id), target.token_text(id));
  if (target.n_vocab() != draft.n_vocab())
    fail("the draft's tokenizer has {} tokens but the target's {}: not the same vocabulary",
         draft.n_vocab(), target.n_vocab());
}

Model quantized_copy(const std::filesystem::path& path, const std::string& scheme, int threads) {
  QuantOptions qo;
  qo.type = parse_quant_type(scheme);
  qo.threads = std::max(threads, 1);
  const SourceModel src = load_source(path);
  static int counter = 0;
  const std::filesystem::path tmp =
      std::filesystem::temp_directory_path() /
      fmt::format("barata-self-draft-{}-{}.gguf", ::getpid(), counter++);
  quantize_model(src, qo, tmp);
  struct Remove {
    std::filesystem::path p;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    }
  } remove{tmp};
  return Model::load(tmp);
}

// ---- the loop ---------------------------------------------------------------

namespace {

// A caller's drafter lent to the scheduler for one request.
class BorrowedDrafter final : public Drafter {
 public:
  explicit BorrowedDrafter(Drafter& d) : d_(d) {}
  void propose(std::span<const int32_t> ctx, int n, Draft& out) override {
    d_.propose(ctx, n, out);
  }
  std::string describe() const override { return d_.describe(); }
  bool uses_model() const override { return d_.uses_model(); }
  int64_t pending(std::span<const int32_t> ctx) const override { return d_.pending(ctx); }

 private:
  Drafter& d_;
};

}  // namespace

std::unique_ptr<Drafter> borrow_drafter(Drafter& d) {
  return std::make_unique<BorrowedDrafter>(d);
}

void finish_spec_stats(SpecStats& st, int draft_max, bool uses_model) {
  int64_t trials = 0;
  std::vector<double> vsum(static_cast<size_t>(std::max(draft_max, 1)) + 2, 0.0);
  std::vector<int> vn(vsum.size(), 0);
  for (const SpecStep& s : st.steps) {
    if (s.gamma == 0) continue;
    trials += s.accepted + (s.accepted < s.gamma ? 1 : 0);
    const size_t k = std::min(static_cast<size_t>(s.gamma) + 1, vsum.size() - 1);
    vsum[k] += s.verify_ms;
    ++vn[k];
  }
  st.alpha = trials ? static_cast<double>(st.accepted) / static_cast<double>(trials) : 0.0;
  st.target_step_ms = st.plain_steps ? st.plain_ms / static_cast<double>(st.plain_steps) : 0.0;
  st.verify_cost.assign(vsum.size(), 0.0);
  st.c = 0;
  if (st.target_step_ms > 0) {
    for (size_t k = 2; k < vsum.size(); ++k)
      if (vn[k]) st.verify_cost[k] = vsum[k] / vn[k] / st.target_step_ms;
    if (st.drafted && uses_model)
      st.c = st.draft_ms / static_cast<double>(st.drafted) / st.target_step_ms;
  }
}

// One request on the scheduler, a batch of one: its speculative mode does
// the drafting, verifying and --draft-auto; this gathers the timings.
SpecResult speculative_generate(Engine& target, Drafter& drafter, std::span<const int32_t> prompt,
                                const SpeculativeOptions& o,
                                const std::function<bool(int32_t)>& on_token) {
  if (o.sampling.repeat_penalty != 1.0f)
    fail("speculative decoding does not take a repetition penalty (--repeat-penalty {})",
         o.sampling.repeat_penalty);
  if (o.draft_max < 1 || o.draft_max > 64) fail("--draft-max {} is outside [1, 64]", o.draft_max);
  if (prompt.empty()) fail("the prompt is empty");
  const int64_t n_ctx = target.n_ctx();
  if (static_cast<int64_t>(prompt.size()) >= n_ctx)
    fail("the prompt has {} tokens but the context holds {}", prompt.size(), n_ctx);

  SpecResult res;
  EngineSteps steps(target);
  SchedulerOptions so;
  so.slots = 1;
  so.max_batch_tokens = n_ctx;  // the prompt in one call
  so.prefix_cache = false;
  so.is_eog = o.is_eog;
  so.drafter_for = [&drafter](const Request&) { return borrow_drafter(drafter); };
  so.draft_max = o.draft_max;
  so.draft_min = std::min(o.draft_min, 64);
  so.draft_auto = o.auto_gamma;
  so.draft_c_prior = o.c_prior;
  Scheduler sch(steps, so);

  Request r;
  r.prompt.assign(prompt.begin(), prompt.end());
  r.sampling = o.sampling;
  r.max_tokens = std::max(o.n_predict, 0);
  r.prefill_only = o.n_predict <= 0;
  r.spec_stats = &res.stats;
  if (o.keep_sequence) r.kv_seq = res.seq = target.new_sequence();
  bool interrupted = false;
  sch.on_token = [&](const Sequence&, int32_t t) {
    if (interrupted) return;  // the rest of a verify pass after the caller stopped
    res.generated.push_back(t);
    if (on_token && !on_token(t)) interrupted = true;
  };
  const int id = sch.submit(std::move(r));
  bool first = true;
  auto t_decode = Clock::now();
  while (!sch.idle()) {
    if (interrupted) {
      sch.cancel(id);
      break;
    }
    const StepInfo info = sch.step();
    if (first) {
      res.prefill_ms = info.ms;
      t_decode = Clock::now();
      first = false;
    }
  }
  res.decode_ms = ms_since(t_decode);
  const Sequence& q = sch.sequence(id);
  if (q.status == SeqStatus::kFailed) fail("{}", q.error);
  res.finish = interrupted ? FinishReason::kCancelled : q.finish;
  finish_spec_stats(res.stats, o.draft_max, drafter.uses_model());
  return res;
}

}  // namespace barata
