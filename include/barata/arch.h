// The architectures barata runs, as rows of a table (the way DType is a row
// of its traits): what a file of that architecture holds and which optional
// steps its layer takes. The one forward pass (Engine::run) reads the row's
// flags from ModelConfig; nothing else in the program asks for an
// architecture by name. Each row lives in its own file, src/arch/<name>.cpp,
// with where its facts come from.
//
// Adding an architecture: a row, any tensor its loader must name, and only
// the kernels that are truly new.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace barata {

enum class RopeStyle { kNormal, kNeox };  // llama pairs (2i, 2i+1); NeoX pairs (i, i + d/2)

// Whether an architecture's files hold a tensor (or key): never, may, must.
enum class Presence { kNo, kOptional, kYes };

// The gated FFN's activation: silu(gate) * up, or GELU (tanh form) * up.
enum class Glu { kSwiGLU, kGeGLU };

struct ArchSpec {
  std::string_view name;  // general.architecture
  RopeStyle rope_style = RopeStyle::kNormal;
  // blk.N.attn_{q,k,v}.bias, added after the projections.
  Presence qkv_bias = Presence::kNo;
  // blk.N.attn_{q,k}_norm.weight (head_dim): an RMSNorm of every query and
  // key head over its head_dim values, after the projections and before RoPE.
  Presence qk_norm = Presence::kNo;
  // rope_freqs.weight (rope_dims / 2): divisors of RoPE's per-pair
  // frequencies (Llama 3.1's "llama3" rope_scaling, baked by the converter).
  Presence rope_freqs = Presence::kNo;
  // blk.N.post_attention_norm / post_ffw_norm (d_model): an RMSNorm of the
  // attention output and of the FFN output before each residual add.
  Presence post_norms = Presence::kNo;
  Glu glu = Glu::kSwiGLU;
  // blk.N.attn_qkv.weight: q, k and v as one matrix (rows q, then k, then
  // v); without it the three are separate.
  Presence fused_qkv = Presence::kNo;
  // blk.N.ffn_up.weight holds 2 d_ff rows, the gate's then up's (no ffn_gate).
  bool fused_gate_up = false;
  // rope_factors_long.weight / rope_factors_short.weight (Phi-3's LongRoPE):
  // frequency divisors as rope_freqs, the long ones when the context asked
  // for is beyond rope.scaling.original_context_length.
  Presence rope_long_short = Presence::kNo;
  // attention.sliding_window is read and not applied (llama.cpp's choice
  // for Phi-3, said with a warning at load).
  bool ignores_sliding_window = false;
  bool embed_scale = false;  // the embedding rows times sqrt(d_model)
  // Sliding-window layers, from attention.sliding_window (required when
  // nonzero): layer l attends to the last `window` positions when
  // l % swa_pattern < swa_pattern - 1 (Gemma 3: 6, five local layers to one
  // global); 0: every layer sees the whole context.
  int swa_pattern = 0;
  float rope_base_swa = 0.0f;  // the local layers' RoPE base, unscaled (0: the file's)
  // The chat format of the family, for a file with no tokenizer.chat_template
  // ("" where the architecture spans families: llama).
  // Mixture of experts (ffn_gate_inp, ffn_{gate,up,down}_exps in place of
  // the dense FFN) when `<arch>.expert_count` > 0: never, may (llama:
  // Mixtral), must (qwen3moe).
  Presence experts = Presence::kNo;
  // How a token's experts are weighed (llama.cpp's build_moe_ffn as each
  // architecture calls it): softmax over every expert's router logit, the
  // top expert_used_count by probability, their probabilities divided by
  // their sum when expert_weights_norm.
  bool expert_weights_norm = false;
  // No `<arch>.expert_feed_forward_length`: the expert width is
  // feed_forward_length / expert_used_count (qwen3moe, as llama.cpp), else
  // feed_forward_length itself (Mixtral).
  bool expert_width_split = false;
  std::string_view chat;
  std::string_view about;  // one line for `barata inspect`
};

std::span<const ArchSpec> architectures();
const ArchSpec* find_architecture(std::string_view name);  // null when barata has no such row
std::string architecture_names();                          // "llama, qwen2, qwen3"

}  // namespace barata
