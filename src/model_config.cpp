#include "barata/model_config.h"

#include <algorithm>
#include <cmath>

#include <fmt/ranges.h>

#include "barata/error.h"
#include "barata/file_io.h"

namespace barata {

const std::vector<std::string>& ModelConfig::supported_architectures() {
  static const std::vector<std::string> kArchs = {"llama", "qwen2"};
  return kArchs;
}

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch = f.get<std::string>("general.architecture");
  const auto& archs = supported_architectures();
  if (std::find(archs.begin(), archs.end(), c.arch) == archs.end())
    fail("{}: unsupported architecture '{}' (supported: {})", f.name(), printable(c.arch),
         fmt::join(archs, ", "));
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
  c.rope_style = c.arch == "qwen2" ? RopeStyle::kNeox : RopeStyle::kNormal;
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
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  return c;
}

}  // namespace barata
