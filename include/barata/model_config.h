// The shape of a decoder-only transformer, read from `<arch>.*` metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "barata/gguf.h"

namespace barata {

enum class RopeStyle { kNormal, kNeox };  // llama pairs (2i, 2i+1); NeoX pairs (i, i + d/2)

struct ModelConfig {
  std::string arch;            // "llama" | "qwen2"
  int64_t n_layer = 0;         // transformer blocks
  int64_t d_model = 0;         // residual width (embedding_length)
  int64_t n_head = 0;          // query heads
  int64_t n_head_kv = 0;       // key/value heads (GQA when < n_head)
  int64_t head_dim = 0;        // per head; d_model / n_head unless the file says otherwise
  int64_t d_ff = 0;            // MLP hidden width (feed_forward_length)
  int64_t n_ctx_train = 0;     // context_length the model was trained with
  int64_t n_vocab = 0;         // rows of token_embd
  float rope_base = 10000.0f;  // rope.freq_base (float32 in the file, as llama.cpp keeps it)
  int64_t rope_dims = 0;       // rope.dimension_count; head_dim unless given
  RopeStyle rope_style = RopeStyle::kNormal;
  float norm_eps = 1e-5f;        // attention.layer_norm_rms_epsilon
  bool tied_embeddings = false;  // no output.weight: logits reuse token_embd
  bool qkv_bias = false;         // attn_q/k/v.bias present (qwen2)

  // fp16 K and V for every layer: 2 x n_layer x n_head_kv x head_dim x 2 bytes.
  int64_t kv_bytes_per_token(int64_t bytes_per_element = 2) const {
    return 2 * n_layer * n_head_kv * head_dim * bytes_per_element;
  }

  // Throws barata::Error naming the key or the unsupported architecture.
  static ModelConfig from_gguf(const GgufFile& f);
  static const std::vector<std::string>& supported_architectures();
};

}  // namespace barata
