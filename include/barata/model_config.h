// The shape of a decoder-only transformer, read from `<arch>.*` metadata.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "barata/arch.h"
#include "barata/gguf.h"

namespace barata {

// RoPE frequency scaling from `<arch>.rope.scaling.*` (llama.cpp's meaning:
// src/llama-model.cpp, ggml's rope_yarn). kNone and kLinear with factor 1
// are the plain rotation.
enum class RopeScalingType { kNone, kLinear, kYarn };
const char* rope_scaling_name(RopeScalingType t);  // "none", "linear", "yarn"

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float freq_scale = 1.0f;   // 1 / rope.scaling.factor: positions are multiplied by it
  int64_t n_ctx_orig = 0;    // rope.scaling.original_context_length (YaRN's ramp)
  float ext_factor = 0.0f;   // YaRN's extrapolation mix: 1 for yarn, 0 otherwise
  float attn_factor = 1.0f;  // rope.scaling.attn_factor: cos and sin are scaled by it
  float beta_fast = 32.0f, beta_slow = 1.0f;  // YaRN's ramp ends (llama.cpp's defaults)
};

struct ModelConfig {
  std::string arch;                // general.architecture, a row of architectures()
  const ArchSpec* spec = nullptr;  // that row
  int64_t n_layer = 0;             // transformer blocks
  int64_t d_model = 0;             // residual width (embedding_length)
  int64_t n_head = 0;              // query heads
  int64_t n_head_kv = 0;           // key/value heads (GQA when < n_head)
  int64_t head_dim = 0;            // per head; d_model / n_head unless the file says otherwise
  int64_t d_ff = 0;                // MLP hidden width (feed_forward_length)
  // Mixture of experts (expert_count > 0): every layer's FFN is n_expert
  // SwiGLU experts of d_ff_exp rows, n_expert_used of them per token.
  int64_t n_expert = 0;              // expert_count; 0: a dense FFN
  int64_t n_expert_used = 0;         // expert_used_count
  int64_t d_ff_exp = 0;              // an expert's hidden width
  bool expert_weights_norm = false;  // the chosen probabilities divided by their sum
  bool moe() const { return n_expert > 0; }
  int64_t n_ctx_train = 0;     // context_length the model was trained with
  int64_t n_vocab = 0;         // rows of token_embd
  float rope_base = 10000.0f;  // rope.freq_base (float32 in the file, as llama.cpp keeps it)
  int64_t rope_dims = 0;       // rope.dimension_count; head_dim unless given
  RopeStyle rope_style = RopeStyle::kNormal;
  RopeScaling rope_scaling;
  // rope_freqs.weight (rope_dims / 2 divisors of the pair frequencies, Llama
  // 3.1+); empty when the file has none. Read here because every backend's
  // RoPE tables come from the config (rope_tables in backend.h).
  std::vector<float> rope_freq_factors;
  // Phi-3's LongRoPE divisors (rope_factors_long / _short.weight); empty when
  // the file has none. rope_tables takes the long ones for a context beyond
  // rope_scaling.n_ctx_orig.
  std::vector<float> rope_factors_long, rope_factors_short;
  float norm_eps = 1e-5f;        // attention.layer_norm_rms_epsilon
  bool tied_embeddings = false;  // no output.weight: logits reuse token_embd
  bool qkv_bias = false;         // attn_q/k/v.bias present (qwen2; optional for llama)
  bool qk_norm = false;          // attn_q_norm / attn_k_norm per head before RoPE (qwen3, gemma3)
  bool post_norms = false;       // post_attention_norm / post_ffw_norm before the residual adds
  bool fused_qkv = false;        // attn_qkv.weight: q, k, v rows in one matrix (phi3)
  bool fused_gate_up = false;    // ffn_up.weight: the gate's d_ff rows, then up's (phi3)
  Glu glu = Glu::kSwiGLU;        // the FFN's gate activation
  float embed_scale = 1.0f;      // embedding rows times this (gemma: sqrt(d_model))
  float attn_scale = 0.0f;       // the q.k scale: 1 / sqrt(head_dim) unless the row says
  // Sliding-window attention: a windowed layer's query at position p sees
  // positions (p - n_swa, p]. n_swa = 0: none.
  int64_t n_swa = 0;
  std::vector<uint8_t> swa_layers;  // per layer, 1 when windowed
  int64_t n_swa_layers = 0;         // how many of them are
  float rope_base_swa = 0.0f;       // the windowed layers' RoPE base (no scaling, no factors)
  bool is_swa(int64_t layer) const {
    return n_swa > 0 && swa_layers[static_cast<size_t>(layer)] != 0;
  }

  // fp16 K and V for every layer: 2 x n_layer x n_head_kv x head_dim x 2 bytes.
  int64_t kv_bytes_per_token(int64_t bytes_per_element = 2) const {
    return 2 * n_layer * n_head_kv * head_dim * bytes_per_element;
  }

  // Positions one query at position pos attends to, summed over the layers
  // (a windowed layer sees at most n_swa of them).
  int64_t attended_positions(int64_t pos) const {
    const int64_t full = pos + 1;
    if (n_swa == 0) return n_layer * full;
    return (n_layer - n_swa_layers) * full + n_swa_layers * std::min(full, n_swa);
  }

  // Throws barata::Error naming the key or the unsupported architecture.
  static ModelConfig from_gguf(const GgufFile& f);
  static const std::vector<std::string>& supported_architectures();
};

}  // namespace barata
