#include "barata/model_config.h"

#include <algorithm>

#include <fmt/ranges.h>

#include "barata/error.h"

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
    fail("{}: unsupported architecture '{}' (supported: {})", f.name(), c.arch,
         fmt::join(archs, ", "));
  const std::string a = c.arch + ".";
  auto positive = [&](const std::string& key, int64_t v) {
    if (v <= 0) fail("{}: metadata key '{}' is {}, expected a positive value", f.name(), key, v);
    return v;
  };
  c.n_layer = positive(a + "block_count", f.get_int(a + "block_count"));
  c.d_model = positive(a + "embedding_length", f.get_int(a + "embedding_length"));
  c.n_head = positive(a + "attention.head_count", f.get_int(a + "attention.head_count"));
  c.n_head_kv = positive(a + "attention.head_count_kv",
                         f.get_int_opt(a + "attention.head_count_kv").value_or(c.n_head));
  c.d_ff = positive(a + "feed_forward_length", f.get_int(a + "feed_forward_length"));
  c.n_ctx_train = positive(a + "context_length", f.get_int(a + "context_length"));
  c.head_dim = positive(a + "attention.key_length",
                        f.get_int_opt(a + "attention.key_length").value_or(c.d_model / c.n_head));
  if (c.n_head % c.n_head_kv != 0)
    fail("{}: {} query heads is not a multiple of {} key/value heads", f.name(), c.n_head,
         c.n_head_kv);
  c.rope_base = static_cast<float>(f.get_number_opt(a + "rope.freq_base").value_or(10000.0));
  c.rope_dims = f.get_int_opt(a + "rope.dimension_count").value_or(c.head_dim);
  c.rope_style = c.arch == "qwen2" ? RopeStyle::kNeox : RopeStyle::kNormal;
  c.norm_eps =
      static_cast<float>(f.get_number_opt(a + "attention.layer_norm_rms_epsilon").value_or(1e-5));

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (embd != nullptr && embd->shape.size() == 2) {
    c.n_vocab = embd->shape[1];
  } else if (auto v = f.get_int_opt(a + "vocab_size")) {
    c.n_vocab = *v;
  } else if (f.has("tokenizer.ggml.tokens")) {
    c.n_vocab = static_cast<int64_t>(f.get<GgufArray>("tokenizer.ggml.tokens").items.size());
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  return c;
}

}  // namespace barata
