// Qwen3 (dense). Source: llama.cpp's LLM_ARCH_QWEN3 (build of 2025-08) and
// Qwen3's modeling code: no q/k/v biases; an RMSNorm over each query and key
// head (attn_q_norm / attn_k_norm, head_dim gains, the model's rms epsilon)
// after the projections and before RoPE; NeoX rotary pairs; the head width
// comes from attention.key_length (128 with d_model 1024 for Qwen3-0.6B).
#include "arch/rows.h"

namespace barata::arch {

const ArchSpec kQwen3{
    .name = "qwen3",
    .rope_style = RopeStyle::kNeox,
    .qkv_bias = Presence::kNo,
    .qk_norm = Presence::kYes,
    .rope_freqs = Presence::kNo,
    .chat = "chatml",
    .about = "Qwen3: pre-norm, SwiGLU, per-head q/k RMSNorm, RoPE (NeoX pairs)",
};

}  // namespace barata::arch
