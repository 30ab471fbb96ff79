#include "barata/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "barata/error.h"
#include "barata/half.h"
#include "cpu/dot.h"
#include "cpu/thread_pool.h"

namespace barata {
namespace {

// y = x / sqrt(mean(x^2) + eps) * w; the sum in double, as llama.cpp does.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

}  // namespace

Engine::Engine(const Model& model, EngineOptions opts)
    : model_(model),
      n_ctx_(opts.n_ctx > 0 ? opts.n_ctx : model.config().n_ctx_train),
      pool_(std::make_unique<ThreadPool>(opts.n_threads > 0 ? opts.n_threads
                                                            : ThreadPool::default_threads())),
      cache_(model.config().n_layer, model.config().n_head_kv, model.config().head_dim,
             opts.cache_tokens > 0 ? opts.cache_tokens : n_ctx_) {}

// RoPE angles: theta_i = pos * base^(-2i / rope_dims), in double then rounded.
// Grown as positions are reached (doubling, at most n_ctx): a large -c costs
// nothing up front, and each position's values are the same whenever made.
void Engine::ensure_rope(int64_t n_pos) {
  const ModelConfig& c = model_.config();
  const int64_t half = c.rope_dims / 2;
  const int64_t have = static_cast<int64_t>(rope_cos_.size()) / half;
  if (n_pos <= have) return;
  const int64_t want = std::min(n_ctx_, std::max({n_pos, 2 * have, int64_t{256}}));
  rope_cos_.resize(static_cast<size_t>(want * half));
  rope_sin_.resize(rope_cos_.size());
  for (int64_t p = have; p < want; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double theta =
          static_cast<double>(p) *
          std::pow(static_cast<double>(c.rope_base), -2.0 * static_cast<double>(i) / c.rope_dims);
      rope_cos_[p * half + i] = static_cast<float>(std::cos(theta));
      rope_sin_[p * half + i] = static_cast<float>(std::sin(theta));
    }
  }
}

Engine::~Engine() = default;

int Engine::n_threads() const {
  return pool_->size();
}

void Engine::ensure_scratch(int64_t n) {
  if (n <= scratch_rows_) return;
  const ModelConfig& c = model_.config();
  const auto sz = [n](int64_t w) { return static_cast<size_t>(n * w); };
  x_.resize(sz(c.d_model));
  xn_.resize(sz(std::max(c.d_model, c.d_ff)));
  q_.resize(sz(c.n_head * c.head_dim));
  k_.resize(sz(c.n_head_kv * c.head_dim));
  v_.resize(sz(c.n_head_kv * c.head_dim));
  att_.resize(sz(c.n_head * c.head_dim));
  gate_.resize(sz(c.d_ff));
  up_.resize(sz(c.d_ff));
  out_.resize(sz(c.d_model));
  scratch_rows_ = n;
}

void Engine::prefill(int seq, std::span<const int32_t> tokens, float* logits, bool all_logits) {
  if (tokens.empty()) fail("prefill of an empty prompt");
  const int64_t start = cache_.length(seq);
  if (start + static_cast<int64_t>(tokens.size()) > n_ctx_)
    fail("{} tokens after {} already in the sequence exceed the context of {} tokens",
         tokens.size(), start, n_ctx_);
  std::vector<Row> rows;
  rows.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i)
    rows.push_back({seq, start + static_cast<int64_t>(i), tokens[i]});
  std::vector<int> logit_rows;
  if (all_logits) {
    for (size_t i = 0; i < tokens.size(); ++i) logit_rows.push_back(static_cast<int>(i));
  } else {
    logit_rows.push_back(static_cast<int>(tokens.size() - 1));
  }
  cache_.append(seq, static_cast<int64_t>(tokens.size()));
  forward(rows, logit_rows, logits);
}

void Engine::decode(std::span<const int> seqs, std::span<const int32_t> tokens, float* logits) {
  if (seqs.size() != tokens.size())
    fail("internal: decode of {} sequences with {} tokens", seqs.size(), tokens.size());
  std::vector<Row> rows;
  std::vector<int> logit_rows;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t pos = cache_.length(seqs[i]);
    if (pos + 1 > n_ctx_) fail("sequence {} is full: the context holds {} tokens", seqs[i], n_ctx_);
    rows.push_back({seqs[i], pos, tokens[i]});
    logit_rows.push_back(static_cast<int>(i));
  }
  for (int s : seqs) cache_.append(s, 1);
  forward(rows, logit_rows, logits);
}

void Engine::forward(const std::vector<Row>& rows, const std::vector<int>& logit_rows,
                     float* logits) {
  const ModelConfig& c = model_.config();
  const int64_t T = static_cast<int64_t>(rows.size());
  const int64_t d = c.d_model, q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  ensure_scratch(T);
  int64_t max_pos = 0;
  for (const Row& r : rows) max_pos = std::max(max_pos, r.pos);
  ensure_rope(max_pos + 1);
  ThreadPool& pool = *pool_;
  counts_ = {};

  // Converts the activations once per format that the next weights want.
  auto acts_for = [&](const WeightView& w, const float* x, int64_t k) -> const PreparedActs& {
    PreparedActs& a = w.kernel->act == ActFormat::kQ8 ? acts_q8_ : acts_f32_;
    if (a.data == nullptr || a.n_tokens != T || a.k != k || a.source != x)
      prepare_acts(pool, w.kernel->act, x, T, k, a);
    a.source = x;
    return a;
  };
  auto project = [&](const WeightView& w, const float* x, float* y) {
    matmul(pool, w, acts_for(w, x, w.k), y, w.n_rows);
    counts_.proj_macs += T * w.k * w.n_rows;
  };
  auto invalidate = [&] { acts_f32_.source = acts_q8_.source = nullptr; };

  for (int64_t t = 0; t < T; ++t) model_.embed(rows[t].token, x_.data() + t * d);

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = model_.layers()[static_cast<size_t>(l)];
    for (int64_t t = 0; t < T; ++t)
      rms_norm(x_.data() + t * d, L.attn_norm.data(), xn_.data() + t * d, d, c.norm_eps);
    invalidate();
    project(L.wq, xn_.data(), q_.data());
    project(L.wk, xn_.data(), k_.data());
    project(L.wv, xn_.data(), v_.data());
    if (!L.bq.empty()) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t i = 0; i < q_dim; ++i) q_[t * q_dim + i] += L.bq[i];
        for (int64_t i = 0; i < kv_dim; ++i) {
          k_[t * kv_dim + i] += L.bk[i];
          v_[t * kv_dim + i] += L.bv[i];
        }
      }
    }
    attention(l, rows);
    invalidate();
    project(L.wo, att_.data(), out_.data());
    for (int64_t i = 0; i < T * d; ++i) x_[i] += out_[i];

    for (int64_t t = 0; t < T; ++t)
      rms_norm(x_.data() + t * d, L.ffn_norm.data(), xn_.data() + t * d, d, c.norm_eps);
    invalidate();
    project(L.w_gate, xn_.data(), gate_.data());
    project(L.w_up, xn_.data(), up_.data());
    for (int64_t i = 0; i < T * c.d_ff; ++i) {
      const float g = gate_[i];
      gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];  // SwiGLU: silu(gate) * up
    }
    invalidate();
    project(L.w_down, gate_.data(), out_.data());
    for (int64_t i = 0; i < T * d; ++i) x_[i] += out_[i];
  }

  // Final norm and logits only for the rows that need them.
  const int64_t n_out = static_cast<int64_t>(logit_rows.size());
  for (int64_t i = 0; i < n_out; ++i)
    rms_norm(x_.data() + logit_rows[i] * d, model_.output_norm().data(), xn_.data() + i * d, d,
             c.norm_eps);
  const WeightView& out = model_.output();
  PreparedActs a;
  prepare_acts(pool, out.kernel->act, xn_.data(), n_out, d, a);
  matmul(pool, out, a, logits, out.n_rows);
  counts_.proj_macs += n_out * out.k * out.n_rows;
}

void Engine::attention(int64_t layer, const std::vector<Row>& rows) {
  const ModelConfig& c = model_.config();
  const int64_t T = static_cast<int64_t>(rows.size());
  const int64_t hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  const int64_t half = c.rope_dims / 2;
  const bool neox = c.rope_style == RopeStyle::kNeox;

  // RoPE on q and k, in place. Normal style rotates pairs (2i, 2i+1); NeoX
  // rotates (i, i + rope_dims/2).
  auto rope = [&](float* v, int64_t pos) {
    const float* cs = rope_cos_.data() + pos * half;
    const float* sn = rope_sin_.data() + pos * half;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * cs[i] - x1 * sn[i];
      v[b] = x0 * sn[i] + x1 * cs[i];
    }
  };
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < c.n_head; ++h) rope(q_.data() + t * q_dim + h * hd, rows[t].pos);
    for (int64_t h = 0; h < c.n_head_kv; ++h) rope(k_.data() + t * kv_dim + h * hd, rows[t].pos);
    uint16_t* kc = cache_.k(layer, rows[t].seq, rows[t].pos);
    uint16_t* vc = cache_.v(layer, rows[t].seq, rows[t].pos);
    for (int64_t i = 0; i < kv_dim; ++i) {
      kc[i] = fp32_to_fp16(k_[t * kv_dim + i]);
      vc[i] = fp32_to_fp16(v_[t * kv_dim + i]);
    }
  }

  const int64_t group = c.n_head / c.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  constexpr int64_t B = PagedKvCache::kBlockTokens;
  int64_t macs = 0;
  for (const Row& r : rows) macs += 2 * (r.pos + 1) * hd * c.n_head;
  counts_.attn_macs += macs;

  pool_->parallel_for(T * c.n_head, [&](int64_t i0, int64_t i1, int) {
    thread_local std::vector<float> scores;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / c.n_head, h = i % c.n_head, kvh = h / group;
      const Row& r = rows[static_cast<size_t>(t)];
      const int64_t n = r.pos + 1;
      if (static_cast<int64_t>(scores.size()) < n) scores.resize(static_cast<size_t>(n));
      const float* q = q_.data() + t * q_dim + h * hd;
      float mx = -INFINITY;
      for (int64_t b0 = 0; b0 < n; b0 += B) {
        const uint16_t* kb = cache_.k_block(layer, r.seq, b0) + kvh * hd;
        for (int64_t j = 0; j < std::min(B, n - b0); ++j) {
          const float s = dot_f16_f32(kb + j * kv_dim, q, hd) * scale;
          scores[b0 + j] = s;
          mx = std::max(mx, s);
        }
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      const float inv = 1.0f / sum;
      float* o = att_.data() + t * q_dim + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t b0 = 0; b0 < n; b0 += B) {
        const uint16_t* vb = cache_.v_block(layer, r.seq, b0) + kvh * hd;
        for (int64_t j = 0; j < std::min(B, n - b0); ++j)
          axpy_f16(scores[b0 + j] * inv, vb + j * kv_dim, o, hd);
      }
    }
  });
}

}  // namespace barata
