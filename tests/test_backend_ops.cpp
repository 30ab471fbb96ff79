// Every op of the Backend seam, on every backend this build has, against a
// float64 reference, in the way llama.cpp's test-backend-ops works: random
// inputs on small odd shapes (head_dim 64 and 128, 1 to 8 KV heads, d_ff not
// a multiple of 32, lengths crossing 16-token block edges, a prompt appended
// to a cache that is not empty, two sequences in one batch), each dtype with
// its own error bound. Without a GPU the CUDA instances skip with the
// driver's reason, or fail when BARATA_REQUIRE_GPU=1.
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "barata/backend.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "backend_factory.h"
#include "sanitizer.h"
#include "barata/half.h"
#include "barata/moe.h"
#include "synthetic_model.h"

namespace barata {
namespace {

using test::Shape;
using test::Synthetic;

// Normalised mean squared error, llama.cpp's measure for ops whose kernels
// round differently from the reference.
double nmse(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? num / den : num;
}

double max_rel(const std::vector<float>& got, const std::vector<double>& ref) {
  double scale = 0, err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::fabs(ref[i]));
    err = std::max(err, std::fabs(got[i] - ref[i]));
  }
  return scale > 0 ? err / scale : err;
}

// The matmul bound of a weight type on a backend. CPU float weights take
// fp32 activations; quantized ones take 8-bit activations (blocks of 32,
// what llama.cpp does). The CUDA backend's GEMM path rounds activations to
// fp16 for cuBLAS.
double matmul_bound(DeviceKind d, DType t) {
  const bool is_float = t == DType::F32 || t == DType::F16 || t == DType::BF16;
  if (!is_float) return 5e-4;
  return d == DeviceKind::kCpu ? 1e-9 : 2e-6;
}

class BackendOps : public ::testing::TestWithParam<std::tuple<DeviceKind, Shape>> {
 protected:
  void SetUp() override {
    device_ = std::get<0>(GetParam());
    shape_ = std::get<1>(GetParam());
    try {
      be_ = test::make_test_backend(device_, 2);
    } catch (const Error& e) {
      const char* require = std::getenv("BARATA_REQUIRE_GPU");
      if (device_ == DeviceKind::kCuda && !(require && std::string(require) == "1"))
        GTEST_SKIP() << "CUDA backend unavailable: " << e.what();
      FAIL() << e.what();
    }
    syn_ = test::make_model(shape_, 1234);
    model_ = std::make_unique<Model>(Model::from_gguf(GgufFile::from_memory(syn_.gguf, "ops")));
    const ModelConfig& c = model_->config();
    layout_ = KvLayout::uniform(c.n_layer, c.n_head_kv * c.head_dim);
    blocks_ = std::make_unique<KvBlockManager>(kBlocks);
    be_->prepare(*model_, layout_, kBlocks, kCtx);
  }

  std::vector<float> random(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = nd(rng_);
    return v;
  }
  std::vector<float> upload(Act a, int64_t width, float scale = 1.0f) {
    std::vector<float> v = random(batch_.size() * width, scale);
    be_->to_device(be_->act(a), v.data(), static_cast<int64_t>(v.size()));
    return v;
  }
  std::vector<float> download(Act a, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    be_->to_host(v.data(), be_->act(a), n);
    return v;
  }

  // Plans the batch against the cache and begins it on the backend.
  void start(const std::vector<std::pair<int, int64_t>>& rows) {
    batch_.clear();
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(shape_.n_vocab - 1));
    for (const auto& [seq, pos] : rows) batch_.add(tok(rng_), pos, seq, true);
    std::vector<KvBlockManager::Copy> copies;
    plan_batch(batch_, *blocks_, kCtx, shape_.n_vocab, &copies);
    be_->copy_kv_blocks(copies);
    be_->begin(batch_);
  }

  void check_all_ops();

  static constexpr int64_t kBlocks = 16, kCtx = 128;
  DeviceKind device_{};
  Shape shape_{};
  std::unique_ptr<Backend> be_;
  Synthetic syn_;
  std::unique_ptr<Model> model_;
  KvLayout layout_;
  std::unique_ptr<KvBlockManager> blocks_;
  Batch batch_;
  std::mt19937 rng_{99};
};

std::vector<double> ref_matvec(const test::Mat& w, const std::vector<float>& x, int64_t t,
                               int64_t k, int64_t rows) {
  std::vector<double> y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += w[r * k + j] * x[t * k + j];
    y[r] = s;
  }
  return y;
}

std::vector<double> ref_rms(const float* x, const std::vector<float>& g, int64_t d, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < d; ++i) ss += double(x[i]) * x[i];
  const double sc = 1.0 / std::sqrt(ss / d + eps);
  std::vector<double> y(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) y[i] = x[i] * sc * g[i];
  return y;
}

void BackendOps::check_all_ops() {
  const ModelConfig& c = model_->config();
  const int64_t T = batch_.size(), d = c.d_model, hd = c.head_dim;
  const int64_t qd = c.n_head * hd, kvd = c.n_head_kv * hd;
  const LayerWeights& L = model_->layers()[0];
  const test::RefLayer& R = syn_.layers[0];

  {
    SCOPED_TRACE("embed");
    be_->embed(be_->act(Act::kX));
    const auto x = download(Act::kX, T * d);
    std::vector<double> ref;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < d; ++j) ref.push_back(syn_.embd[batch_.tokens[t] * d + j]);
    // Every backend reads every type's rows exactly.
    EXPECT_LE(max_rel(x, ref), 1e-6);
  }
  {
    SCOPED_TRACE("rms_norm");
    const auto x = upload(Act::kX, d, 3.0f);
    be_->rms_norm(be_->act(Act::kX), L.attn_norm, be_->act(Act::kXn), d);
    const auto y = download(Act::kXn, T * d);
    std::vector<double> ref;
    for (int64_t t = 0; t < T; ++t) {
      const auto r = ref_rms(x.data() + t * d, L.attn_norm, d, c.norm_eps);
      ref.insert(ref.end(), r.begin(), r.end());
    }
    EXPECT_LE(max_rel(y, ref), 1e-5);
  }
  const struct {
    const char* name;
    const WeightDesc& w;
    const test::Mat& ref;
    Act in, out;
  } mats[] = {
      {"wq", L.wq, R.wq, Act::kXn, Act::kQ},          {"wk", L.wk, R.wk, Act::kXn, Act::kK},
      {"wv", L.wv, R.wv, Act::kXn, Act::kV},          {"wo", L.wo, R.wo, Act::kAtt, Act::kOut},
      {"gate", L.w_gate, R.wg, Act::kXn, Act::kGate}, {"up", L.w_up, R.wu, Act::kXn, Act::kUp},
      {"down", L.w_down, R.wd, Act::kGate, Act::kOut}};
  for (const auto& m : mats) {
    SCOPED_TRACE(std::string("matmul ") + m.name + " " + dtype_name(m.w.type));
    const auto x = upload(m.in, m.w.k);
    be_->matmul(m.w, be_->act(m.in), be_->act(m.out));
    const auto y = download(m.out, T * m.w.n_rows);
    std::vector<double> ref;
    for (int64_t t = 0; t < T; ++t) {
      const auto r = ref_matvec(m.ref, x, t, m.w.k, m.w.n_rows);
      ref.insert(ref.end(), r.begin(), r.end());
    }
    EXPECT_LE(nmse(y, ref), matmul_bound(device_, m.w.type));
  }
  if (!L.bq.empty()) {
    SCOPED_TRACE("add_bias");
    const auto y0 = upload(Act::kQ, qd);
    be_->add_bias(be_->act(Act::kQ), L.bq);
    const auto y = download(Act::kQ, T * qd);
    std::vector<double> ref;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < qd; ++i) ref.push_back(double(y0[t * qd + i]) + L.bq[i]);
    EXPECT_LE(max_rel(y, ref), 1e-6);
  }
  {
    SCOPED_TRACE("swiglu");
    const auto g = upload(Act::kGate, c.d_ff, 2.0f);
    const auto u = upload(Act::kUp, c.d_ff);
    be_->swiglu(be_->act(Act::kGate), be_->act(Act::kUp), T * c.d_ff);
    const auto y = download(Act::kGate, T * c.d_ff);
    std::vector<double> ref;
    for (size_t i = 0; i < g.size(); ++i)
      ref.push_back(g[i] / (1.0 + std::exp(-double(g[i]))) * u[i]);
    EXPECT_LE(max_rel(y, ref), 1e-6);
  }
  {
    SCOPED_TRACE("add");
    const auto x = upload(Act::kX, d);
    const auto o = upload(Act::kOut, d);
    be_->add(be_->act(Act::kX), be_->act(Act::kOut), T * d);
    const auto y = download(Act::kX, T * d);
    std::vector<double> ref;
    for (size_t i = 0; i < x.size(); ++i) ref.push_back(double(x[i]) + o[i]);
    EXPECT_LE(max_rel(y, ref), 1e-7);
  }
  {
    SCOPED_TRACE("rope_kv");
    const auto q = upload(Act::kQ, qd);
    const auto k = upload(Act::kK, kvd);
    const auto v = upload(Act::kV, kvd);
    be_->rope_kv(0, be_->act(Act::kQ), be_->act(Act::kK), be_->act(Act::kV));
    const auto qr = download(Act::kQ, T * qd);
    const int64_t half = c.rope_dims / 2;
    const bool neox = c.rope_style == RopeStyle::kNeox;
    auto rope = [&](const float* in, int64_t pos, std::vector<double>& out) {
      std::vector<double> r(in, in + hd);
      for (int64_t i = 0; i < half; ++i) {
        const double th = pos * std::pow(double(c.rope_base), -2.0 * i / c.rope_dims);
        const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        r[a] = in[a] * std::cos(th) - in[b] * std::sin(th);
        r[b] = in[a] * std::sin(th) + in[b] * std::cos(th);
      }
      out.insert(out.end(), r.begin(), r.end());
    };
    std::vector<double> qref;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < c.n_head; ++h)
        rope(q.data() + t * qd + h * hd, batch_.positions[t], qref);
    EXPECT_LE(max_rel(qr, qref), 1e-5);
    // The cache holds the rotated k and the plain v, in fp16.
    double worst = 0;
    std::vector<uint16_t> kc(static_cast<size_t>(kvd)), vc(kc.size());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> kref;
      for (int64_t h = 0; h < c.n_head_kv; ++h)
        rope(k.data() + t * kvd + h * hd, batch_.positions[t], kref);
      be_->kv_to_host(0, 0, batch_.rows[t].slot, reinterpret_cast<uint8_t*>(kc.data()));
      be_->kv_to_host(0, 1, batch_.rows[t].slot, reinterpret_cast<uint8_t*>(vc.data()));
      for (int64_t i = 0; i < kvd; ++i) {
        worst =
            std::max(worst, std::fabs(fp16_to_fp32(kc[i]) - kref[i]) / (std::fabs(kref[i]) + 1e-3));
        worst = std::max(worst, std::fabs(fp16_to_fp32(vc[i]) - v[t * kvd + i]) /
                                    (std::fabs(v[t * kvd + i]) + 1e-3));
      }
    }
    EXPECT_LE(worst, 1.0 / 1024) << "K/V in the cache are not the fp16 of the rotated k and of v";
  }
  {
    SCOPED_TRACE("attention");
    const float* q_dev = be_->act(Act::kQ);
    be_->attention(0, q_dev, be_->act(Act::kAtt));
    const auto q = download(Act::kQ, T * qd);
    const auto out = download(Act::kAtt, T * qd);
    std::vector<double> ref;
    const int64_t group = c.n_head / c.n_head_kv;
    std::vector<uint16_t> kc(static_cast<size_t>(kvd)), vc(kc.size());
    for (int64_t t = 0; t < T; ++t) {
      const BatchRowMeta& r = batch_.rows[t];
      const std::vector<int32_t>& table = blocks_->table(r.seq);
      const int64_t n = r.pos + 1;
      std::vector<std::vector<double>> K(n), V(n);
      for (int64_t p = 0; p < n; ++p) {
        const int32_t slot =
            table[p / kKvBlockTokens] * int32_t(kKvBlockTokens) + p % kKvBlockTokens;
        be_->kv_to_host(0, 0, slot, reinterpret_cast<uint8_t*>(kc.data()));
        be_->kv_to_host(0, 1, slot, reinterpret_cast<uint8_t*>(vc.data()));
        for (int64_t i = 0; i < kvd; ++i) {
          K[p].push_back(fp16_to_fp32(kc[i]));
          V[p].push_back(fp16_to_fp32(vc[i]));
        }
      }
      for (int64_t h = 0; h < c.n_head; ++h) {
        const int64_t kh = h / group;
        std::vector<double> s(n);
        double mx = -1e300;
        for (int64_t p = 0; p < n; ++p) {
          double acc = 0;
          for (int64_t i = 0; i < hd; ++i) acc += q[t * qd + h * hd + i] * K[p][kh * hd + i];
          s[p] = acc / std::sqrt(double(hd));
          mx = std::max(mx, s[p]);
        }
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int64_t i = 0; i < hd; ++i) {
          double o = 0;
          for (int64_t p = 0; p < n; ++p) o += s[p] / sum * V[p][kh * hd + i];
          ref.push_back(o);
        }
      }
    }
    EXPECT_LE(max_rel(out, ref), 1e-5);
  }
  {
    SCOPED_TRACE("logits");
    const auto x = upload(Act::kX, d);
    std::vector<float> lg(static_cast<size_t>(batch_.logit_rows.size() * c.n_vocab));
    be_->logits(be_->act(Act::kX), lg.data());
    std::vector<double> ref;
    std::vector<float> xn;
    for (int32_t row : batch_.logit_rows) {
      const auto n = ref_rms(x.data() + row * d, model_->output_norm(), d, c.norm_eps);
      xn.assign(n.begin(), n.end());
      const auto r = ref_matvec(syn_.out, xn, 0, d, c.n_vocab);
      ref.insert(ref.end(), r.begin(), r.end());
    }
    EXPECT_LE(nmse(lg, ref), matmul_bound(device_, model_->output().type));
  }
}

TEST_P(BackendOps, EveryOpAgainstFloat64) {
  const int a = blocks_->new_sequence();
  const int b = blocks_->new_sequence();
  std::vector<std::pair<int, int64_t>> rows;
  // A prompt of 20 tokens: one full block and part of the next.
  for (int64_t p = 0; p < 20; ++p) rows.push_back({a, p});
  {
    SCOPED_TRACE("prefill of 20 tokens");
    start(rows);
    check_all_ops();
  }
  // Appended to a cache that is not empty, across the block edge at 32, and
  // a second sequence's prompt in the same batch.
  rows.clear();
  for (int64_t p = 20; p < 38; ++p) rows.push_back({a, p});
  for (int64_t p = 0; p < 3; ++p) rows.push_back({b, p});
  {
    SCOPED_TRACE("prefill appended, two sequences");
    start(rows);
    check_all_ops();
  }
  // Decode: one row per sequence.
  {
    SCOPED_TRACE("decode of two sequences");
    start({{a, 38}, {b, 3}});
    check_all_ops();
  }
  {
    SCOPED_TRACE("decode of one sequence at a block edge");
    start({{b, 4}});
    check_all_ops();
  }
}

// A batch that does not fit is refused before anything changes.
TEST_P(BackendOps, RefusedBatchChangesNothing) {
  const int a = blocks_->new_sequence();
  start({{a, 0}, {a, 1}});
  const int64_t in_use = blocks_->blocks_in_use();
  Batch bad;
  bad.add(1, 2, a, true);
  bad.add(1, 4, a, true);  // a gap
  std::vector<KvBlockManager::Copy> copies;
  EXPECT_THROW(plan_batch(bad, *blocks_, kCtx, shape_.n_vocab, &copies), Error);
  Batch big;
  for (int64_t p = 2; p < 2 + kBlocks * kKvBlockTokens; ++p) big.add(1, p, a, false);
  EXPECT_THROW(plan_batch(big, *blocks_, 1 << 20, shape_.n_vocab, &copies), Error);
  Batch oov;
  oov.add(static_cast<int32_t>(shape_.n_vocab), 2, a, true);
  EXPECT_THROW(plan_batch(oov, *blocks_, kCtx, shape_.n_vocab, &copies), Error);
  EXPECT_EQ(blocks_->length(a), 2);
  EXPECT_EQ(blocks_->blocks_in_use(), in_use);
  EXPECT_TRUE(copies.empty());
}

const Shape kShapes[] = {
    // arch, layers, d_model, heads, kv heads, head_dim, d_ff, vocab, tied, bias, type
    {"llama", 1, 64, 4, 1, 64, 100, 77, false, false, DType::F32},  // MQA, d_ff odd
    {"qwen2", 1, 128, 8, 8, 128, 96, 50, true, true, DType::F16},   // MHA, head_dim 128
    {"llama", 1, 64, 8, 2, 64, 100, 61, true, false, DType::BF16},  // GQA 4:1
    {"llama", 1, 64, 8, 2, 64, 160, 64, false, false, DType::Q8_0},
    {"qwen2", 1, 64, 6, 3, 64, 128, 64, true, true, DType::Q4_0},  // NeoX, biases
    {"llama", 1, 64, 4, 4, 128, 64, 40, false, false, DType::Q4_1},
    {"llama", 1, 256, 8, 8, 32, 256, 64, false, false, DType::Q4_K},  // 8 KV heads, K-quant
    {"qwen2", 1, 256, 8, 2, 32, 512, 50, true, true, DType::Q5_K},
    {"llama", 1, 256, 4, 1, 64, 256, 77, false, false, DType::Q6_K},
    {"llama", 1, 64, 4, 2, 32, 96, 61, false, false, DType::Q5_0},
    {"qwen2", 1, 64, 4, 4, 32, 128, 64, true, true, DType::Q5_1},
    {"llama", 1, 64, 8, 2, 64, 160, 77, false, false, DType::IQ4_NL},
    {"llama", 1, 64, 4, 1, 64, 100, 77, false, false, DType::I8_TENSOR},  // d_ff odd
    {"qwen2", 1, 64, 4, 2, 32, 96, 50, true, true, DType::I8_ROW},
    {"llama", 1, 64, 4, 2, 32, 96, 61, false, false, DType::I4_TENSOR},
    {"llama", 1, 64, 4, 2, 32, 96, 64, true, false, DType::I4_ROW},
    {"llama", 1, 64, 4, 2, 32, 192, 77, false, false, DType::I4_G128},  // short last group
    {"qwen2", 1, 64, 4, 2, 32, 192, 64, false, true, DType::NF4_B64},
};

// ---- the CUDA matmul kernels, by type and width ---------------------------------

// Each weight type through both CUDA matmul paths, the skinny kernels (gemv,
// qmm; BARATA_CUDA_QMM_MAX=64) and dequant + cuBLAS (0), at batch widths 1, 3,
// 8 and 64, on odd row counts (77 vocabulary rows, d_ff 192 or 256) with k at
// the type's block multiples (a short int4-g128 group included), against the
// float64 product of the exactly dequantized weights and against the CPU
// backend's matmul on the same inputs. Also checks the kernel each (type,
// width) reports having run.
class CudaMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(CudaMatmul, EveryWidthBothPaths) {
  const DType type = GetParam();
  const bool big_blocks = dtype_traits(type).block_size >= 256;
  const Shape shape{"llama", 1,  big_blocks ? 256 : 64,  big_blocks ? 8 : 4,
                    2,       32, big_blocks ? 256 : 192, 77,
                    false,
                    true,  // q/k/v biases: matmul_bias has one to add
                    type};
  const Synthetic syn = test::make_model(shape, 77);
  const Model model = Model::from_gguf(GgufFile::from_memory(syn.gguf, "matmul"));
  const ModelConfig& c = model.config();
  const bool is_float = type == DType::F32 || type == DType::F16 || type == DType::BF16;
  const bool gemv_type =
      is_float || type == DType::Q8_0 || type == DType::Q4_0 || type == DType::Q4_1;
  const bool q8_type = !is_float && type != DType::NF4_B64;
  // The CPU backend quantizes activations to 8 bits for the same types as
  // qmm_q8 (and by the same bits), so that path equals it up to fp32
  // summation order.
  const KvLayout layout = KvLayout::uniform(c.n_layer, c.n_head_kv * c.head_dim);
  auto cpu = test::make_test_backend(DeviceKind::kCpu, 2);
  cpu->prepare(model, layout, 16, 128);
  for (const auto& [skinny, q8] : {std::pair{64, 1}, std::pair{64, 0}, std::pair{0, 0}}) {
    if (skinny > 0 && !q8 && !q8_type) continue;  // the same as q8 on
    SCOPED_TRACE(std::string("skinny kernels up to width ") + std::to_string(skinny) +
                 (q8 ? ", 8-bit activations" : ""));
    std::unique_ptr<Backend> be;
    try {
      be = test::make_test_backend({.device = DeviceKind::kCuda,
                                    .n_threads = 2,
                                    .cuda_skinny_max = skinny,
                                    .cuda_q8_activations = q8});
    } catch (const Error& e) {
      const char* require = std::getenv("BARATA_REQUIRE_GPU");
      if (!(require && std::string(require) == "1"))
        GTEST_SKIP() << "CUDA backend unavailable: " << e.what();
      FAIL() << e.what();
    }
    KvBlockManager blocks(16);
    be->prepare(model, layout, 16, 128);
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const LayerWeights& L = model.layers()[0];
    const test::RefLayer& R = syn.layers[0];
    const struct {
      const char* name;
      const WeightDesc& w;
      const test::Mat& ref;
      Act in, out;
    } mats[] = {{"wq", L.wq, R.wq, Act::kXn, Act::kQ},
                {"gate", L.w_gate, R.wg, Act::kXn, Act::kGate},
                {"down", L.w_down, R.wd, Act::kGate, Act::kOut},
                {"output", model.output(), syn.out, Act::kXn, Act::kGate}};
    for (int64_t width : {1, 3, 8, 64}) {
      SCOPED_TRACE("width " + std::to_string(width));
      Batch batch;
      const int seq = blocks.new_sequence();
      for (int64_t p = 0; p < width; ++p) batch.add(static_cast<int32_t>(p % 50), p, seq, true);
      std::vector<KvBlockManager::Copy> copies;
      plan_batch(batch, blocks, 128, c.n_vocab, &copies);
      be->begin(batch);
      cpu->begin(batch);
      for (const auto& m : mats) {
        SCOPED_TRACE(m.name);
        std::vector<float> x(static_cast<size_t>(width * m.w.k));
        for (float& v : x) v = nd(rng);
        be->to_device(be->act(m.in), x.data(), static_cast<int64_t>(x.size()));
        be->matmul(m.w, be->act(m.in), be->act(m.out));
        std::vector<float> y(static_cast<size_t>(width * m.w.n_rows));
        be->to_host(y.data(), be->act(m.out), static_cast<int64_t>(y.size()));
        std::vector<double> ref;
        for (int64_t t = 0; t < width; ++t) {
          const auto r = ref_matvec(m.ref, x, t, m.w.k, m.w.n_rows);
          ref.insert(ref.end(), r.begin(), r.end());
        }
        // Skinny kernels: exact weights, fp32 activations and sums; with
        // 8-bit activations (qmm_q8, not gemv) their rounding, half a step
        // of 127 per block of 32. cuBLAS: activations and weights to fp16.
        const bool skinny_path = width <= skinny && (!is_float || (gemv_type && width <= 8));
        const bool q8_path = skinny_path && q8 && q8_type && !(gemv_type && width <= 8);
        EXPECT_LE(nmse(y, ref), q8_path ? 1e-4 : skinny_path ? 1e-9 : 2e-6);
        cpu->to_device(cpu->act(m.in), x.data(), static_cast<int64_t>(x.size()));
        cpu->matmul(m.w, cpu->act(m.in), cpu->act(m.out));
        std::vector<float> yc(y.size());
        cpu->to_host(yc.data(), cpu->act(m.out), static_cast<int64_t>(yc.size()));
        std::vector<double> ycd(yc.begin(), yc.end());
        const bool like_cpu = q8_path || (skinny_path && !q8_type);
        EXPECT_LE(nmse(y, ycd), like_cpu ? 1e-10 : 1e-4) << "against the CPU backend";

        // The fused forms against the separate ops' arithmetic (one fp32
        // addition each, y + b and acc + y): the same bits from the skinny
        // kernels' epilogue and from add_bias after cuBLAS; cuBLAS's beta = 1
        // for the residual add may round alpha * s + acc in one FMA.
        if (&m.w == &L.wq) {
          be->to_device(be->act(m.in), x.data(), static_cast<int64_t>(x.size()));
          be->matmul_bias(m.w, be->act(m.in), be->act(m.out), L.bq);
          std::vector<float> yb(y.size()), want(y.size());
          be->to_host(yb.data(), be->act(m.out), static_cast<int64_t>(yb.size()));
          for (size_t i = 0; i < y.size(); ++i)
            want[i] = y[i] + L.bq[i % static_cast<size_t>(m.w.n_rows)];
          EXPECT_EQ(0, std::memcmp(yb.data(), want.data(), yb.size() * 4)) << "matmul_bias";
        }
        std::vector<float> acc0(y.size()), ya(y.size()), want(y.size());
        for (float& v : acc0) v = nd(rng);
        for (size_t i = 0; i < y.size(); ++i) want[i] = acc0[i] + y[i];
        be->to_device(be->act(m.in), x.data(), static_cast<int64_t>(x.size()));
        be->to_device(be->act(m.out), acc0.data(), static_cast<int64_t>(acc0.size()));
        // The CUDA backend adds in the matmul: it takes no scratch.
        be->matmul_add(m.w, be->act(m.in), be->act(m.out), nullptr,
                       static_cast<int64_t>(acc0.size()));
        be->to_host(ya.data(), be->act(m.out), static_cast<int64_t>(ya.size()));
        if (skinny_path) {
          EXPECT_EQ(0, std::memcmp(ya.data(), want.data(), ya.size() * 4)) << "matmul_add";
        } else {
          EXPECT_LE(nmse(ya, std::vector<double>(want.begin(), want.end())), 1e-12) << "matmul_add";
        }
      }
      blocks.free_sequence(seq);
      // The kernel this (type, width) ran, as bench -v prints it.
      std::string kernel;
      for (const KernelChoice& k : be->report().kernels)
        if (k.weight_type == dtype_name(type) && k.width == width) kernel = k.kernel;
      const std::string want = skinny == 0               ? "cublasGemmEx"
                               : gemv_type && width <= 8 ? "gemv<"
                               : is_float                ? "cublasGemmEx"
                               : q8 && q8_type           ? "qmm_q8<"
                                                         : "qmm<";
      EXPECT_NE(kernel.find(want), std::string::npos) << "ran '" << kernel << "'";
    }
  }
}

std::vector<DType> every_type() {
  std::vector<DType> v;
  for (const DTypeTraits& t : all_dtypes()) v.push_back(t.type);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Types, CudaMatmul, ::testing::ValuesIn(every_type()),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Under the emulated backend only its CUDA instances: the CPU ones run in
// barata_tests.
std::vector<DeviceKind> devices() {
  if (test::emulated_backend()) return {DeviceKind::kCuda};
  return {DeviceKind::kCpu, DeviceKind::kCuda};
}

// A mixture of experts' layer (Backend::moe, moe.h) for batches of 3 and 40 rows,
// the experts in the parameter's type: the same as a float64 reference that
// routes with the router's exact logits and runs each chosen expert from its
// own dense (dequantized) matrices. A wrong expert offset, scale or row
// stride misses by far more than the bound.
class BackendMoe : public ::testing::TestWithParam<std::tuple<DeviceKind, DType>> {};

TEST_P(BackendMoe, TheMixtureEqualsEachChosenExpertsDenseMatricesInFloat64) {
  const DeviceKind device = std::get<0>(GetParam());
  const DType type = std::get<1>(GetParam());
  const test::Shape s{"llama", 1, 256, 4, 2, 64, 256, 64, false, false, type, 8, 2};
  const test::Synthetic syn = test::make_model(s, 77);
  const Model model = Model::from_gguf(GgufFile::from_memory(syn.gguf, "moe"));
  const ModelConfig& c = model.config();
  ASSERT_TRUE(c.moe());
  std::unique_ptr<Backend> be;
  try {
    be = test::make_test_backend(device, 2);
  } catch (const Error& e) {
    const char* require = std::getenv("BARATA_REQUIRE_GPU");
    if (device == DeviceKind::kCuda && !(require && std::string(require) == "1"))
      GTEST_SKIP() << "CUDA backend unavailable: " << e.what();
    FAIL() << e.what();
  }
  const KvLayout layout = KvLayout::uniform(c.n_layer, c.n_head_kv * c.head_dim);
  be->prepare(model, layout, 8, 64);
  // 3 rows: decode-sized groups (CUDA: one grouped GEMV launch per matrix
  // for the types it reads); 40: groups past the GEMV's 8 rows.
  for (const int64_t T : {3, 40}) {
    SCOPED_TRACE(std::to_string(T) + " rows");
    KvBlockManager blocks(8);
    const int seq = blocks.new_sequence();
    Batch batch;
    const int64_t d = c.d_model, f = c.d_ff_exp, K = c.n_expert_used;
    for (int64_t t = 0; t < T; ++t) batch.add(static_cast<int32_t>(t + 3), t, seq, true);
    std::vector<KvBlockManager::Copy> copies;
    plan_batch(batch, blocks, 64, c.n_vocab, &copies);
    be->begin(batch);

    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> xn(static_cast<size_t>(T * d)), acc(xn.size());
    for (float& v : xn) v = nd(rng);
    for (float& v : acc) v = nd(rng);
    be->to_device(be->act(Act::kXn), xn.data(), T * d);
    be->to_device(be->act(Act::kX), acc.data(), T * d);
    const LayerWeights& L = model.layers()[0];
    be->moe(L, be->act(Act::kXn), be->act(Act::kX));
    std::vector<float> got(xn.size());
    be->to_host(got.data(), be->act(Act::kX), T * d);

    const test::RefLayer& R = syn.layers[0];
    std::vector<double> ref;
    std::set<int32_t> chosen;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> logits(static_cast<size_t>(c.n_expert)), probs(logits.size());
      for (int64_t e = 0; e < c.n_expert; ++e) {
        double z = 0;
        for (int64_t j = 0; j < d; ++j) z += R.router[e * d + j] * xn[t * d + j];
        logits[static_cast<size_t>(e)] = static_cast<float>(z);
      }
      std::vector<int32_t> ids(static_cast<size_t>(K));
      std::vector<float> w(static_cast<size_t>(K));
      route_token(c, logits.data(), probs.data(), ids.data(), w.data());
      std::vector<double> out(acc.begin() + t * d, acc.begin() + (t + 1) * d);
      for (int64_t j = 0; j < K; ++j) {
        const auto e = static_cast<size_t>(ids[static_cast<size_t>(j)]);
        chosen.insert(ids[static_cast<size_t>(j)]);
        std::vector<double> h(static_cast<size_t>(f));
        for (int64_t r = 0; r < f; ++r) {
          double g = 0, u = 0;
          for (int64_t i = 0; i < d; ++i) {
            g += R.eg[e][r * d + i] * xn[t * d + i];
            u += R.eu[e][r * d + i] * xn[t * d + i];
          }
          h[static_cast<size_t>(r)] = g / (1.0 + std::exp(-g)) * u;
        }
        for (int64_t i = 0; i < d; ++i) {
          double y = 0;
          for (int64_t r = 0; r < f; ++r) y += R.ed[e][i * f + r] * h[static_cast<size_t>(r)];
          out[static_cast<size_t>(i)] += w[static_cast<size_t>(j)] * y;
        }
      }
      ref.insert(ref.end(), out.begin(), out.end());
    }
    EXPECT_GE(chosen.size(), T == 3 ? 3u : 4u) << "the rows should spread over the experts";
    // Two matmuls in a row: within twice a matmul's bound, 8-bit activations
    // taken twice (the input and the hidden state) where the type uses them.
    EXPECT_LE(nmse(got, ref), 2 * matmul_bound(device, type)) << dtype_name(type);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, BackendMoe,
                         ::testing::Combine(::testing::ValuesIn(devices()),
                                            ::testing::ValuesIn(every_type())),
                         [](const auto& info) {
                           return std::string(device_name(std::get<0>(info.param))) + "_" +
                                  dtype_name(std::get<1>(info.param));
                         });

INSTANTIATE_TEST_SUITE_P(Backends, BackendOps,
                         ::testing::Combine(::testing::ValuesIn(devices()),
                                            ::testing::ValuesIn(kShapes)),
                         [](const auto& info) {
                           const Shape& s = std::get<1>(info.param);
                           return std::string(device_name(std::get<0>(info.param))) + "_" +
                                  std::to_string(info.index) + "_" + dtype_name(s.wtype);
                         });

}  // namespace
}  // namespace barata
