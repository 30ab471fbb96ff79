// A small random-weight model written by the test (llama and qwen2 shapes:
// GQA, q/k/v biases, tied and untied embeddings, odd sizes), run by the
// engine and by a plain float64 forward pass written here. The reference
// rounds K and V to fp16 as the engine's cache does, so what remains is float
// vs double arithmetic.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "barata/engine.h"
#include "barata/gguf.h"
#include "barata/half.h"
#include "cpu/matmul.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace barata {
namespace {

using test::make_model;
using test::Mat;
using test::RefLayer;
using test::Shape;
using test::Synthetic;

// What the engine feeds kernels of quantized weights: activations rounded to
// 8 bits in blocks of 32 (see matmul.h). The reference does the same.
bool g_q8_acts = false;

std::vector<double> q8_round(const std::vector<double>& x) {
  std::vector<float> f(x.begin(), x.end());
  std::vector<BlockQ8Act> q(f.size() / 32);
  quantize_row_q8_act(f.data(), q.data(), static_cast<int64_t>(f.size()));
  std::vector<double> out(x.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = double(q[i / 32].d) * q[i / 32].q[i % 32];
  return out;
}

std::vector<double> matvec(const Mat& w, const std::vector<double>& x_in, int64_t rows) {
  const std::vector<double> x = g_q8_acts ? q8_round(x_in) : x_in;
  const int64_t k = static_cast<int64_t>(x.size());
  std::vector<double> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += w[r * k + j] * x[j];
    y[r] = s;
  }
  return y;
}

std::vector<double> rms(const std::vector<double>& x, const std::vector<double>& g) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double sc = 1.0 / std::sqrt(ss / x.size() + 1e-5);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * sc * g[i];
  return y;
}

double fp16_round(double v) {
  return fp16_to_fp32(fp32_to_fp16(static_cast<float>(v)));
}

// Logits (n_tokens, n_vocab) of every position.
std::vector<std::vector<double>> reference(const Shape& s, const Synthetic& m,
                                           const std::vector<int32_t>& toks) {
  const int64_t T = static_cast<int64_t>(toks.size()), d = s.d_model, hd = s.head_dim;
  const int64_t qd = s.n_head * hd, kvd = s.n_head_kv * hd;
  std::vector<std::vector<double>> x(T);
  for (int64_t t = 0; t < T; ++t)
    x[t].assign(m.embd.begin() + toks[t] * d, m.embd.begin() + (toks[t] + 1) * d);
  auto rope = [&](double* v, int64_t pos) {
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double th = pos * std::pow(10000.0, -2.0 * i / hd);
      const int64_t a = s.arch == "qwen2" ? i : 2 * i,
                    b = s.arch == "qwen2" ? i + hd / 2 : 2 * i + 1;
      const double x0 = v[a], x1 = v[b];
      v[a] = x0 * std::cos(th) - x1 * std::sin(th);
      v[b] = x0 * std::sin(th) + x1 * std::cos(th);
    }
  };
  for (const RefLayer& L : m.layers) {
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      const auto xn = rms(x[t], L.attn_norm);
      q[t] = matvec(L.wq, xn, qd);
      k[t] = matvec(L.wk, xn, kvd);
      v[t] = matvec(L.wv, xn, kvd);
      if (s.bias) {
        for (int64_t i = 0; i < qd; ++i) q[t][i] += L.bq[i];
        for (int64_t i = 0; i < kvd; ++i) k[t][i] += L.bk[i], v[t][i] += L.bv[i];
      }
      for (int64_t h = 0; h < s.n_head; ++h) rope(q[t].data() + h * hd, t);
      for (int64_t h = 0; h < s.n_head_kv; ++h) rope(k[t].data() + h * hd, t);
      for (auto& e : k[t]) e = fp16_round(e);
      for (auto& e : v[t]) e = fp16_round(e);
    }
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<size_t>(qd), 0.0);
      for (int64_t h = 0; h < s.n_head; ++h) {
        const int64_t kh = h / (s.n_head / s.n_head_kv);
        std::vector<double> sc(static_cast<size_t>(t + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q[t][h * hd + i] * k[j][kh * hd + i];
          sc[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (auto& e : sc) sum += e = std::exp(e - mx);
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < hd; ++i) att[h * hd + i] += sc[j] / sum * v[j][kh * hd + i];
      }
      const auto o = matvec(L.wo, att, d);
      for (int64_t i = 0; i < d; ++i) x[t][i] += o[i];
      const auto xn = rms(x[t], L.ffn_norm);
      auto g = matvec(L.wg, xn, s.d_ff);
      const auto u = matvec(L.wu, xn, s.d_ff);
      for (int64_t i = 0; i < s.d_ff; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const auto dn = matvec(L.wd, g, d);
      for (int64_t i = 0; i < d; ++i) x[t][i] += dn[i];
    }
  }
  std::vector<std::vector<double>> logits(T);
  for (int64_t t = 0; t < T; ++t) logits[t] = matvec(m.out, rms(x[t], m.out_norm), s.n_vocab);
  return logits;
}

class EngineSynthetic : public ::testing::TestWithParam<Shape> {};

TEST_P(EngineSynthetic, LogitsMatchFloat64Reference) {
  const Shape& s = GetParam();
  const Synthetic m = make_model(s, 42);

  const Model model = Model::from_gguf(GgufFile::from_memory(m.gguf, s.arch + ".gguf"));
  EXPECT_EQ(model.config().tied_embeddings, s.tied);
  EXPECT_EQ(model.config().qkv_bias, s.bias);
  Engine engine(model, {.n_threads = 2, .n_ctx = 64});
  std::mt19937 rng(7);
  std::vector<int32_t> toks(23);
  for (auto& t : toks) t = static_cast<int32_t>(rng() % s.n_vocab);
  g_q8_acts = dtype_traits(s.wtype).is_quantized;
  const auto ref = reference(s, m, toks);

  const int64_t V = s.n_vocab;
  // What remains is fp32 against fp64 arithmetic (and, for quantized weights,
  // the rare activation that rounds to the other 8-bit level because of it).
  const double tol = dtype_traits(s.wtype).is_quantized ? 2e-3 : 2e-4;
  auto check = [&](const float* got, int64_t t, const char* path) {
    double scale = 0;
    for (double v : ref[t]) scale = std::max(scale, std::fabs(v));
    double worst = 0;
    for (int64_t i = 0; i < V; ++i) worst = std::max(worst, std::fabs(got[i] - ref[t][i]));
    EXPECT_LT(worst, tol * scale) << path << " position " << t << ": worst " << worst / scale
                                  << " of the largest |logit| " << scale;
  };
  // Prefill of the whole sequence, every position's logits.
  std::vector<float> all(static_cast<size_t>(V * toks.size()));
  int seq = engine.new_sequence();
  engine.prefill(seq, toks, all.data(), true);
  for (int64_t t = 0; t < static_cast<int64_t>(toks.size()); ++t)
    check(all.data() + t * V, t, "prefill");
  // Prefill of 5, then decode one by one, in two interleaved sequences (batch of 2).
  engine.free_sequence(seq);
  const int a = engine.new_sequence(), b = engine.new_sequence();
  std::vector<float> lg(static_cast<size_t>(2 * V));
  engine.prefill(a, std::span(toks).first(5), lg.data());
  engine.prefill(b, std::span(toks).first(5), lg.data() + V);
  check(lg.data(), 4, "prefill-5");
  for (size_t t = 5; t < toks.size(); ++t) {
    const int seqs[2] = {a, b};
    const int32_t tt[2] = {toks[t], toks[t]};
    engine.decode(seqs, tt, lg.data());
    check(lg.data(), static_cast<int64_t>(t), "decode");
    for (int64_t i = 0; i < V; ++i) ASSERT_EQ(lg[i], lg[V + i]) << "batch rows differ";
  }
  EXPECT_EQ(engine.kv_bytes_per_token(), 2 * s.n_layer * s.n_head_kv * s.head_dim * 2);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EngineSynthetic,
    ::testing::Values(
        Shape{"llama", 2, 48, 6, 2, 8, 100, 77, false, false, DType::F32},  // GQA 3:1, odd d_ff
        Shape{"llama", 2, 64, 4, 4, 16, 96, 50, true, false, DType::F16},   // MHA, tied
        Shape{"qwen2", 2, 64, 4, 2, 16, 160, 61, true, true, DType::F32},   // NeoX, biases, tied
        Shape{"qwen2", 1, 64, 2, 1, 40, 128, 40, false, true, DType::F32},  // head_dim != d/heads
        Shape{"llama", 2, 64, 4, 2, 16, 128, 64, false, false, DType::Q8_0},
        Shape{"llama", 2, 64, 4, 2, 16, 128, 64, false, false, DType::Q4_1},
        Shape{"qwen2", 2, 64, 4, 2, 16, 128, 64, true, true, DType::Q4_0}),
    [](const auto& info) {
      const Shape& s = info.param;
      return s.arch + "_" + std::to_string(info.index) + "_" + dtype_name(s.wtype);
    });

}  // namespace
}  // namespace barata
