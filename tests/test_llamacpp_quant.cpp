// barata on files quantized by llama.cpp itself (Q4_K_M, Q5_K_M: Q4_K, Q5_K and
// Q6_K matrices, tests/data/llamacpp_quant/README.md) against llama.cpp's own
// logits on them, teacher-forced.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/convert.h"
#include "barata/engine.h"
#include "barata/gguf.h"
#include "cpu/matmul.h"
#include "barata/model.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

using nlohmann::json;

class LlamaCppQuant : public ::testing::TestWithParam<const char*> {};

// The same file with every tensor dequantized to F32 (exact): the control
// that runs without 8-bit activations.
std::vector<uint8_t> dequantized_copy(const std::filesystem::path& path) {
  const SourceModel src = load_gguf_source(path);
  GgufWriter w;
  for (const auto& [k, v] : src.metadata) w.set(k, v);
  for (const auto& t : src.tensors) {
    const std::vector<float> v = t.load();
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    w.add_tensor(t.name, DType::F32, t.shape, std::move(b));
  }
  return w.to_bytes();
}

struct Comparison {
  int steps = 0, agree = 0, clear = 0, clear_agree = 0;
  std::vector<double> dev;    // per step: worst |ours - theirs| over their top 5 / their top logit
  std::vector<float> logits;  // every step's logits, concatenated
};

Comparison compare(const Model& model, const std::filesystem::path& jsonl) {
  const Tokenizer tok = Tokenizer::from_gguf(model.file());
  Engine engine(model, {.n_threads = 2, .n_ctx = 128});
  const int64_t V = model.config().n_vocab;
  Comparison c;
  std::ifstream f(jsonl);
  for (std::string line; std::getline(f, line);) {
    const json r = json::parse(line);
    const auto prompt = r["prompt_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(r["prompt"].get<std::string>(), true, true), prompt);
    const auto gen = r["generated_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end() - 1);
    std::vector<float> logits(static_cast<size_t>(V) * all.size());
    const int s = engine.new_sequence();
    engine.prefill(s, all, logits.data(), true);
    engine.free_sequence(s);
    for (size_t i = 0; i < gen.size(); ++i) {
      const float* lg = logits.data() + (prompt.size() - 1 + i) * static_cast<size_t>(V);
      c.logits.insert(c.logits.end(), lg, lg + V);
      const auto& top5 = r["top5_logits_per_step"][i];
      const double scale = std::fabs(top5[0][1].get<double>());
      double d = 0;
      for (const auto& p : top5)
        d = std::max(d, std::fabs(lg[p[0].get<int>()] - p[1].get<double>()));
      c.dev.push_back(d / scale);
      const int ours = static_cast<int>(std::max_element(lg, lg + V) - lg);
      c.agree += ours == gen[i];
      // Where llama.cpp's top two are more than 2 % apart, the token must agree.
      if (top5[0][1].get<double>() - top5[1][1].get<double>() > 0.02 * scale) {
        ++c.clear;
        c.clear_agree += ours == gen[i];
      }
      ++c.steps;
    }
  }
  std::sort(c.dev.begin(), c.dev.end());
  return c;
}

TEST_P(LlamaCppQuant, LogitsMatchLlamaCpp) {
  const auto dir = test::source_dir() / "tests/data/llamacpp_quant";
  const std::string name = GetParam();
  const Model model = Model::load(dir / (name + ".gguf"));
  // The K-quant matrices run on their own kernels, not the generic one.
  const WeightDesc& wq = model.layers()[0].wq;
  const std::string kernel = cpu_matmul_kernel(wq.type, wq.k).name;
  EXPECT_EQ(kernel.find("dequant"), std::string::npos) << kernel;
  const Comparison q = compare(model, dir / (name + ".jsonl"));
  const std::vector<uint8_t> f32 = dequantized_copy(dir / (name + ".gguf"));
  const Model deq = Model::from_gguf(GgufFile::from_memory(f32, name + "-f32"));
  const Comparison d = compare(deq, dir / (name + ".jsonl"));
  ASSERT_GE(q.steps, 40);
  // Ours against ours: the K-quant kernels (8-bit activations) against the
  // same weights in F32.
  double self = 0, top = 0;
  for (size_t i = 0; i < q.logits.size(); ++i) {
    self = std::max(self, std::fabs(double(q.logits[i]) - d.logits[i]));
    top = std::max(top, std::fabs(double(d.logits[i])));
  }
  std::printf(
      "[ info ] %s vs llama.cpp: top-1 %d/%d (%d/%d where the top-2 gap > 2%%); logit "
      "deviation median %.4f, worst %.4f of the top logit. Same weights in F32: median "
      "%.4f, worst %.4f. Kernels vs F32: worst %.4f\n",
      name.c_str(), q.agree, q.steps, q.clear_agree, q.clear, q.dev[q.dev.size() / 2], q.dev.back(),
      d.dev[d.dev.size() / 2], d.dev.back(), self / top);
  // Measured: median 0.015, worst 0.030; with exact F32 weights and fp32
  // activations barata is 0.012 / 0.025 from llama.cpp, so most of the gap is
  // llama.cpp's own activation rounding (8-bit blocks of 256 for K-quants) on
  // this random model, not these kernels.
  EXPECT_EQ(q.clear_agree, q.clear);
  EXPECT_LT(q.dev[q.dev.size() / 2], 0.025);
  EXPECT_LT(q.dev.back(), 0.05);
  EXPECT_LT(self / top, 0.03);
}

INSTANTIATE_TEST_SUITE_P(Files, LlamaCppQuant, ::testing::Values("tiny-q4_k_m", "tiny-q5_k_m"));

}  // namespace
}  // namespace barata
