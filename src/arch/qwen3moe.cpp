// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B). Source: llama.cpp's
// LLM_ARCH_QWEN3MOE (build of 2025-08, llm_build_qwen3moe) and Qwen3-MoE's
// config.json: Qwen3's attention (no biases, per-head q/k RMSNorm before
// RoPE, NeoX pairs, head width from attention.key_length), and in every
// layer a mixture of experts in place of the dense FFN: the router
// ffn_gate_inp (expert_count x d_model), softmax over all experts, the top
// expert_used_count (8 of 128 for 30B-A3B), their probabilities normalised
// to sum 1 (norm_w = true, no scale), each expert a SwiGLU FFN of
// expert_feed_forward_length (768 for 30B-A3B; without the key,
// feed_forward_length / expert_used_count), no shared expert.
#include "arch/rows.h"

namespace barata::arch {

const ArchSpec kQwen3Moe{
    .name = "qwen3moe",
    .rope_style = RopeStyle::kNeox,
    .qkv_bias = Presence::kNo,
    .qk_norm = Presence::kYes,
    .rope_freqs = Presence::kNo,
    .experts = Presence::kYes,
    .expert_weights_norm = true,
    .expert_width_split = true,
    .chat = "chatml",
    .about =
        "Qwen3-MoE: Qwen3's attention, a mixture of SwiGLU experts (softmax, top-k, normalised)",
};

}  // namespace barata::arch
