// barata_synth: a GGUF with random weights in a named model shape, for
// benchmarks and tests on machines that have no model files (the lent GPU
// machine of scripts/gpu-check.sh). The weights are approximately normal with
// a small std (the residual stream stays near unit RMS after each norm), the
// norm gains near 1, and the file carries a SentencePiece-style vocabulary so
// that `barata run` and `barata bench` load it as they load a real model.
//
//   barata_synth --preset qwen2.5-0.5b --type F16 -o out.gguf [--seed N] [--layers N]
//
// Every value is a pure function of (seed, tensor name, element index): the
// output does not depend on the thread count, and overriding --layers leaves
// the tensors that remain unchanged. The file is written one tensor at a time
// through GgufWriter, atomically (a crash leaves no partial file).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "barata/dtype.h"
#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/half.h"

namespace {

using barata::DType;
using barata::fail;
using barata::GgufType;
using barata::GgufValue;
using barata::GgufWriter;

// How a preset's RoPE is scaled: none, Llama 3.1's frequency factors
// (rope_freqs.weight, factor 8, low/high frequency factors 1 and 4 over an
// original context of 8192), or the rope.scaling keys of linear / YaRN with
// factor 4 (YaRN's original context: a quarter of the preset's).
// kLongRope: Phi-3's rope_factors_long / _short.weight (long ones rising from
// 1 to 8 over the pairs, short ones from 1 to 1.25) with an original context
// of a quarter of the preset's and rope.scaling.attn_factor
// sqrt(1 + ln 4 / ln(original context)) (the converter's formula).
enum class Rope { kPlain, kLlama3, kLinear, kYarn, kLongRope };

struct Preset {
  const char* name;
  const char* arch;  // "qwen2", "llama" or "qwen3"
  int64_t n_layer, d_model, n_head, n_head_kv, d_ff, n_vocab, n_ctx;
  float rope_base, norm_eps;
  bool qkv_bias, tied;
  const char* about;
  int64_t head_dim = 0;  // 0: d_model / n_head; else written as attention.key_length
  bool qk_norm = false;  // attn_q_norm / attn_k_norm (qwen3)
  Rope rope = Rope::kPlain;
  int64_t window = 0;  // gemma3: attention.sliding_window and the post-norms
  // A mixture of experts (expert_count > 0): ffn_gate_inp and 3-D
  // ffn_{gate,up,down}_exps in place of the dense FFN; d_ff_exp is written
  // as expert_feed_forward_length for qwen3moe (Mixtral's is d_ff).
  int64_t n_expert = 0, n_expert_used = 0, d_ff_exp = 0;
};

// Shapes of released models (their config.json) and two small ones for tests.
// Every matrix row length (d_model, n_head * head_dim, d_ff) is a multiple of
// 32, so that `barata quantize` can reach every block type without fallbacks.
const Preset kPresets[] = {
    {"qwen2.5-0.5b", "qwen2", 24, 896, 14, 2, 4864, 151936, 32768, 1e6f, 1e-6f, true, true,
     "Qwen2.5-0.5B: 24 layers, d_model 896, 14/2 heads x 64, d_ff 4864, vocab 151936, tied"},
    {"smollm2-135m", "llama", 30, 576, 9, 3, 1536, 49152, 8192, 1e5f, 1e-5f, false, true,
     "SmolLM2-135M: 30 layers, d_model 576, 9/3 heads x 64, d_ff 1536, vocab 49152, tied"},
    // Qwen3-0.6B's matrix sizes (d_model 1024, d_ff 3072, vocab 151936, 28
    // layers, 8 KV heads) as a llama with 64-wide heads: every row length is
    // a multiple of 256, so the K-quants apply to every matrix.
    {"llama-0.5b", "llama", 28, 1024, 16, 8, 3072, 151936, 32768, 1e6f, 1e-6f, false, true,
     "K-quant-friendly 0.5B: llama, 28 layers, d_model 1024, 16/8 heads x 64, d_ff 3072, "
     "vocab 151936, tied"},
    {"tiny", "qwen2", 2, 128, 4, 2, 384, 1024, 512, 1e6f, 1e-6f, true, true,
     "tests: qwen2, 2 layers, d_model 128, 4/2 heads x 32, d_ff 384, vocab 1024, tied"},
    {"tiny-llama", "llama", 2, 128, 4, 4, 320, 768, 256, 1e4f, 1e-5f, false, false,
     "tests: llama, 2 layers, d_model 128, 4/4 heads x 32, d_ff 320, vocab 768, untied"},
    // Qwen3-0.6B's config.json: 28 layers, d_model 1024, 16/8 heads of 128
    // (attention.key_length; the query width 2048 is not d_model), d_ff 3072,
    // rope base 1e6, eps 1e-6, tied.
    {"qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 3072, 151936, 40960, 1e6f, 1e-6f, false, true,
     "Qwen3-0.6B: 28 layers, d_model 1024, 16/8 heads x 128, d_ff 3072, vocab 151936, tied", 128,
     true},
    {"tiny-qwen3", "qwen3", 2, 128, 4, 2, 384, 1024, 512, 1e6f, 1e-6f, false, true,
     "tests: qwen3, 2 layers, d_model 128, 4/2 heads x 64 (query width 256), q/k norms, tied", 64,
     true},
    // Llama 3.2 1B's RoPE (base 500000, llama3 factors) on a tiny body with a
    // context long enough to reach the positions the factors change most.
    {"tiny-llama3", "llama", 2, 128, 4, 2, 320, 768, 4096, 5e5f, 1e-5f, false, true,
     "tests: llama with Llama 3.1's rope_freqs (base 500000), 2 layers, d_model 128, 4/2 heads x "
     "32",
     0, false, Rope::kLlama3},
    {"tiny-llama-linear", "llama", 2, 128, 4, 2, 320, 768, 4096, 1e4f, 1e-5f, false, true,
     "tests: llama with rope.scaling linear, factor 4", 0, false, Rope::kLinear},
    {"tiny-llama-yarn", "llama", 2, 128, 4, 2, 320, 768, 4096, 1e4f, 1e-5f, false, true,
     "tests: llama with rope.scaling yarn, factor 4, original context 1024", 0, false, Rope::kYarn},
    // Gemma 3 270M's config.json: 18 layers, d_model 640, 4/1 heads of 256,
    // d_ff 2048, vocab 262144, window 512, rope base 1e6, eps 1e-6, tied.
    {"gemma3-270m", "gemma3", 18, 640, 4, 1, 2048, 262144, 32768, 1e6f, 1e-6f, false, true,
     "Gemma 3 270M: 18 layers, d_model 640, 4/1 heads x 256, d_ff 2048, window 512, tied", 256,
     true, Rope::kPlain, 512},
    // Llama 3.2 1B's config.json: 16 layers, d_model 2048, 32/8 heads of 64,
    // d_ff 8192, vocab 128256, rope base 500000 with the llama3 factors, tied.
    {"llama3.2-1b", "llama", 16, 2048, 32, 8, 8192, 128256, 131072, 5e5f, 1e-5f, false, true,
     "Llama 3.2 1B: 16 layers, d_model 2048, 32/8 heads x 64, d_ff 8192, vocab 128256, "
     "rope_freqs",
     0, false, Rope::kLlama3},
    // (llama.cpp refuses this file's vocabulary: its general.name says phi3,
    // which makes llama.cpp look for Phi-3's own tokens; see tiny-phi below.)
    {"phi3-mini", "phi3", 32, 3072, 32, 32, 8192, 32064, 4096, 1e4f, 1e-5f, false, false,
     "Phi-3 mini 4k: 32 layers, d_model 3072, 32/32 heads x 96, d_ff 8192, vocab 32064, fused "
     "qkv and gate+up, untied"},
    // Phi-3 mini's config.json shape (32 layers, d_model 3072, 32/32 heads of
    // 96, d_ff 8192, vocab 32064) is too big for tests: a tiny phi3 with the
    // fused tensors and LongRoPE factors. (Not "phi3" in its name: llama.cpp
    // gives tokens of Phi-3's own vocabulary special attributes when the
    // model's name says phi3, and this vocabulary has none of them.)
    {"tiny-phi", "phi3", 2, 128, 4, 2, 256, 768, 4096, 1e4f, 1e-5f, false, false,
     "tests: phi3, fused qkv and gate+up, LongRoPE (original context 1024), 4/2 heads x 32", 0,
     false, Rope::kLongRope},
    // Mixtures of experts (clang-format would put each field on a line).
    // clang-format off
    // Qwen3-30B-A3B's config.json: 48 layers, d_model 2048, 32/4 heads of
    // 128, 128 experts of 768, 8 used, vocab 151936, untied (17 GB in Q4_0:
    // written tensor by tensor, never held whole).
    {"qwen3-30b-a3b", "qwen3moe", 48, 2048, 32, 4, 6144, 151936, 40960, 1e6f, 1e-6f, false, false,
     "Qwen3-30B-A3B: 48 layers, d_model 2048, 32/4 heads x 128, 128 experts x 768, 8 used, untied",
     128, true, Rope::kPlain, 0, 128, 8, 768},
    // OLMoE-1B-7B's shape (16 layers, d_model 2048, 16 heads of 128, 64
    // experts of 1024, 8 used, vocab 50304) written as qwen3moe: about 1.3B
    // active of 6.9B.
    {"olmoe-like", "qwen3moe", 16, 2048, 16, 16, 1024, 50304, 4096, 1e4f, 1e-5f, false, false,
     "OLMoE-1B-7B's shape as qwen3moe: 16 layers, d_model 2048, 16 heads x 128, 64 experts x 1024, "
     "8 used", 128, true, Rope::kPlain, 0, 64, 8, 1024},
    // The dense models of the two shapes' active size (a token's 8 experts
    // as one FFN of 8 x the expert width): what routing costs against.
    {"qwen3-30b-a3b-dense", "qwen3", 48, 2048, 32, 4, 6144, 151936, 40960, 1e6f, 1e-6f, false,
     false, "Qwen3-30B-A3B's active size as a dense qwen3: d_ff 6144 (8 experts x 768)", 128, true},
    {"olmoe-like-dense", "qwen3", 16, 2048, 16, 16, 8192, 50304, 4096, 1e4f, 1e-5f, false, false,
     "olmoe-like's active size as a dense qwen3: d_ff 8192 (8 experts x 1024)", 128, true},
    {"tiny-qwen3moe", "qwen3moe", 2, 128, 4, 2, 384, 1024, 512, 1e6f, 1e-6f, false, true,
     "tests: qwen3moe, 2 layers, d_model 128, 4/2 heads x 64, 8 experts x 64, 2 used, tied",
     64, true, Rope::kPlain, 0, 8, 2, 64},
    {"tiny-mixtral", "llama", 2, 128, 4, 2, 64, 768, 512, 1e6f, 1e-5f, false, false,
     "tests: llama with experts (Mixtral), 2 layers, d_model 128, 4/2 heads x 32, 8 experts x 64, "
     "2 used, untied", 0, false, Rope::kPlain, 0, 8, 2, 64},
    // clang-format on
    {"tiny-gemma3", "gemma3", 7, 64, 2, 1, 192, 512, 512, 1e6f, 1e-6f, false, true,
     "tests: gemma3, 7 layers (local 0-4 and 6, global 5), d_model 64, 2/1 heads x 64, "
     "window 32",
     64, true, Rope::kPlain, 32},
};

// Llama 3.1's rope_scaling {"rope_type": "llama3", "factor": 8,
// "low_freq_factor": 1, "high_freq_factor": 4,
// "original_max_position_embeddings": 8192}, as the GGUF converter turns it
// into rope_freqs.weight: one divisor per rotary pair (Meta's published
// formula; also in transformers' _compute_llama3_parameters).
std::vector<float> llama3_rope_factors(int64_t rope_dims, float base) {
  const double factor = 8, low = 1, high = 4, old_ctx = 8192;
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  std::vector<float> out;
  for (int64_t i = 0; i < rope_dims; i += 2) {
    const double freq =
        1.0 / std::pow(static_cast<double>(base), static_cast<double>(i) / rope_dims);
    const double wavelen = 2 * 3.14159265358979323846 / freq;
    if (wavelen < high_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      out.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      out.push_back(static_cast<float>(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return out;
}

const Preset* find_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

std::string preset_names() {
  std::string s;
  for (const Preset& p : kPresets) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

// ---- random values -----------------------------------------------------------

// splitmix64's finalizer: a strong 64-bit mix, used as a counter-based
// generator (the value of element i is mix(key + i)).
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Approximately standard normal: the sum of four 16-bit uniforms (Irwin-Hall,
// n = 4), centred and scaled to unit variance. Its tails stop at +-3.46 sd,
// which suits weights; one 64-bit hash per value, no transcendental.
inline float normalish(uint64_t h) {
  const uint32_t s = static_cast<uint32_t>(h & 0xffff) + static_cast<uint32_t>((h >> 16) & 0xffff) +
                     static_cast<uint32_t>((h >> 32) & 0xffff) + static_cast<uint32_t>(h >> 48);
  // mean 4 * 32767.5, variance 4 * (65536^2 - 1) / 12
  constexpr float kScale = 1.7320508f / 65536.0f;
  return (static_cast<float>(s) - 131070.0f) * kScale;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// How one tensor's values are drawn: offset + std * normal.
struct Dist {
  float offset, std;
};

void fill_f32(float* out, int64_t begin, int64_t n, uint64_t key, Dist d) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = d.offset + d.std * normalish(mix64(key + static_cast<uint64_t>(begin + i)));
}

void fill_f16(uint16_t* out, int64_t begin, int64_t n, uint64_t key, Dist d) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  alignas(32) float tmp[8];
  for (; i + 8 <= n; i += 8) {
    fill_f32(tmp, begin + i, 8, key, d);
    const __m128i h = _mm256_cvtps_ph(_mm256_load_ps(tmp), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) {
    float x;
    fill_f32(&x, begin + i, 1, key, d);
    out[i] = barata::fp32_to_fp16(x);
  }
}

void fill_bf16(uint16_t* out, int64_t begin, int64_t n, uint64_t key, Dist d) {
  for (int64_t i = 0; i < n; ++i) {
    float x;
    fill_f32(&x, begin + i, 1, key, d);
    out[i] = barata::fp32_to_bf16(x);
  }
}

// Runs fn(first, count) over [0, n) in `threads` contiguous parts, each a
// multiple of `grain` (the last takes the rest).
template <typename Fn>
void parallel_for(int64_t n, int64_t grain, int threads, Fn fn) {
  const int64_t units = (n + grain - 1) / grain;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(threads, units));
  if (parts == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errs(static_cast<size_t>(parts));
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t first = units * p / parts * grain;
    const int64_t last = std::min(n, units * (p + 1) / parts * grain);
    pool.emplace_back([&, p, first, last] {
      try {
        fn(first, last - first);
      } catch (...) {
        errs[static_cast<size_t>(p)] = std::current_exception();
      }
    });
  }
  for (auto& t : pool) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

// The bytes of one tensor of `k` x `rows` values (k contiguous) in `type`.
std::vector<uint8_t> make_tensor(DType type, int64_t k, int64_t rows, uint64_t key, Dist d,
                                 int threads) {
  const int64_t n = k * rows;
  std::vector<uint8_t> bytes(barata::dtype_bytes(type, n));
  switch (type) {
    case DType::F32: {
      auto* out = reinterpret_cast<float*>(bytes.data());
      parallel_for(n, 4096, threads,
                   [&](int64_t b, int64_t c) { fill_f32(out + b, b, c, key, d); });
      break;
    }
    case DType::F16: {
      auto* out = reinterpret_cast<uint16_t*>(bytes.data());
      parallel_for(n, 4096, threads,
                   [&](int64_t b, int64_t c) { fill_f16(out + b, b, c, key, d); });
      break;
    }
    case DType::BF16: {
      auto* out = reinterpret_cast<uint16_t*>(bytes.data());
      parallel_for(n, 4096, threads,
                   [&](int64_t b, int64_t c) { fill_bf16(out + b, b, c, key, d); });
      break;
    }
    default: {  // a llama.cpp block type: quantized row by row with its reference quantizer
      const auto& tr = barata::dtype_traits(type);
      const size_t row_bytes = barata::dtype_bytes(type, k);
      parallel_for(rows, 1, threads, [&](int64_t r0, int64_t nr) {
        std::vector<float> row(static_cast<size_t>(k));
        for (int64_t r = r0; r < r0 + nr; ++r) {
          fill_f32(row.data(), r * k, k, key, d);
          tr.quantize_row(row.data(), bytes.data() + static_cast<size_t>(r) * row_bytes, k);
        }
      });
    }
  }
  return bytes;
}

// ---- the vocabulary -------------------------------------------------------------

// A SentencePiece-style ("llama") vocabulary of exactly n tokens: <unk>, <s>,
// </s>, the 256 byte tokens <0x00>..<0xFF> (byte fallback: any text encodes),
// then "▁", the printable ASCII characters alone and after "▁", and lowercase
// strings of growing length, each alone and after "▁", until n. Every token
// is unique; scores fall with the id, so shorter pieces merge first.
struct Vocab {
  std::vector<GgufValue> tokens, scores, types;
};

Vocab make_vocab(int64_t n) {
  constexpr int64_t kFixed = 3 + 256 + 1;
  if (n < kFixed) fail("a vocabulary needs at least {} tokens, got {}", kFixed, n);
  Vocab v;
  v.tokens.reserve(static_cast<size_t>(n));
  v.scores.reserve(static_cast<size_t>(n));
  v.types.reserve(static_cast<size_t>(n));
  auto add = [&](std::string text, float score, int32_t type) {
    v.tokens.emplace_back(std::move(text));
    v.scores.emplace_back(score);
    v.types.emplace_back(type);
  };
  const std::string space = "\xE2\x96\x81";  // U+2581, SentencePiece's word start
  add("<unk>", 0.0f, 2);                     // llama.cpp token types: 2 unknown
  add("<s>", 0.0f, 3);                       // 3 control
  add("</s>", 0.0f, 3);
  for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0.0f, 6);  // 6 byte
  auto piece = [&](std::string text) {
    if (static_cast<int64_t>(v.tokens.size()) >= n) return false;
    add(std::move(text), -static_cast<float>(v.tokens.size() - 259), 1);  // 1 normal
    return true;
  };
  piece(space);
  for (char c = '!'; c <= '~'; ++c) piece(std::string(1, c));
  for (char c = '!'; c <= '~'; ++c) piece(space + std::string(1, c));
  std::string s;
  for (size_t len = 2; static_cast<int64_t>(v.tokens.size()) < n; ++len) {
    s.assign(len, 'a');
    while (true) {
      if (!piece(space + s) || !piece(s)) break;
      size_t i = len;  // the next string of this length, 'z' carrying to the left
      while (i > 0 && s[i - 1] == 'z') s[--i] = 'a';
      if (i == 0) break;
      ++s[i - 1];
    }
  }
  return v;
}

// ---- the model --------------------------------------------------------------------

struct Options {
  std::string preset, type = "F16", out;
  uint64_t seed = 0;
  int64_t layers = 0;
  int threads = 0;
  float std = 0.02f;
  bool list = false, quiet = false;
};

int64_t g_values = 0;  // values generated, for the summary

int run(const Options& o) {
  if (o.list) {
    for (const Preset& p : kPresets) fmt::print("{:14} {}\n", p.name, p.about);
    return 0;
  }
  if (o.preset.empty() || o.out.empty()) fail("--preset and -o are required (see --help)");
  const Preset* pp = find_preset(o.preset);
  if (pp == nullptr) fail("unknown preset '{}'; the presets are: {}", o.preset, preset_names());
  Preset p = *pp;
  if (o.layers > 0) p.n_layer = o.layers;
  const auto type = barata::dtype_from_name(o.type);
  if (!type) fail("unknown --type '{}'", o.type);
  const auto& tr = barata::dtype_traits(*type);
  const bool plain = *type == DType::F32 || *type == DType::F16 || *type == DType::BF16;
  if (!plain &&
      (tr.is_private || tr.quantize_row == nullptr || tr.scope != barata::ScaleScope::kBlock))
    fail(
        "--type {}: barata_synth writes F32, F16, BF16 or a llama.cpp block type; for barata's own "
        "schemes write F16 and run `barata quantize`",
        tr.name);
  const int64_t head_dim = p.head_dim > 0 ? p.head_dim : p.d_model / p.n_head;
  const int64_t q_dim = p.n_head * head_dim, kv_dim = p.n_head_kv * head_dim;
  for (int64_t k : {p.d_model, q_dim, p.n_expert > 0 ? p.d_ff_exp : p.d_ff})
    if (k % tr.block_size != 0)
      fail("--type {}: a row of {} values is not a whole number of {}-value blocks", tr.name, k,
           tr.block_size);
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  const auto t0 = std::chrono::steady_clock::now();
  GgufWriter w;
  const std::string a = std::string(p.arch) + ".";
  w.set("general.architecture", std::string(p.arch));
  w.set("general.name", fmt::format("barata synthetic {}", p.name));
  if (*type == DType::F32) w.set("general.file_type", uint32_t{0});  // llama.cpp's ftype ids
  if (*type == DType::F16) w.set("general.file_type", uint32_t{1});
  w.set("barata.synthetic.preset", std::string(p.name));
  w.set("barata.synthetic.seed", static_cast<uint64_t>(o.seed));
  w.set("barata.synthetic.std", o.std);
  w.set(a + "block_count", static_cast<uint32_t>(p.n_layer));
  w.set(a + "context_length", static_cast<uint32_t>(p.n_ctx));
  w.set(a + "embedding_length", static_cast<uint32_t>(p.d_model));
  w.set(a + "feed_forward_length", static_cast<uint32_t>(p.d_ff));
  w.set(a + "attention.head_count", static_cast<uint32_t>(p.n_head));
  w.set(a + "attention.head_count_kv", static_cast<uint32_t>(p.n_head_kv));
  w.set(a + "rope.freq_base", p.rope_base);
  w.set(a + "attention.layer_norm_rms_epsilon", p.norm_eps);
  if (p.head_dim > 0) {
    w.set(a + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.set(a + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  if (p.window > 0) w.set(a + "attention.sliding_window", static_cast<uint32_t>(p.window));
  if (p.n_expert > 0) {
    w.set(a + "expert_count", static_cast<uint32_t>(p.n_expert));
    w.set(a + "expert_used_count", static_cast<uint32_t>(p.n_expert_used));
    if (std::string(p.arch) == "qwen3moe")
      w.set(a + "expert_feed_forward_length", static_cast<uint32_t>(p.d_ff_exp));
  }
  if (p.rope == Rope::kLongRope) {
    w.set(a + "rope.scaling.original_context_length", static_cast<uint32_t>(p.n_ctx / 4));
    w.set(a + "rope.scaling.attn_factor",
          static_cast<float>(std::sqrt(1.0 + std::log(4.0) / std::log(p.n_ctx / 4.0))));
  }
  if (p.rope == Rope::kLinear || p.rope == Rope::kYarn) {
    w.set(a + "rope.scaling.type", std::string(p.rope == Rope::kLinear ? "linear" : "yarn"));
    w.set(a + "rope.scaling.factor", 4.0f);
    if (p.rope == Rope::kYarn)
      w.set(a + "rope.scaling.original_context_length", static_cast<uint32_t>(p.n_ctx / 4));
  }

  Vocab vocab = make_vocab(p.n_vocab);
  w.set("tokenizer.ggml.model", "llama");
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(vocab.tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::FLOAT32, std::move(vocab.scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::INT32, std::move(vocab.types)));
  w.set("tokenizer.ggml.unknown_token_id", uint32_t{0});
  w.set("tokenizer.ggml.bos_token_id", uint32_t{1});
  w.set("tokenizer.ggml.eos_token_id", uint32_t{2});
  w.set("tokenizer.ggml.add_bos_token", true);

  const uint64_t seed_key = mix64(o.seed ^ 0x6261726174617379ull);  // "baratasy"
  // A matrix or vector: values drawn when the writer reaches it.
  // n_mats > 1: a 3-D tensor of that many matrices (experts), rows after rows.
  auto tensor = [&](const std::string& name, int64_t k, int64_t rows, DType t, Dist d,
                    int64_t n_mats = 1) {
    const uint64_t key = mix64(seed_key ^ fnv1a(name));
    std::vector<int64_t> shape = rows == 1     ? std::vector<int64_t>{k}
                                 : n_mats == 1 ? std::vector<int64_t>{k, rows}
                                               : std::vector<int64_t>{k, rows, n_mats};
    const int64_t all_rows = rows * n_mats;
    w.add_tensor(name, t, shape, GgufWriter::Producer([=] {
                   g_values += k * all_rows;
                   return make_tensor(t, k, all_rows, key, d, threads);
                 }));
  };
  const Dist weight{0.0f, o.std}, gain{1.0f, o.std}, bias{0.0f, o.std};
  tensor("token_embd.weight", p.d_model, p.n_vocab, *type, weight);
  if (p.rope == Rope::kLongRope) {
    const int64_t half = head_dim / 2;
    for (const auto& [name, top] : {std::pair{"rope_factors_long.weight", 8.0},
                                    std::pair{"rope_factors_short.weight", 1.25}}) {
      std::vector<float> f(static_cast<size_t>(half));
      for (int64_t i = 0; i < half; ++i)
        f[static_cast<size_t>(i)] = static_cast<float>(1.0 + (top - 1.0) * i / (half - 1));
      std::vector<uint8_t> bytes(f.size() * 4);
      std::memcpy(bytes.data(), f.data(), bytes.size());
      w.add_tensor(name, DType::F32, {half}, std::move(bytes));
    }
  }
  if (p.rope == Rope::kLlama3) {
    std::vector<float> f = llama3_rope_factors(head_dim, p.rope_base);
    std::vector<uint8_t> bytes(f.size() * 4);
    std::memcpy(bytes.data(), f.data(), bytes.size());
    w.add_tensor("rope_freqs.weight", DType::F32, {static_cast<int64_t>(f.size())},
                 std::move(bytes));
  }
  for (int64_t l = 0; l < p.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    tensor(b + "attn_norm.weight", p.d_model, 1, DType::F32, gain);
    const bool phi3 = std::string(p.arch) == "phi3";  // q/k/v and gate/up fused
    if (phi3) {
      tensor(b + "attn_qkv.weight", p.d_model, q_dim + 2 * kv_dim, *type, weight);
    } else {
      tensor(b + "attn_q.weight", p.d_model, q_dim, *type, weight);
      tensor(b + "attn_k.weight", p.d_model, kv_dim, *type, weight);
      tensor(b + "attn_v.weight", p.d_model, kv_dim, *type, weight);
    }
    if (p.qkv_bias) {
      tensor(b + "attn_q.bias", q_dim, 1, DType::F32, bias);
      tensor(b + "attn_k.bias", kv_dim, 1, DType::F32, bias);
      tensor(b + "attn_v.bias", kv_dim, 1, DType::F32, bias);
    }
    if (p.qk_norm) {
      tensor(b + "attn_q_norm.weight", head_dim, 1, DType::F32, gain);
      tensor(b + "attn_k_norm.weight", head_dim, 1, DType::F32, gain);
    }
    tensor(b + "attn_output.weight", q_dim, p.d_model, *type, weight);
    if (p.window > 0) tensor(b + "post_attention_norm.weight", p.d_model, 1, DType::F32, gain);
    tensor(b + "ffn_norm.weight", p.d_model, 1, DType::F32, gain);
    if (p.n_expert > 0) {
      // The router in F32, as llama.cpp's quantizer leaves it.
      tensor(b + "ffn_gate_inp.weight", p.d_model, p.n_expert, DType::F32, weight);
      tensor(b + "ffn_gate_exps.weight", p.d_model, p.d_ff_exp, *type, weight, p.n_expert);
      tensor(b + "ffn_up_exps.weight", p.d_model, p.d_ff_exp, *type, weight, p.n_expert);
      tensor(b + "ffn_down_exps.weight", p.d_ff_exp, p.d_model, *type, weight, p.n_expert);
    } else if (phi3) {
      tensor(b + "ffn_up.weight", p.d_model, 2 * p.d_ff, *type, weight);
    } else {
      tensor(b + "ffn_gate.weight", p.d_model, p.d_ff, *type, weight);
      tensor(b + "ffn_up.weight", p.d_model, p.d_ff, *type, weight);
    }
    if (p.n_expert == 0) tensor(b + "ffn_down.weight", p.d_ff, p.d_model, *type, weight);
    if (p.window > 0) tensor(b + "post_ffw_norm.weight", p.d_model, 1, DType::F32, gain);
  }
  tensor("output_norm.weight", p.d_model, 1, DType::F32, gain);
  if (!p.tied) tensor("output.weight", p.d_model, p.n_vocab, *type, weight);

  w.write(o.out);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.quiet)
    fmt::print(stderr,
               "barata_synth: {} ({} layers) {}: {} values, {} bytes, seed {}, {:.2f} s on {} "
               "threads -> {}\n",
               p.name, p.n_layer, tr.name, g_values, w.size(), o.seed, secs, threads, o.out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"barata_synth: a GGUF with random weights in a named model shape"};
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });
  Options o;
  app.add_option("--preset", o.preset, "Model shape: " + preset_names());
  app.add_option("--type", o.type, "Matrix type: F16 (default), F32, BF16, Q8_0, Q4_0, ...");
  app.add_option("-o,--output", o.out, "Output GGUF (written atomically)");
  app.add_option("--seed", o.seed, "Random seed (default 0)");
  app.add_option("--layers", o.layers, "Override the preset's layer count")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("-t,--threads", o.threads, "Threads (default: hardware threads)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--std", o.std, "Standard deviation of the weights (default 0.02)")
      ->check(CLI::Range(0.0f, 10.0f));
  app.add_flag("--list", o.list, "List the presets and exit");
  app.add_flag("-q,--quiet", o.quiet, "No summary line on stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run(o);
  } catch (const barata::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: internal: {}\n", e.what());
    return 2;
  }
}
