#include "barata/model_config.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "barata/error.h"
#include "barata/file_io.h"

namespace barata {
namespace {

// The `<arch>.*` keys barata reads (below). Any other key under the
// architecture's prefix may change the arithmetic (a sliding window, experts,
// soft-capping, ...), so a file that has one is refused, naming it, rather
// than run without it.
constexpr std::string_view kKnownKeys[] = {
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "vocab_size",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "rope.freq_base",
    "rope.dimension_count",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scale_linear",  // the older spelling of rope.scaling.factor
    "rope.scaling.original_context_length",
    "rope.scaling.attn_factor",
    "rope.scaling.finetuned",  // informational: whether the model was tuned on the scaled context
};

void refuse_unknown_keys(const GgufFile& f, const std::string& arch, const ArchSpec& spec) {
  const std::string prefix = arch + ".";
  for (const auto& [key, value] : f.metadata()) {
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string_view rest = std::string_view(key).substr(prefix.size());
    if (std::find(std::begin(kKnownKeys), std::end(kKnownKeys), rest) != std::end(kKnownKeys))
      continue;
    if (rest == "attention.sliding_window" && (spec.swa_pattern > 0 || spec.ignores_sliding_window))
      continue;
    if (spec.experts != Presence::kNo &&
        (rest == "expert_count" || rest == "expert_used_count" ||
         rest == "expert_feed_forward_length" || rest == "expert_weights_norm" ||
         rest == "expert_weights_scale" || rest == "expert_gating_func"))
      continue;  // read_experts
    // Keys that some converters write with their neutral value.
    if ((rest == "expert_count" || rest == "expert_used_count") && f.get_int_opt(key) == 0)
      continue;
    fail(
        "{}: metadata key '{}' is not supported by barata's {} architecture (it may change the "
        "arithmetic; barata refuses rather than run without it)",
        f.name(), printable(key), arch);
  }
}

// A 1-D tensor of RoPE frequency divisors, rope_dims / 2 finite positive values.
std::vector<float> read_rope_factors(const GgufFile& f, const ModelConfig& c,
                                     const std::string& name) {
  const GgufTensorInfo& t = *f.find_tensor(name);
  const int64_t want = c.rope_dims / 2;
  if (t.shape.size() != 1 || t.shape[0] != want)
    fail("{}: tensor {} has {} values; {}.rope.dimension_count = {} needs {}", f.name(), name,
         t.n_elements, c.arch, c.rope_dims, want);
  std::vector<float> v(static_cast<size_t>(want), 1.0f);
  if (t.data != nullptr) dequantize_tensor_row(t.type, t.data, want, 0, v.data());
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]) || v[i] <= 0.0f)
      fail("{}: tensor {} value {} is {}, expected a finite number above 0", f.name(), name, i,
           v[i]);
  return v;
}

RopeScaling read_rope_scaling(const GgufFile& f, const std::string& a, int64_t n_ctx_train) {
  RopeScaling r;
  // llama.cpp's default type is "linear", which with no factor is the plain rotation.
  const std::string key_type = a + "rope.scaling.type";
  std::string type = "linear";
  if (f.has(key_type)) type = f.get<std::string>(key_type);
  if (type == "none") {
    r.type = RopeScalingType::kNone;
  } else if (type == "linear") {
    r.type = RopeScalingType::kLinear;
  } else if (type == "yarn") {
    r.type = RopeScalingType::kYarn;
  } else {
    fail("{}: metadata key '{}' is '{}': barata knows none, linear and yarn", f.name(), key_type,
         printable(type));
  }
  std::string key_factor = a + "rope.scaling.factor";
  auto factor = f.get_number_opt(key_factor);
  if (!factor) {
    key_factor = a + "rope.scale_linear";
    factor = f.get_number_opt(key_factor);
  }
  if (factor && *factor != 0.0) {
    if (!std::isfinite(*factor) || *factor < 1e-3 || *factor > 1e6)
      fail("{}: metadata key '{}' is {}, expected a finite number from 0.001 to 1e6", f.name(),
           key_factor, *factor);
    // As llama.cpp: scaling type none never scales.
    if (r.type != RopeScalingType::kNone) r.freq_scale = static_cast<float>(1.0 / *factor);
  }
  r.n_ctx_orig = n_ctx_train;
  const std::string key_orig = a + "rope.scaling.original_context_length";
  if (auto o = f.get_int_opt(key_orig)) {
    if (*o <= 0 || *o > (int64_t{1} << 32))
      fail("{}: metadata key '{}' is {}, expected 1 to 2^32", f.name(), key_orig, *o);
    r.n_ctx_orig = *o;
  }
  const std::string key_attn = a + "rope.scaling.attn_factor";
  if (auto af = f.get_number_opt(key_attn)) {
    if (!std::isfinite(*af) || *af <= 0.0 || *af > 100.0)
      fail("{}: metadata key '{}' is {}, expected a finite number in (0, 100]", f.name(), key_attn,
           *af);
    r.attn_factor = static_cast<float>(*af);
  }
  r.ext_factor = r.type == RopeScalingType::kYarn ? 1.0f : 0.0f;
  return r;
}

// The mixture of experts: counts, the expert width and how the router's
// choices are weighed. barata weighs as llama.cpp does for the architecture
// (the row); a file that states another rule is refused, naming its key,
// rather than run by a rule it contradicts.
void read_experts(const GgufFile& f, const std::string& a, ModelConfig& c) {
  const ArchSpec& spec = *c.spec;
  const auto count = f.get_int_opt(a + "expert_count");
  if (spec.experts == Presence::kNo || !count || *count == 0) {
    if (spec.experts == Presence::kYes)
      fail("{}: metadata key '{}' is {}; every {} file has experts (1 to 1024)", f.name(),
           a + "expert_count", count ? fmt::format("{}", *count) : std::string("missing"), c.arch);
    return;
  }
  if (*count < 1 || *count > 1024)
    fail("{}: metadata key '{}' is {}, expected 1 to 1024", f.name(), a + "expert_count", *count);
  c.n_expert = *count;
  const std::string used_key = a + "expert_used_count";
  const auto used = f.get_int_opt(used_key);
  if (!used)
    fail("{}: metadata key '{}' is missing ({} = {})", f.name(), used_key, a + "expert_count",
         c.n_expert);
  if (*used < 1 || *used > c.n_expert)
    fail("{}: metadata key '{}' is {}, expected 1 to {} = {}", f.name(), used_key, *used,
         a + "expert_count", c.n_expert);
  c.n_expert_used = *used;
  const std::string width_key = a + "expert_feed_forward_length";
  if (auto w = f.get_int_opt(width_key)) {
    if (*w <= 0 || *w > (int64_t{1} << 20))
      fail("{}: metadata key '{}' is {}, expected 1 to {}", f.name(), width_key, *w,
           int64_t{1} << 20);
    c.d_ff_exp = *w;
  } else if (spec.expert_width_split) {
    c.d_ff_exp = c.d_ff / c.n_expert_used;
    if (c.d_ff_exp == 0)
      fail("{}: {} is missing and {} = {} / {} = {} gives no expert width", f.name(), width_key,
           a + "feed_forward_length", c.d_ff, used_key, c.n_expert_used);
  } else {
    c.d_ff_exp = c.d_ff;
  }
  c.expert_weights_norm = spec.expert_weights_norm;
  const std::string norm_key = a + "expert_weights_norm";
  if (f.has(norm_key) && f.get<bool>(norm_key) != spec.expert_weights_norm)
    fail("{}: metadata key '{}' is {}, but {} experts are weighed with it {} (as llama.cpp)",
         f.name(), norm_key, f.get<bool>(norm_key), c.arch, spec.expert_weights_norm);
  const std::string scale_key = a + "expert_weights_scale";
  if (auto s = f.get_number_opt(scale_key); s && *s != 0.0 && *s != 1.0)
    fail("{}: metadata key '{}' is {}, but {} experts are weighed unscaled (as llama.cpp)",
         f.name(), scale_key, *s, c.arch);
  const std::string gating_key = a + "expert_gating_func";
  if (auto g = f.get_int_opt(gating_key); g && *g != 1)  // llama.cpp: 1 softmax, 2 sigmoid
    fail("{}: metadata key '{}' is {}, but {} routes by softmax (1)", f.name(), gating_key, *g,
         c.arch);
}

}  // namespace

const char* rope_scaling_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "?";
}

const std::vector<std::string>& ModelConfig::supported_architectures() {
  static const std::vector<std::string> kArchs = [] {
    std::vector<std::string> v;
    for (const ArchSpec& a : architectures()) v.emplace_back(a.name);
    return v;
  }();
  return kArchs;
}

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch = f.get<std::string>("general.architecture");
  c.spec = find_architecture(c.arch);
  if (c.spec == nullptr)
    fail("{}: unsupported architecture '{}' (supported: {})", f.name(), printable(c.arch),
         architecture_names());
  const ArchSpec& spec = *c.spec;
  refuse_unknown_keys(f, c.arch, spec);
  const std::string a = c.arch + ".";
  // Every size is range-checked before anything is sized by it: a hostile
  // file must not make barata allocate (or loop) in proportion to a number
  // it merely states. The bounds are far beyond any released model.
  auto in_range = [&](const std::string& key, int64_t v, int64_t hi) {
    if (v <= 0 || v > hi)
      fail("{}: metadata key '{}' is {}, expected 1 to {}", f.name(), key, v, hi);
    return v;
  };
  auto get = [&](const std::string& key, int64_t hi) { return in_range(key, f.get_int(key), hi); };
  constexpr int64_t kMaxWidth = int64_t{1} << 20;  // widths, heads, head dims
  c.n_layer = get(a + "block_count", 4096);
  c.d_model = get(a + "embedding_length", kMaxWidth);
  c.n_head = get(a + "attention.head_count", kMaxWidth);
  c.n_head_kv =
      in_range(a + "attention.head_count_kv",
               f.get_int_opt(a + "attention.head_count_kv").value_or(c.n_head), kMaxWidth);
  c.d_ff = get(a + "feed_forward_length", kMaxWidth);
  c.n_ctx_train = get(a + "context_length", int64_t{1} << 32);
  read_experts(f, a, c);
  if (auto kl = f.get_int_opt(a + "attention.key_length")) {
    c.head_dim = in_range(a + "attention.key_length", *kl, kMaxWidth);
  } else {
    if (c.d_model % c.n_head != 0)
      fail("{}: {} = {} is not a multiple of {} = {} (and no {} gives the head dim)", f.name(),
           a + "embedding_length", c.d_model, a + "attention.head_count", c.n_head,
           a + "attention.key_length");
    c.head_dim = c.d_model / c.n_head;
  }
  if (auto vl = f.get_int_opt(a + "attention.value_length"); vl && *vl != c.head_dim)
    fail("{}: {} = {} differs from the key length {}; barata needs them equal", f.name(),
         a + "attention.value_length", *vl, c.head_dim);
  if (c.n_head_kv > c.n_head || c.n_head % c.n_head_kv != 0)
    fail("{}: {} query heads is not a multiple of {} key/value heads", f.name(), c.n_head,
         c.n_head_kv);
  if (c.n_head * c.head_dim > kMaxWidth * 16)
    fail("{}: {} heads of {} is a query width of {}, beyond the {} barata allows", f.name(),
         c.n_head, c.head_dim, c.n_head * c.head_dim, kMaxWidth * 16);

  const double base = f.get_number_opt(a + "rope.freq_base").value_or(10000.0);
  if (!std::isfinite(base) || base <= 1.0 || base > 1e12)
    fail("{}: metadata key '{}' is {}, expected a finite number above 1", f.name(),
         a + "rope.freq_base", base);
  c.rope_base = static_cast<float>(base);
  c.rope_dims = f.get_int_opt(a + "rope.dimension_count").value_or(c.head_dim);
  if (c.rope_dims <= 0 || c.rope_dims > c.head_dim || c.rope_dims % 2 != 0)
    fail("{}: metadata key '{}' is {}, expected an even number from 2 to the head dim {}", f.name(),
         a + "rope.dimension_count", c.rope_dims, c.head_dim);
  c.rope_style = spec.rope_style;
  c.rope_scaling = read_rope_scaling(f, a, c.n_ctx_train);
  c.post_norms = spec.post_norms == Presence::kYes;
  c.glu = spec.glu;
  c.embed_scale = spec.embed_scale ? std::sqrt(static_cast<float>(c.d_model)) : 1.0f;
  // As llama.cpp: Gemma 3's 27B (62 layers) scales by its d_model / n_head.
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (c.arch == "gemma3" && c.n_layer == 62)
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.d_model / c.n_head));
  if (spec.swa_pattern > 0) {
    const std::string key = a + "attention.sliding_window";
    c.n_swa = in_range(key, f.get_int(key), int64_t{1} << 32);
    if (c.n_swa > c.n_ctx_train)
      fail("{}: {} = {} is larger than {} = {}", f.name(), key, c.n_swa, a + "context_length",
           c.n_ctx_train);
    c.swa_layers.resize(static_cast<size_t>(c.n_layer));
    for (int64_t l = 0; l < c.n_layer; ++l)
      c.n_swa_layers += c.swa_layers[static_cast<size_t>(l)] =
          l % spec.swa_pattern < spec.swa_pattern - 1;
    c.rope_base_swa = spec.rope_base_swa > 0.0f ? spec.rope_base_swa : c.rope_base;
  }
  const double eps = f.get_number_opt(a + "attention.layer_norm_rms_epsilon").value_or(1e-5);
  if (!std::isfinite(eps) || eps <= 0.0 || eps >= 1.0)
    fail("{}: metadata key '{}' is {}, expected a finite number in (0, 1)", f.name(),
         a + "attention.layer_norm_rms_epsilon", eps);
  c.norm_eps = static_cast<float>(eps);

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd != nullptr && embd->shape.size() == 2) {
    c.n_vocab = embd->shape[1];
  } else if (auto v = f.get_int_opt(a + "vocab_size")) {
    c.n_vocab = in_range(a + "vocab_size", *v, int64_t{1} << 31);
  } else if (f.has("tokenizer.ggml.tokens")) {
    c.n_vocab = static_cast<int64_t>(f.get<GgufArray>("tokenizer.ggml.tokens").items.size());
  }
  // The tokenizer and the embedding must agree on the vocabulary, as
  // llama.cpp requires: an id the embedding lacks cannot be run, and an id
  // the tokenizer lacks cannot be printed.
  if (f.has("tokenizer.ggml.tokens")) {
    const auto n_tokens = f.get<GgufArray>("tokenizer.ggml.tokens").items.size();
    if (c.n_vocab != 0 && static_cast<int64_t>(n_tokens) != c.n_vocab)
      fail("{}: the tokenizer has {} tokens but token_embd.weight has {} rows", f.name(), n_tokens,
           c.n_vocab);
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  // Optional per-layer tensors: the file says, through layer 0 (Model checks
  // that every layer agrees: present in all or in none).
  auto presence = [&](Presence p, const char* tensor, const char* what) {
    const bool has = f.find_tensor(tensor) != nullptr;
    if (p == Presence::kNo && has)
      fail("{}: tensor {} ({}) is not part of barata's {} architecture", f.name(), tensor, what,
           c.arch);
    if (p == Presence::kYes && !has)
      fail("{}: tensor {} ({}) is missing; every {} file has it", f.name(), tensor, what, c.arch);
    return has;
  };
  c.qkv_bias = presence(spec.qkv_bias, "blk.0.attn_q.bias", "q/k/v biases");
  c.qk_norm = presence(spec.qk_norm, "blk.0.attn_q_norm.weight", "per-head q/k norms");
  if (presence(spec.rope_freqs, "rope_freqs.weight", "RoPE frequency factors"))
    c.rope_freq_factors = read_rope_factors(f, c, "rope_freqs.weight");
  if (presence(spec.rope_long_short, "rope_factors_long.weight", "LongRoPE factors")) {
    c.rope_factors_long = read_rope_factors(f, c, "rope_factors_long.weight");
    if (f.find_tensor("rope_factors_short.weight") == nullptr)
      fail("{}: tensor rope_factors_short.weight is missing (rope_factors_long.weight is there)",
           f.name());
    c.rope_factors_short = read_rope_factors(f, c, "rope_factors_short.weight");
  } else if (spec.rope_long_short != Presence::kNo) {
    presence(Presence::kNo, "rope_factors_short.weight", "LongRoPE factors without the long ones");
  }
  c.fused_qkv = presence(spec.fused_qkv, "blk.0.attn_qkv.weight", "fused q/k/v");
  c.fused_gate_up = spec.fused_gate_up;
  if (spec.ignores_sliding_window && f.has(a + "attention.sliding_window"))
    spdlog::warn(
        "{}: {}.attention.sliding_window is not applied (as in llama.cpp: the file does not say "
        "which layers use it); long contexts may differ from the model's training",
        f.name(), c.arch);
  return c;
}

}  // namespace barata
