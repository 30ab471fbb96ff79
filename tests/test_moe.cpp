// Mixtures of experts (include/barata/moe.h): routing as llama.cpp's
// build_moe_ffn routes (softmax, ggml's argsort order, normalised weights),
// the grouping of a batch by expert, the layer's output for every weight
// type against a float64 reference built from the same experts' dense
// matrices, and a batch whose rows choose different experts giving each row
// the bits it gets alone. (The refusals of files whose expert keys and
// tensors disagree are in test_architectures.cpp with the others.)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend_factory.h"
#include "barata/backend.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/moe.h"
#include "synthetic_model.h"
#include "test_util.h"

namespace barata {
namespace {

ModelConfig moe_config(int64_t n, int64_t k, bool norm) {
  ModelConfig c;
  c.n_expert = n;
  c.n_expert_used = k;
  c.expert_weights_norm = norm;
  return c;
}

std::vector<double> softmax(const std::vector<float>& x) {
  double mx = -1e300, s = 0;
  for (float v : x) mx = std::max(mx, double(v));
  std::vector<double> p;
  for (float v : x) p.push_back(std::exp(v - mx));
  for (double v : p) s += v;
  for (double& v : p) v /= s;
  return p;
}

TEST(MoeRouting, SoftmaxThenTopKThenNormalisedAsLlamaCpp) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.0f, 1.5f, -0.2f};
  const std::vector<double> p = softmax(logits);
  std::vector<float> probs(6);
  int32_t ids[2];
  float w[2];
  route_token(moe_config(6, 2, true), logits.data(), probs.data(), ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 4);
  EXPECT_NEAR(w[0], p[2] / (p[2] + p[4]), 1e-6);
  EXPECT_NEAR(w[1], p[4] / (p[2] + p[4]), 1e-6);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);
  for (int e = 0; e < 6; ++e) EXPECT_NEAR(probs[e], p[e], 1e-6);
  // Without normalisation the weights are the probabilities themselves.
  route_token(moe_config(6, 2, false), logits.data(), probs.data(), ids, w);
  EXPECT_NEAR(w[0], p[2], 1e-6);
  EXPECT_NEAR(w[1], p[4], 1e-6);
  // Every expert used: all of them, largest first, weights summing to 1.
  int32_t all[6];
  float wa[6];
  route_token(moe_config(6, 6, true), logits.data(), probs.data(), all, wa);
  EXPECT_EQ(std::vector<int32_t>(all, all + 6), (std::vector<int32_t>{2, 4, 3, 0, 5, 1}));
}

// ggml's CPU argsort (ggml-cpu/ops.cpp, ggml_compute_forward_argsort_f32)
// is an exchange sort: position j takes, in turn, every later index whose
// value is strictly greater. On equal probabilities that is not a stable
// sort: for [2, 1, 2, 3] position 0 ends with index 3 after moving index 0
// to the end, so position 1 takes index 2, not index 0.
TEST(MoeRouting, TiesFollowGgmlsArgsortExchanges) {
  std::vector<float> probs(4);
  int32_t ids[3];
  float w[3];
  const float a[4] = {2.0f, 1.0f, 2.0f, 3.0f};
  route_token(moe_config(4, 2, true), a, probs.data(), ids, w);
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 2);
  route_token(moe_config(4, 3, true), a, probs.data(), ids, w);
  EXPECT_EQ(ids[2], 0);
  EXPECT_EQ(w[1], w[2]);
  const float b[3] = {1.0f, 2.0f, 2.0f};  // here the exchanges keep index order
  route_token(moe_config(3, 2, true), b, probs.data(), ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
}

TEST(MoeRouting, GroupsAPairPerChoiceByExpertThenToken) {
  const ModelConfig c = moe_config(4, 2, true);
  // Token 0 picks 3 then 1; token 1 picks 0 then 3; token 2 picks 1 then 0.
  const float logits[12] = {0, 1, -5, 2, 3, 1, -5, 2, 1, 3, -5, 0};
  ExpertGroups g;
  g.route(c, logits, 3);
  EXPECT_EQ(g.ids, (std::vector<int32_t>{3, 1, 0, 3, 1, 0}));
  EXPECT_EQ(g.start, (std::vector<int32_t>{0, 2, 4, 4, 6}));
  EXPECT_EQ(g.token, (std::vector<int32_t>{1, 2, 0, 2, 0, 1}));
  EXPECT_EQ(g.active, (std::vector<int32_t>{0, 1, 3}));
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t j = 0; j < 2; ++j) {
      const int32_t at = g.slot_at[static_cast<size_t>(t * 2 + j)];
      EXPECT_EQ(g.token[static_cast<size_t>(at)], t);
      const int32_t e = g.ids[static_cast<size_t>(t * 2 + j)];
      EXPECT_GE(at, g.start[static_cast<size_t>(e)]);
      EXPECT_LT(at, g.start[static_cast<size_t>(e) + 1]);
    }
}

// Four sequences decoded in one step, their rows choosing different
// experts, give each sequence the logits it gets decoded alone, bit for bit
// (the experts' kernels compute each row as they do for a batch of one).
TEST(MoeEngine, ABatchGivesEachRowTheBitsItGetsAlone) {
  for (const char* name : {"tiny-qwen3moe", "tiny-mixtral"}) {
    SCOPED_TRACE(name);
    const Model model =
        Model::load(test::data_dir() / "models" / "arch" / (std::string(name) + ".gguf"));
    const int64_t V = model.config().n_vocab;
    Engine engine(model, {.n_threads = 2, .n_ctx = 256});
    const std::vector<std::vector<int32_t>> prompts = {
        {1, 17, 300, 42, 5}, {1, 600, 7}, {1, 99, 98, 97, 96, 95, 94}, {1, 512}};
    std::vector<std::vector<float>> alone;
    for (const auto& p : prompts) {
      std::vector<float> l(static_cast<size_t>(V));
      const int s = engine.new_sequence();
      engine.prefill(s, p, l.data());
      const int ss[1] = {s};
      const int32_t tt[1] = {11};
      engine.decode(ss, tt, l.data());
      engine.free_sequence(s);
      alone.push_back(l);
    }
    std::vector<int> seqs;
    std::vector<float> tmp(static_cast<size_t>(V)), l4(static_cast<size_t>(4 * V));
    for (const auto& p : prompts) {
      seqs.push_back(engine.new_sequence());
      engine.prefill(seqs.back(), p, tmp.data());
    }
    engine.decode(seqs, std::vector<int32_t>(4, 11), l4.data());
    for (size_t i = 0; i < 4; ++i)
      EXPECT_EQ(std::memcmp(l4.data() + i * V, alone[i].data(), sizeof(float) * V), 0)
          << "sequence " << i;
    for (int s : seqs) engine.free_sequence(s);
  }
}

std::filesystem::path moe_model(const char* name) {
  return test::data_dir() / "models" / "arch" / (std::string(name) + ".gguf");
}

// `barata quantize` writes every expert tensor in the target type (3-D, the
// experts' rows quantized as one matrix each) and keeps the router in F32,
// as llama.cpp's quantizer does; the result loads and follows the F16
// model's greedy choices (teacher-forced, 8-bit) where they are clear.
TEST(MoeCli, QuantizeWritesTheExpertsAndKeepsTheRouter) {
  test::TempDir dir;
  for (const char* type : {"q8_0", "int4-g128"}) {
    SCOPED_TRACE(type);
    const auto out = dir.path() / (std::string(type) + ".gguf");
    const auto r = test::run_cli(fmt::format("quantize --type {} {} {}", type,
                                             moe_model("tiny-qwen3moe").string(), out.string()));
    ASSERT_EQ(r.status, 0) << r.err;
    const GgufFile f = GgufFile::open(out);
    const GgufTensorInfo* router = f.find_tensor("blk.1.ffn_gate_inp.weight");
    const GgufTensorInfo* down = f.find_tensor("blk.1.ffn_down_exps.weight");
    ASSERT_TRUE(router && down);
    EXPECT_EQ(router->type, DType::F32);
    EXPECT_EQ(down->type, std::string(type) == "q8_0" ? DType::Q8_0 : DType::I4_G128);
    EXPECT_EQ(down->shape, (std::vector<int64_t>{64, 128, 8}));
  }
  const Model f16 = Model::load(moe_model("tiny-qwen3moe"));
  const Model q8 = Model::load(dir.path() / "q8_0.gguf");
  const int64_t V = f16.config().n_vocab;
  Engine a(f16, {.n_threads = 2, .n_ctx = 128}), b(q8, {.n_threads = 2, .n_ctx = 128});
  std::vector<float> la(static_cast<size_t>(V)), lb(la.size());
  const std::vector<int32_t> prompt = {1, 40, 400, 800, 12, 90};
  const int sa = a.new_sequence(), sb = b.new_sequence();
  a.prefill(sa, prompt, la.data());
  b.prefill(sb, prompt, lb.data());
  int agree = 0, clear = 0;
  for (int i = 0; i < 16; ++i) {
    std::vector<float> sorted = la;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    const auto top = static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin());
    if (sorted[0] - sorted[1] > 0.05f * std::fabs(sorted[0])) {
      ++clear;
      agree += top == static_cast<int32_t>(std::max_element(lb.begin(), lb.end()) - lb.begin());
    }
    const int ss[1] = {sa}, sq[1] = {sb};
    const int32_t tt[1] = {top};
    a.decode(ss, tt, la.data());
    b.decode(sq, tt, lb.data());
  }
  EXPECT_GE(clear, 8);
  EXPECT_EQ(agree, clear);
}

// plan counts every expert in memory and the active ones in a token's
// reads; bench's JSON says the same of the matrices.
TEST(MoeCli, PlanAndBenchCountActiveAndTotal) {
  const std::string m = moe_model("tiny-qwen3moe").string();
  const auto p = test::run_cli("plan -m " + m + " --mem 1G --json --gb-per-s 10");
  ASSERT_EQ(p.status, 0) << p.err;
  const auto j = nlohmann::json::parse(p.out)["model"];
  const GgufFile f = GgufFile::open(m);
  int64_t experts = 0;
  for (const char* t : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})
    for (int l = 0; l < 2; ++l)
      experts +=
          static_cast<int64_t>(f.find_tensor(fmt::format("blk.{}.{}.weight", l, t))->n_bytes);
  EXPECT_EQ(j["n_expert"], 8);
  EXPECT_EQ(j["n_expert_used"], 2);
  EXPECT_EQ(j["weight_bytes"].get<int64_t>() - j["active_weight_bytes"].get<int64_t>(),
            experts / 8 * 6);
  EXPECT_LT(j["active_params"].get<int64_t>(), j["params"].get<int64_t>());
  const auto text = test::run_cli("plan -m " + m + " --mem 1G");
  EXPECT_NE(text.out.find("mixture of experts: 2 of 8 experts per token"), std::string::npos)
      << text.out;
  const auto b = test::run_cli("bench -m " + m +
                               " --tests decode -r 1 -c 8 --decode-steps 2 --ctx-size 64 --json");
  ASSERT_EQ(b.status, 0) << b.err;
  const auto bm = nlohmann::json::parse(b.out)["model"];
  EXPECT_EQ(bm["n_expert"], 8);
  EXPECT_EQ(bm["total_weight_bytes"].get<int64_t>() - bm["weight_bytes"].get<int64_t>(),
            experts / 8 * 6);
  EXPECT_EQ(bm["total_params"].get<int64_t>() - bm["active_params"].get<int64_t>(),
            2 * 3 * 64 * 128 * 6);
}

}  // namespace
}  // namespace barata
