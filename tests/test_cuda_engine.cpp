// End to end, the CUDA backend against the CPU backend on the same file: the
// tiny test models and SmolLM2, prefill and decode, batch widths 1 and 4,
// within docs/engine.md's precision contract (greedy ids equal up to the
// first near-tie; logits within 1e-2 of the step's largest |logit| on F32 and
// F16 weights). Without a GPU these skip with the driver's reason, or fail
// when BARATA_REQUIRE_GPU=1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend_factory.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/quantize.h"
#include "synthetic_model.h"
#include "test_util.h"
#ifdef BARATA_TEST_EMU_BACKEND
#include "emu/cuda_emu.h"
#endif

namespace barata {
namespace {

bool require_gpu() {
  const char* r = std::getenv("BARATA_REQUIRE_GPU");
  return r && std::string(r) == "1";
}

// A CUDA engine, or the reason there is none.
std::unique_ptr<Engine> cuda_engine(const Model& m, int64_t n_ctx, std::string* why,
                                    KvType k = KvType::kF16, KvType v = KvType::kF16,
                                    int64_t cache_tokens = 0) {
  try {
    const EngineOptions o{.n_threads = 2,
                          .n_ctx = n_ctx,
                          .cache_tokens = cache_tokens,
                          .device = DeviceKind::kCuda,
                          .cache_k = k,
                          .cache_v = v};
    return std::make_unique<Engine>(m, o, test::make_test_backend(DeviceKind::kCuda, 2));
  } catch (const Error& e) {
    *why = e.what();
    return nullptr;
  }
}

// `width` sequences on each of two engines, each prefilled with a short
// prompt of its own; their ids in sa, sb and their logits in la, lb.
void prefill_both(Engine& a, Engine& b, int width, int64_t V, std::vector<int>& sa,
                  std::vector<int>& sb, std::vector<float>& la, std::vector<float>& lb) {
  la.assign(static_cast<size_t>(V * width), 0.0f);
  lb.assign(la.size(), 0.0f);
  for (int w = 0; w < width; ++w) {
    const std::vector<int32_t> prompt{1, 400, 31, 7 + w};
    sa.push_back(a.new_sequence());
    sb.push_back(b.new_sequence());
    a.prefill(sa.back(), prompt, la.data() + w * V);
    b.prefill(sb.back(), prompt, lb.data() + w * V);
  }
}

#define CUDA_ENGINE_OR_SKIP(var, model, n_ctx)                        \
  std::string why_;                                                   \
  auto var = cuda_engine(model, n_ctx, &why_);                        \
  if (!var) {                                                         \
    if (require_gpu()) FAIL() << "BARATA_REQUIRE_GPU=1 and " << why_; \
    GTEST_SKIP() << "CUDA backend unavailable: " << why_;             \
  }

#define CUDA_ENGINE_OR_SKIP_RETURN(var, model, n_ctx)                        \
  std::string why_;                                                          \
  auto var = cuda_engine(model, n_ctx, &why_);                               \
  if (!var) {                                                                \
    if (require_gpu()) ADD_FAILURE() << "BARATA_REQUIRE_GPU=1 and " << why_; \
    return {};                                                               \
  }

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

// Top-2 gap under 1% of the top logit: a near-tie, where the backends may
// pick differently: that step's ids are not compared.
bool near_tie(const float* v, int64_t n) {
  std::vector<float> s(v, v + n);
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<>());
  return s[0] - s[1] < 0.01f * std::fabs(s[0]);
}

struct Compared {
  double worst = 0;  // max |cpu - cuda| / max |cpu logit| over the steps
  int64_t steps_equal = 0, steps = 0;
};

// Greedy decode of `n` tokens after `prompt` on both engines, width rows
// (the same prompt in every row): ids and logits compared per step.
Compared compare(Engine& cpu, Engine& gpu, const std::vector<int32_t>& prompt, int n, int width) {
  const int64_t V = cpu.model().config().n_vocab;
  Compared r;
  std::vector<int> sc, sg;
  std::vector<float> lc(static_cast<size_t>(V * width)), lg(lc.size());
  for (int w = 0; w < width; ++w) {
    sc.push_back(cpu.new_sequence());
    sg.push_back(gpu.new_sequence());
    cpu.prefill(sc.back(), prompt, lc.data() + w * V);
    gpu.prefill(sg.back(), prompt, lg.data() + w * V);
  }
  // Both engines are fed the CPU's ids, so a near-tie (where the backends may
  // rightly pick differently) skips that step's id comparison, not the rest.
  for (int step = 0; step <= n; ++step) {
    std::vector<int32_t> next;
    for (int w = 0; w < width; ++w) {
      const float* a = lc.data() + w * V;
      const float* b = lg.data() + w * V;
      float scale = 0, err = 0;
      for (int64_t i = 0; i < V; ++i) {
        scale = std::max(scale, std::fabs(a[i]));
        err = std::max(err, std::fabs(a[i] - b[i]));
      }
      r.worst = std::max(r.worst, double(err) / std::max(scale, 1e-6f));
      const int32_t ia = argmax(a, V), ib = argmax(b, V);
      if (!near_tie(a, V)) {
        EXPECT_EQ(ia, ib) << "step " << step << " row " << w;
        r.steps_equal += ia == ib;
      }
      next.push_back(ia);
    }
    ++r.steps;
    if (step == n) break;
    cpu.decode(sc, next, lc.data());
    gpu.decode(sg, next, lg.data());
  }
  for (int s : sc) cpu.free_sequence(s);
  for (int s : sg) gpu.free_sequence(s);
  return r;
}

// bound: on the logits (< 0: ids only). min_equal: greedy steps whose ids
// must have been compared (not at a near-tie) and found equal. prompt_len > 0:
// a prompt of that many ids (below 500) instead of the 17 of the default one;
// n_ctx: the engines' context (the CUDA decode splits it in ranges of 256).
void run_model(const std::filesystem::path& path, double bound, int64_t min_equal = 0,
               int prompt_len = 0, int64_t n_ctx = 256, std::vector<int> widths = {1, 4}) {
  const Model model = Model::load(path);
  Engine cpu(model, {.n_threads = 2, .n_ctx = n_ctx});
  CUDA_ENGINE_OR_SKIP(gpu, model, n_ctx);
  std::vector<int32_t> prompt{1, 400, 31, 7, 99, 250, 12, 8, 3, 77, 41, 5, 60, 2, 19, 33, 90};
  if (prompt_len > 0) {
    prompt.assign(1, 1);
    for (int i = 1; i < prompt_len; ++i) prompt.push_back((i * 37 + 11) % 497 + 3);
  }
  // The emulation runs every CUDA thread as a fiber: fewer steps there.
  const int steps = !test::emulated_backend() ? 24 : 6;
  for (int width : widths) {
    SCOPED_TRACE("batch width " + std::to_string(width));
    const Compared c = compare(cpu, *gpu, prompt, steps, width);
    if (bound >= 0) {
      EXPECT_LE(c.worst, bound);
    }
    EXPECT_GE(c.steps_equal, min_equal * width) << "steps compared away from near-ties";
  }
}

// A random-weight llama (2 layers, d_model 256, d_ff 512, 512 tokens: the
// K-quants' 256-weight blocks fit) written in F32, then quantized by barata
// quantize's own code: `type` everywhere, with the overrides given.
std::filesystem::path quantized_synthetic(const test::TempDir& dir, DType type,
                                          std::vector<std::pair<std::string, DType>> overrides,
                                          std::optional<DType> output_type) {
  const test::Shape shape{"llama", 2, 256, 8, 2, 32, 512, 512, false, false, DType::F32};
  const test::Synthetic syn = test::make_model(shape, 2024);
  const auto f32 = dir / "f32.gguf";
  test::write_bytes(f32, syn.gguf);
  QuantOptions o;
  o.type = type;
  o.overrides = std::move(overrides);
  o.output_type = output_type;
  o.threads = 2;
  const auto out = dir / (std::string(dtype_name(type)) + ".gguf");
  const QuantResult r = quantize_model(load_gguf_source(f32), o, out);
  for (const TensorPlan& p : r.plan) EXPECT_FALSE(p.fallback) << p.name << ": " << p.why;
  return out;
}

// llama.cpp's Q4_K_M recipe in its outline (llama-quant.cpp): Q4_K, with
// Q6_K for the output and for attn_v and ffn_down (there: half of their
// layers; here both of two). Greedy ids equal the CPU's up to a near-tie.
TEST(CudaEngine, Q4KMixMatchesCpu) {
  test::TempDir dir;
  run_model(quantized_synthetic(
                dir, DType::Q4_K,
                {{"blk.*.attn_v.weight", DType::Q6_K}, {"blk.*.ffn_down.weight", DType::Q6_K}},
                DType::Q6_K),
            -1, 2);
}

TEST(CudaEngine, Nf4MatchesCpu) {
  test::TempDir dir;
  run_model(quantized_synthetic(dir, DType::NF4_B64, {}, std::nullopt), -1, 2);
}

TEST(CudaEngine, Stories260KMatchesCpu) {
  run_model(test::tiny_model("stories260K.gguf"), 1e-2);
}

TEST(CudaEngine, Aidreams260KMatchesCpu) {
  run_model(test::tiny_model("aidreams260K.gguf"), 1e-2);
}

// The architecture rows' optional steps on the CUDA backend: per-head q/k
// RMSNorm (qwen3), RoPE tables with Llama 3's frequency factors and with
// YaRN (the tables are shared: rope_tables), Gemma 3's embedding scale,
// post-norms, GeGLU, sliding window (32 positions: the prompt and decode
// cross it) and local RoPE base, Phi-3's fused q/k/v and gate/up (row ranges
// of one matrix) and LongRoPE factors, against the CPU. A 40-id prompt: past
// Gemma's window, in prefill and decode (two decode splits of 256 at n_ctx 512,
// the second empty).
// Under the sanitizers (minutes a model there: 509 s for all five) only
// Gemma 3, whose window is the one new kernel path, one row wide, its prompt
// 36 ids (just past the window); the RoPE tables, head norms and fused row
// ranges are host-side or existing kernels.
TEST(CudaEngine, ArchitectureRowsMatchCpu) {
  for (const char* name :
       {"tiny-qwen3", "tiny-llama3", "tiny-llama-yarn", "tiny-gemma3", "tiny-phi"}) {
    SCOPED_TRACE(name);
    // Gemma 3 past its window (32) and the 64 positions kept back: its local
    // layers' first blocks are released while it decodes (layer groups).
    const int prompt = std::string(name) == "tiny-gemma3" ? 120 : 40;
    run_model(test::data_dir() / "models" / "arch" / (std::string(name) + ".gguf"), 1e-2, 0, prompt,
              512);
    if (IsSkipped()) return;  // no CUDA engine: one skip, not one per row
  }
}

// Mixtures of experts (moe.h): the router's logits route on the host (the
// CPU backend's choices from the device's logits), each active expert runs
// as the backend's matmuls on its rows (gathered on the device), and one
// launch sums each token's experts into the residual. The committed tiny
// qwen3moe and Mixtral (F16), prefill and decode at widths 1 and 4. Every
// weight type's experts are checked op by op (test_backend_ops.cpp,
// BackendMoe): quantized, these tiny models amplify the backends' one
// designed difference (the CUDA GEMV reads fp32 activations where the CPU
// rounds them to 8 bits) by a few percent, with or without experts.
TEST(CudaEngine, MixturesOfExpertsMatchCpu) {
  for (const char* name : {"tiny-qwen3moe", "tiny-mixtral"}) {
    SCOPED_TRACE(name);
    run_model(test::data_dir() / "models" / "arch" / (std::string(name) + ".gguf"), 1e-2, 0, 40,
              512);
    if (IsSkipped()) return;
  }
}

// --experts-on cpu: the expert tensors stay in host memory and run on the
// CPU's kernels (HostExperts) inside the CUDA backend's forward, everything
// else on the device; the rows cross once each way per MoE layer. The
// device holds every matrix but the experts, and the logits follow the CPU
// engine's as the all-device run does.
TEST(CudaEngine, ExpertsOnTheCpuMatchTheCpuEngine) {
  const Model model = Model::load(test::data_dir() / "models" / "arch" / "tiny-qwen3moe.gguf");
  Engine cpu(model, {.n_threads = 2, .n_ctx = 512});
  std::unique_ptr<Engine> gpu;
  try {
    gpu = std::make_unique<Engine>(
        model,
        EngineOptions{
            .n_threads = 2, .n_ctx = 512, .device = DeviceKind::kCuda, .experts_on_cpu = true},
        test::make_test_backend(
            {.device = DeviceKind::kCuda, .n_threads = 2, .experts_on_cpu = true}));
  } catch (const Error& e) {
    if (require_gpu()) FAIL() << "BARATA_REQUIRE_GPU=1 and " << e.what();
    GTEST_SKIP() << "CUDA backend unavailable: " << e.what();
  }
  const DeviceReport r = gpu->backend().report();
  int64_t experts = 0;
  for (const LayerWeights& L : model.layers())
    for (const auto* v : {&L.gate_exps, &L.up_exps, &L.down_exps})
      for (const WeightDesc& w : *v) experts += w.bytes();
  EXPECT_EQ(r.weight_bytes, model.total_weight_bytes() - experts);
  bool noted = false;
  for (const std::string& n : r.notes) noted |= n.find("experts on the cpu") != std::string::npos;
  EXPECT_TRUE(noted);
  std::vector<int32_t> prompt{1};
  for (int i = 1; i < 40; ++i) prompt.push_back((i * 37 + 11) % 497 + 3);
  const int steps = !test::emulated_backend() ? 24 : 6;
  for (int width : {1, 4}) {
    SCOPED_TRACE("batch width " + std::to_string(width));
    EXPECT_LE(compare(cpu, *gpu, prompt, steps, width).worst, 1e-2);
  }
}

// A quantized KV cache (kv_types.h): the device's rope_kv writes the CPU's
// bytes and its attention reads the CPU's values (test_emu_kernels and
// test_emu_attention check both exactly) from the same k and v. The two
// backends' k and v differ in the last bits (their matmuls sum in other
// orders), and a value on a rounding edge of the cache's code then takes the
// next code on one backend: a step of absmax / 7 at 4 bits. So where the
// fp16 caches agree within 0.2% on these rows, the quantized ones agree
// within 2.5% (measured: q8_0/q4_0 2.0%, q8_0h/fp8 0.8%, q4_0o/q8_0 2.4%
// on tiny-qwen3 and 12% on tiny-llama3, whose large scores magnify a 4-bit
// key's step): bounded at 4% (20% with 4-bit K), with the same greedy ids
// away from near-ties, and first the caches themselves compared value by
// value: within one code step everywhere, and under 1% of codes different. (A synthetic qwen2 with
// biases would exercise the keys' offset too, but its random weights make a chaotic model on which
// even the fp16 caches differ by 1.5%; the offset's device code is checked byte for byte by
// RopeKvMatchesReference.)
TEST(CudaEngine, QuantizedKvCacheMatchesCpu) {
  const KvType types[][2] = {{KvType::kQ8_0, KvType::kQ4_0},
                             {KvType::kQ8_0H, KvType::kFp8},
                             {KvType::kQ4_0O, KvType::kQ8_0},
                             {KvType::kIq4NlS, KvType::kIq4Nl}};
  std::vector<int32_t> prompt{1};
  for (int i = 1; i < 40; ++i) prompt.push_back((i * 37 + 11) % 497 + 3);
  for (const char* file : {"tiny-qwen3", "tiny-llama3"}) {
    const Model model =
        Model::load(test::data_dir() / "models" / "arch" / (std::string(file) + ".gguf"));
    for (const auto& t : types) {
      SCOPED_TRACE(std::string(file) + ", " + kv_cache_label(t[0], t[1]));
      Engine cpu(
          model,
          {.n_threads = 2, .n_ctx = 64, .cache_tokens = 128, .cache_k = t[0], .cache_v = t[1]});
      std::string why_;
      auto gpu = cuda_engine(model, 64, &why_, t[0], t[1], 128);
      if (!gpu) {
        if (require_gpu()) FAIL() << "BARATA_REQUIRE_GPU=1 and " << why_;
        GTEST_SKIP() << "CUDA backend unavailable: " << why_;
      }
      // Layer 0's cache after the prompt (its k and v come from the same
      // embeddings through one matmul; later layers inherit the code flips
      // of the earlier ones): every value within one code step of the
      // CPU's, and under 1% of codes different (a scale an ulp apart moves
      // every value of its block a little: that is not counted).
      const int sc = cpu.new_sequence(), sg = gpu->new_sequence();
      std::vector<float> l(static_cast<size_t>(model.config().n_vocab));
      cpu.prefill(sc, prompt, l.data());
      gpu->prefill(sg, prompt, l.data());
      const KvLayout& L = cpu.kv_layout();
      int64_t differ = 0, total = 0;
      for (int64_t layer = 0; layer < 1; ++layer)
        for (int kv = 0; kv < 2; ++kv) {
          const KvType st = kv_storage_type(L.type(kv));
          std::vector<uint8_t> a(static_cast<size_t>(L.row_bytes(kv))), b(a.size());
          std::vector<float> fa(static_cast<size_t>(L.kv_dim)), fb(fa.size());
          for (int64_t p = 0; p < static_cast<int64_t>(prompt.size()); ++p) {
            auto slot = [&](const Engine& e, int s) {
              return e.blocks().table(s)[static_cast<size_t>(p / kKvBlockTokens)] *
                         static_cast<int32_t>(kKvBlockTokens) +
                     static_cast<int32_t>(p % kKvBlockTokens);
            };
            cpu.backend().kv_to_host(layer, kv, slot(cpu, sc), a.data());
            gpu->backend().kv_to_host(layer, kv, slot(*gpu, sg), b.data());
            kv_dequantize_row(st, a.data(), fa.data(), L.kv_dim);
            kv_dequantize_row(st, b.data(), fb.data(), L.kv_dim);
            for (int64_t blk = 0; blk < L.kv_dim / 32; ++blk) {
              float amax = 0;
              for (int j = 0; j < 32; ++j)
                amax = std::max(amax, std::fabs(fa[static_cast<size_t>(32 * blk + j)]));
              // iq4_nl: its widest gap, 24 of the grid's 127 (d is near amax / 113..127)
              const float step = st == KvType::kQ4_0    ? amax / 7.0f
                                 : st == KvType::kIq4Nl ? amax * 24.0f / 113.0f
                                 : st == KvType::kQ8_0  ? amax / 127.0f
                                                        : amax / 8.0f;
              for (int j = 0; j < 32; ++j) {
                const size_t i = static_cast<size_t>(32 * blk + j);
                ASSERT_LE(std::fabs(fa[i] - fb[i]),
                          step * 1.1f + 1e-6f)  // the scales may differ by ulps
                    << "layer " << layer << (kv ? " V" : " K") << " position " << p << " value "
                    << i;
                differ +=
                    std::fabs(fa[i] - fb[i]) > 0.5f * step;  // another code (not a scale's ulp)
                ++total;
              }
            }
          }
        }
      EXPECT_LT(differ * 100, total) << differ << " of " << total << " codes differ";
      cpu.free_sequence(sc);
      gpu->free_sequence(sg);
      // Greedy ids equal away from near-ties, and the logits close.
      const Compared c = compare(cpu, *gpu, prompt, test::emulated_backend() ? 4 : 16, 2);
      const bool four_k =
          kv_storage_type(t[0]) == KvType::kQ4_0 || kv_storage_type(t[0]) == KvType::kIq4Nl;
      EXPECT_LE(c.worst, four_k ? 0.2 : 4e-2);
    }
  }
}

// The residual hook gets a host copy of the device's x, after every layer:
// the same shape as on the CPU and values within the logits' bound.
TEST(CudaEngine, ResidualHookCopiesToTheHost) {
  const Model model = Model::load(test::tiny_model("stories260K.gguf"));
  const ModelConfig& c = model.config();
  Engine cpu(model, {.n_threads = 2, .n_ctx = 64});
  CUDA_ENGINE_OR_SKIP(gpu, model, 64);
  const std::vector<int32_t> prompt{1, 400, 31, 7, 99, 250, 12, 8};
  std::vector<std::vector<float>> hc, hg;
  auto capture = [&](std::vector<std::vector<float>>& into) {
    return [&into, &c](int64_t l, const float* x, int64_t rows, int64_t d) {
      EXPECT_EQ(l, static_cast<int64_t>(into.size()));
      EXPECT_EQ(d, c.d_model);
      into.emplace_back(x, x + rows * d);
    };
  };
  cpu.set_residual_hook(capture(hc));
  gpu->set_residual_hook(capture(hg));
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  cpu.prefill(cpu.new_sequence(), prompt, logits.data());
  gpu->prefill(gpu->new_sequence(), prompt, logits.data());
  ASSERT_EQ(hc.size(), static_cast<size_t>(c.n_layer));
  ASSERT_EQ(hg.size(), hc.size());
  for (size_t l = 0; l < hc.size(); ++l) {
    ASSERT_EQ(hg[l].size(), prompt.size() * static_cast<size_t>(c.d_model));
    float scale = 0, err = 0;
    for (size_t i = 0; i < hc[l].size(); ++i) {
      scale = std::max(scale, std::fabs(hc[l][i]));
      err = std::max(err, std::fabs(hc[l][i] - hg[l][i]));
    }
    EXPECT_GT(scale, 0.0f) << "layer " << l;
    EXPECT_LE(err, 1e-2f * scale) << "layer " << l;
  }
}

// A decode step is captured as a CUDA graph the first time its width is seen
// and replayed after (in the emulation too, which records the launches and
// replays them with the arguments they were captured with): the logits equal
// those of the same steps run eagerly (BARATA_CUDA_GRAPHS=0) bit for bit,
// width after width, and the report counts the captures and replays.
TEST(CudaEngine, DecodeGraphsReplayBitForBitWithTheEagerSteps) {
  const Model model = Model::load(test::tiny_model("stories260K.gguf"));
  const int64_t V = model.config().n_vocab;
  setenv("BARATA_CUDA_GRAPHS", "0", 1);
  std::string why_eager;
  auto eager = cuda_engine(model, 64, &why_eager);
  unsetenv("BARATA_CUDA_GRAPHS");
  CUDA_ENGINE_OR_SKIP(graphs, model, 64);
  ASSERT_TRUE(eager) << why_eager;
  const int steps = 4;
  for (int width : {1, 3}) {
    SCOPED_TRACE("width " + std::to_string(width));
    std::vector<int> se, sg;
    std::vector<float> le, lg;
    prefill_both(*eager, *graphs, width, V, se, sg, le, lg);
    for (int step = 0; step < steps; ++step) {
      std::vector<int32_t> next;
      for (int w = 0; w < width; ++w) next.push_back(argmax(le.data() + w * V, V));
      eager->decode(se, next, le.data());
      graphs->decode(sg, next, lg.data());
      ASSERT_EQ(std::memcmp(le.data(), lg.data(), le.size() * sizeof(float)), 0) << "step " << step;
    }
    for (int s : se) eager->free_sequence(s);
    for (int s : sg) graphs->free_sequence(s);
  }
  const DeviceReport re = eager->backend().report(), rg = graphs->backend().report();
  EXPECT_EQ(re.graphs_captured, 0);
  EXPECT_EQ(re.graph_replays, 0);
  EXPECT_EQ(rg.graphs_captured, 2);  // widths 1 and 3
  EXPECT_EQ(rg.graph_replays, 2 * (steps - 1));
}

// A CUDA engine with CUDA graphs on or off (BARATA_CUDA_GRAPHS, read when the
// backend is made; the variable is left as it was).
std::unique_ptr<Engine> cuda_engine_with_graphs(const Model& m, bool graphs, int64_t n_ctx,
                                                std::string* why) {
  const char* was = std::getenv("BARATA_CUDA_GRAPHS");
  const std::string saved = was ? was : "";
  setenv("BARATA_CUDA_GRAPHS", graphs ? "1" : "0", 1);
  auto e = cuda_engine(m, n_ctx, why);
  if (was)
    setenv("BARATA_CUDA_GRAPHS", saved.c_str(), 1);
  else
    unsetenv("BARATA_CUDA_GRAPHS");
  return e;
}

#define CUDA_ENGINES_OR_SKIP(eager, graphs, model, n_ctx)             \
  std::string why_;                                                   \
  auto eager = cuda_engine_with_graphs(model, false, n_ctx, &why_);   \
  if (!eager) {                                                       \
    if (require_gpu()) FAIL() << "BARATA_REQUIRE_GPU=1 and " << why_; \
    GTEST_SKIP() << "CUDA backend unavailable: " << why_;             \
  }                                                                   \
  auto graphs = cuda_engine_with_graphs(model, true, n_ctx, &why_);   \
  ASSERT_TRUE(graphs) << why_

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A step with a residual hook has host code between its ops (the read-back
// of x after every layer): it is neither captured nor replayed, not even at
// a width whose graph exists (a replay runs no host code between its
// kernels: the hook would not run, or, run after it, would read the last
// layer's x for every layer). So with graphs on the hook sees, at every
// decode step and layer, the rows it sees with graphs off, bit for bit, and
// not those of the step before; the logits are the same bits; unset, the
// graph replays again.
TEST(CudaEngine, ResidualHookStepsAreNeitherCapturedNorReplayed) {
  const Model model = Model::load(test::tiny_model("stories260K.gguf"));
  const ModelConfig& c = model.config();
  const int64_t V = c.n_vocab;
  CUDA_ENGINES_OR_SKIP(eager, graphs, model, 64);
  using Seen = std::vector<std::vector<float>>;  // one step's x, by layer
  Seen seen_e, seen_g;
  auto hook = [&c](Seen& into, int64_t want_rows) {
    return [&into, &c, want_rows](int64_t l, const float* x, int64_t rows, int64_t d) {
      EXPECT_EQ(l, static_cast<int64_t>(into.size()));
      EXPECT_EQ(rows, want_rows);
      EXPECT_EQ(d, c.d_model);
      into.emplace_back(x, x + rows * d);
    };
  };
  for (int width : {1, 3}) {
    SCOPED_TRACE("width " + std::to_string(width));
    std::vector<int> se, sg;
    std::vector<float> le, lg;
    prefill_both(*eager, *graphs, width, V, se, sg, le, lg);
    auto step = [&](const std::string& phase) {
      std::vector<int32_t> next;
      for (int w = 0; w < width; ++w) next.push_back(argmax(le.data() + w * V, V));
      seen_e.clear();
      seen_g.clear();
      eager->decode(se, next, le.data());
      graphs->decode(sg, next, lg.data());
      EXPECT_TRUE(same_bits(le, lg)) << phase << ": the logits";
    };
    const DeviceReport r0 = graphs->backend().report();
    for (int i = 0; i < 2; ++i) step("before the hook, step " + std::to_string(i));
    const DeviceReport r1 = graphs->backend().report();
    EXPECT_EQ(r1.graphs_captured, r0.graphs_captured + 1) << "the width's graph";
    EXPECT_EQ(r1.graph_replays, r0.graph_replays + 1);

    eager->set_residual_hook(hook(seen_e, width));
    graphs->set_residual_hook(hook(seen_g, width));
    Seen before;
    for (int i = 0; i < 3; ++i) {
      const std::string phase = "with the hook, step " + std::to_string(i);
      step(phase);
      ASSERT_EQ(seen_e.size(), static_cast<size_t>(c.n_layer)) << phase;
      ASSERT_EQ(seen_g.size(), seen_e.size()) << phase;
      for (size_t l = 0; l < seen_g.size(); ++l) {
        EXPECT_TRUE(same_bits(seen_g[l], seen_e[l])) << phase << ", layer " << l;
        if (!before.empty()) {
          EXPECT_FALSE(same_bits(seen_g[l], before[l])) << phase << ", layer " << l << ": stale";
        }
      }
      before = seen_g;
    }
    const DeviceReport r2 = graphs->backend().report();
    EXPECT_EQ(r2.graphs_captured, r1.graphs_captured) << "a step with the hook was captured";
    EXPECT_EQ(r2.graph_replays, r1.graph_replays) << "a step with the hook was replayed";

    eager->set_residual_hook({});
    graphs->set_residual_hook({});
    for (int i = 0; i < 2; ++i) {
      step("after the hook, step " + std::to_string(i));
      EXPECT_TRUE(seen_g.empty());
    }
    const DeviceReport r3 = graphs->backend().report();
    EXPECT_EQ(r3.graphs_captured, r2.graphs_captured);
    EXPECT_EQ(r3.graph_replays, r2.graph_replays + 2);
    for (int s : se) eager->free_sequence(s);
    for (int s : sg) graphs->free_sequence(s);
  }
}

// What the host changes between steps reaches the device before the replay
// that reads it: a forked sequence's copy on write of its shared last block
// (made before the step, never inside the graph), then a truncation (the
// positions and block tables go up with the batch's metadata). Both decode
// through width 2's graph, captured before on other sequences (after the
// prompt: a wider batch's buffers drop the graphs), bit for bit as eagerly.
TEST(CudaEngine, GraphReplaysSeeCopiesOnWriteAndTruncations) {
  const Model model = Model::load(test::tiny_model("stories260K.gguf"));
  const int64_t V = model.config().n_vocab;
  CUDA_ENGINES_OR_SKIP(eager, graphs, model, 64);
  std::vector<float> le(static_cast<size_t>(2 * V)), lg(le.size());
  std::vector<int32_t> prompt{1};  // 21 ids: the last block is partial
  for (int i = 1; i < 21; ++i) prompt.push_back((i * 37 + 11) % 497 + 3);
  const int ae = eager->new_sequence(), ag = graphs->new_sequence();
  eager->prefill(ae, prompt, le.data());
  graphs->prefill(ag, prompt, lg.data());
  for (Engine* e : {eager.get(), graphs.get()}) {  // width 2's graph
    std::vector<int> s{e->new_sequence(), e->new_sequence()};
    for (int q : s) e->prefill(q, std::vector<int32_t>{1, 400, 31}, le.data());
    for (int i = 0; i < 2; ++i) e->decode(s, std::vector<int32_t>{5, 9}, le.data());
    for (int q : s) e->free_sequence(q);
  }
  const DeviceReport r0 = graphs->backend().report();
  ASSERT_EQ(r0.graphs_captured, 1);
  const std::vector<int> se{ae, eager->fork(ae)}, sg{ag, graphs->fork(ag)};
  std::vector<int32_t> next{5, 9};  // the two forks part at once
  auto step = [&](const std::string& what) {
    eager->decode(se, next, le.data());
    graphs->decode(sg, next, lg.data());
    ASSERT_TRUE(same_bits(le, lg)) << what;
    next = {argmax(le.data(), V), argmax(le.data() + V, V)};
  };
  for (int i = 0; i < 3; ++i) step("after the fork, step " + std::to_string(i));
  for (Engine* e : {eager.get(), graphs.get()})
    for (int q : e == eager.get() ? se : sg) e->truncate(q, 22);
  for (int i = 0; i < 2; ++i) step("after the truncation, step " + std::to_string(i));
  const DeviceReport r1 = graphs->backend().report();
  EXPECT_EQ(r1.graphs_captured, r0.graphs_captured);
  EXPECT_EQ(r1.graph_replays, r0.graph_replays + 5) << "every step a replay";
}

// A step that throws while its graph is being captured (here: a program
// whose first residual matmul has a weight of another width, which the
// backend refuses at that op) leaves the capture open; the host's next work
// on the stream (a copy on write, a read-back) must run, not be recorded
// into that capture and dropped with it (the copy) or refused by it (the
// read-back's synchronize). Eager engine first, then the one with graphs:
// the emulation's capture takes every stream's work of its thread (a GPU's
// only its stream's).
TEST(CudaEngine, WorkAfterAStepThatThrewInACaptureRuns) {
  const Model model = Model::load(test::tiny_model("stories260K.gguf"));
  const ModelConfig& c = model.config();
  const int64_t V = c.n_vocab;
  CUDA_ENGINES_OR_SKIP(eager, graphs, model, 64);
  StepProgram bad = eager->program();
  const WeightDesc* wide = nullptr;
  for (const StepOp& op : bad.ops)
    if (op.kind == OpKind::kMatmul && op.w->n_rows != c.d_model) wide = op.w;
  ASSERT_NE(wide, nullptr);
  for (StepOp& op : bad.ops)
    if (op.kind == OpKind::kMatmulAdd) {
      op.w = wide;
      break;
    }
  // A decode step of seq with the bad program; the row it did not finish
  // is truncated away.
  auto bad_step = [&](Engine& e, int seq) {
    Batch b;
    b.add(5, e.length(seq), seq, true);
    std::vector<KvBlockManager::Copy> copies;
    plan_batch(b, e.blocks(), e.n_ctx(), V, &copies);
    EXPECT_TRUE(copies.empty());
    std::vector<float> l(static_cast<size_t>(V));
    e.backend().begin(b);
    EXPECT_THROW(e.backend().run_step(bad, b, c, l.data(), {}), Error);
    e.truncate(seq, b.positions[0]);
  };
  std::vector<int32_t> prompt{1};  // 21 ids: the last block is partial
  for (int i = 1; i < 21; ++i) prompt.push_back((i * 37 + 11) % 497 + 3);
  std::vector<float> le(static_cast<size_t>(2 * V)), lg(le.size());
  std::vector<uint8_t> ke, kg;
  auto run = [&](Engine& e, std::vector<float>& logits, std::vector<uint8_t>& k) {
    const int a = e.new_sequence();
    e.prefill(a, prompt, logits.data());
    bad_step(e, a);  // width 1, never captured
    const std::vector<int> s{a, e.fork(a)};
    e.decode(s, std::vector<int32_t>{7, 11}, logits.data());  // copies a's last block first
    bad_step(e, a);
    const KvLayout& L = e.kv_layout();
    k.resize(static_cast<size_t>(L.row_bytes(0)));
    const int32_t slot = e.blocks().table(a)[1] * static_cast<int32_t>(kKvBlockTokens) + 3;
    EXPECT_NO_THROW(e.backend().kv_to_host(0, 0, slot, k.data())) << "the read-back";
    return a;
  };
  const int ae = run(*eager, le, ke), ag = run(*graphs, lg, kg);
  EXPECT_TRUE(same_bits(le, lg)) << "the step after the fork: its copy on write";
  EXPECT_EQ(ke, kg) << "layer 0's key at position 19";
  // And the engine goes on: width 1 captured now, then replayed.
  for (int i = 0; i < 2; ++i) {
    eager->decode(std::vector<int>{ae}, std::vector<int32_t>{3}, le.data());
    graphs->decode(std::vector<int>{ag}, std::vector<int32_t>{3}, lg.data());
    EXPECT_TRUE(same_bits(le, lg)) << "step " << i;
  }
  const DeviceReport r = graphs->backend().report();
  EXPECT_EQ(r.graphs_captured, 2) << "widths 2 and 1; the failed captures are not kept";
  EXPECT_EQ(r.graph_replays, 1);
}

TEST(CudaEngine, SmolLM2MatchesCpu) {
  if (test::emulated_backend())
    GTEST_SKIP() << "too large for the emulated GPU (runs on a real one)";
  const auto path = test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "not fetched: " << path;
  // Q4_1: the CPU takes 8-bit activations, the GPU fp32 ones; the contract
  // there is agreement of ids, not 1e-2 on every logit.
  run_model(path, 5e-2);
}

}  // namespace
}  // namespace barata

#ifdef BARATA_TEST_EMU_BACKEND
namespace barata {
namespace {

// Launches configured, checked and logged, not run, while one lives.
struct DryLaunches {
  DryLaunches() { barata_emu::set_dry_launches(true); }
  ~DryLaunches() { barata_emu::set_dry_launches(false); }
};

// The kernels one decode step launches, by name, in the emulation: the nodes
// its CUDA graph holds (the step logged is a replay of the graph captured the
// step before; a replay logs each node as it runs it).
// The launches are dry (configured, checked and logged, not run): the count
// does not depend on the values, which the other tests check; run, the
// 16-wide case took over 10 minutes under ASan.
std::vector<std::string> decode_step_launches(const test::Shape& shape, int width) {
  DryLaunches dry;
  const test::Synthetic syn = test::make_model(shape, 7);
  test::TempDir dir;
  const auto path = dir / "m.gguf";
  test::write_bytes(path, syn.gguf);
  const Model model = Model::load(path);
  CUDA_ENGINE_OR_SKIP_RETURN(gpu, model, 64 + 32 * width);
  std::vector<int> seqs;
  std::vector<float> logits(static_cast<size_t>(shape.n_vocab * width));
  for (int w = 0; w < width; ++w) {
    seqs.push_back(gpu->new_sequence());
    const std::vector<int32_t> prompt{1, 2, 3};
    gpu->prefill(seqs.back(), prompt, logits.data());
  }
  const std::vector<int32_t> next(static_cast<size_t>(width), 5);
  gpu->decode(seqs, next, logits.data());  // the first step of a width may set things up
  barata_emu::start_launch_log();
  gpu->decode(seqs, next, logits.data());
  barata_emu::stop_launch_log();
  return barata_emu::launch_log();
}

std::string tally(const std::vector<std::string>& log) {
  std::map<std::string, int> n;
  for (const auto& k : log) ++n[k];
  std::string s;
  for (const auto& [k, c] : n) s += "  " + std::to_string(c) + " x " + k + "\n";
  return s;
}

// Launches per layer and outside the layers of a decode step, from a 1- and
// a 2-layer copy of one shape: the launch budget docs/cuda.md gives. On a
// small model a decode step is bound by its launches, not by its bytes (the
// 0.5B shape at B=1 reads ~0.3 GB in Q4_K, 60 us at the H200's 4.8 TB/s, in
// 24 x the per-layer launches), so a change that adds launches shows here.
struct LaunchCase {
  const char* name;
  std::string arch;
  bool bias;
  DType type;
  int width;
  int per_layer, outside;
};

class CudaLaunches : public ::testing::TestWithParam<LaunchCase> {};

TEST_P(CudaLaunches, DecodeStepPerLayer) {
  const LaunchCase& c = GetParam();
  auto shape = [&](int64_t layers) {
    return test::Shape{c.arch, layers, 256, 8, 2, 32, 512, 512, false, c.bias, c.type};
  };
  const auto one = decode_step_launches(shape(1), c.width);
  if (one.empty()) GTEST_SKIP() << "no CUDA engine (see the other CudaEngine tests)";
  const auto two = decode_step_launches(shape(2), c.width);
  const int per_layer = static_cast<int>(two.size() - one.size());
  const int outside = static_cast<int>(one.size()) - per_layer;
  std::printf("%s: %d launches per layer, %d outside the layers; one layer's step:\n%s", c.name,
              per_layer, outside, tally(one).c_str());
  EXPECT_EQ(per_layer, c.per_layer) << tally(one);
  EXPECT_EQ(outside, c.outside) << tally(one);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaLaunches,
    ::testing::Values(LaunchCase{"qwen2_q4k_b1", "qwen2", true, DType::Q4_K, 1, 13, 3},
                      LaunchCase{"qwen2_q8_0_b1", "qwen2", true, DType::Q8_0, 1, 12, 3},
                      LaunchCase{"qwen2_q4k_b4", "qwen2", true, DType::Q4_K, 4, 13, 3},
                      // Past the crossover (4, measured on the H200): each matmul is
                      // its activations to fp16, the weight to fp16 and cublasGemmEx.
                      LaunchCase{"qwen2_q8_0_b16", "qwen2", true, DType::Q8_0, 16, 30, 5},
                      LaunchCase{"llama_f16_b4", "llama", false, DType::F16, 4, 12, 3}),
    [](const auto& i) { return std::string(i.param.name); });

// What a decode step's CUDA graph holds, as the emulation recorded it at the
// capture, is the kernels and GEMMs of the same step run eagerly
// (BARATA_CUDA_GRAPHS=0), in order, and nothing else: no copy nor set (the
// batch's metadata goes up before the graph, the logits come down after it,
// a copy on write is made before the step), so a replay reads no host memory.
// The replays (right after the capture, and at the next step) launch exactly
// those. Widths 1 and 3 (GEMV, qmm) and 16 (past the crossover: fp16
// conversion, dequantization and cublasGemmEx). Dry launches: which kernels
// a step launches does not depend on the values, which the bit-for-bit tests
// compare.
TEST(CudaGraphs, CaptureHoldsTheEagerStepsLaunches) {
  DryLaunches dry;
  const test::Shape shape{"qwen2", 2, 256, 8, 2, 32, 512, 512, false, true, DType::Q8_0};
  const test::Synthetic syn = test::make_model(shape, 7);
  test::TempDir dir;
  test::write_bytes(dir / "m.gguf", syn.gguf);
  const Model model = Model::load(dir / "m.gguf");
  CUDA_ENGINES_OR_SKIP(eager, graphs, model, 512);
  for (int width : {1, 3, 16}) {
    SCOPED_TRACE("width " + std::to_string(width));
    std::vector<int> se, sg;
    std::vector<float> logits(static_cast<size_t>(shape.n_vocab * width));
    for (int w = 0; w < width; ++w) {
      se.push_back(eager->new_sequence());
      sg.push_back(graphs->new_sequence());
      eager->prefill(se.back(), std::vector<int32_t>{1, 2, 3}, logits.data());
      graphs->prefill(sg.back(), std::vector<int32_t>{1, 2, 3}, logits.data());
    }
    const std::vector<int32_t> next(static_cast<size_t>(width), 5);
    auto logged = [&](Engine& e, const std::vector<int>& seqs) {
      barata_emu::start_launch_log();
      e.decode(seqs, next, logits.data());
      barata_emu::stop_launch_log();
      return barata_emu::launch_log();
    };
    const std::vector<std::string> eager1 = logged(*eager, se);
    const DeviceReport r0 = graphs->backend().report();
    const std::vector<std::string> first = logged(*graphs, sg);  // captured, then replayed
    const std::vector<std::string> captured = barata_emu::last_capture();
    const DeviceReport r1 = graphs->backend().report();
    const std::vector<std::string> second = logged(*graphs, sg);  // replayed
    const DeviceReport r2 = graphs->backend().report();
    const std::vector<std::string> eager2 = logged(*eager, se);
    EXPECT_EQ(r1.graphs_captured, r0.graphs_captured + 1);
    EXPECT_EQ(r1.graph_replays, r0.graph_replays);
    EXPECT_EQ(r2.graphs_captured, r1.graphs_captured);
    EXPECT_EQ(r2.graph_replays, r1.graph_replays + 1);
    ASSERT_FALSE(eager1.empty());
    for (const std::string& node : captured)
      EXPECT_EQ(node.rfind("cudaMem", 0), std::string::npos) << "a " << node << " in the graph";
    EXPECT_EQ(captured, eager1) << "the capture against the eager step";
    EXPECT_EQ(first, eager1) << "the replay after the capture";
    EXPECT_EQ(second, eager1) << "the next replay";
    EXPECT_EQ(eager2, eager1) << "the next eager step";
    const auto gemms = std::count(eager1.begin(), eager1.end(), "cublasGemmEx");
    if (width == 16)
      EXPECT_EQ(gemms, 2 * 7 + 1) << "every matmul through cuBLAS";
    else
      EXPECT_EQ(gemms, 0);
    for (int s : se) eager->free_sequence(s);
    for (int s : sg) graphs->free_sequence(s);
  }
}

}  // namespace
}  // namespace barata
#endif

namespace barata {
namespace {

// Without CUDA in the build, or without a GPU, --device cuda is one error
// line saying which, and a non-zero exit; an unknown device is a usage error.
#ifndef BARATA_TEST_EMU_BACKEND
TEST(DeviceCli, CudaWithoutAGpuIsOneClearError) {
  const std::string model = test::tiny_model("stories260K.gguf").string();
  const auto bad = test::run_cli("run -m " + model + " -p hi -n 2 --device tpu");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--device"), std::string::npos) << bad.err;
  const auto r = test::run_cli("run -m " + model + " -p hi -n 2 --temp 0 --device cuda");
  if (r.status == 0) {
    if (!require_gpu()) GTEST_SKIP() << "a GPU is here: --device cuda ran";
    return;
  }
  EXPECT_NE(r.err.find("error: --device cuda: "), std::string::npos) << r.err;
  EXPECT_TRUE(r.err.find("built without CUDA") != std::string::npos ||
              r.err.find("no usable GPU") != std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}
#endif

}  // namespace
}  // namespace barata
