// Qwen2 and Qwen2.5. Source: llama.cpp's LLM_ARCH_QWEN2 and Qwen2's
// config.json / modeling code: q, k and v projections with biases (always
// present), NeoX rotary pairs (i, i + d/2) (LLAMA_ROPE_TYPE_NEOX).
#include "arch/rows.h"

namespace barata::arch {

const ArchSpec kQwen2{
    .name = "qwen2",
    .rope_style = RopeStyle::kNeox,
    .qkv_bias = Presence::kYes,
    .qk_norm = Presence::kNo,
    .rope_freqs = Presence::kNo,
    .chat = "chatml",
    .about = "Qwen2, Qwen2.5: pre-norm, SwiGLU, q/k/v biases, RoPE (NeoX pairs)",
};

}  // namespace barata::arch
