// Llama (1, 2, 3.x), Mistral 7B v0.2+, SmolLM2 and every model the GGUF
// converter writes as arch "llama". Source of the facts: llama.cpp's
// LLM_ARCH_LLAMA (src/llama-model.cpp, llama-arch.cpp): rotary pairs
// (2i, 2i+1) (LLAMA_ROPE_TYPE_NORM), q/k/v biases optional (some fine-tunes
// carry them), rope_freqs.weight optional (Llama 3.1+: the converter bakes
// rope_scaling {"rope_type": "llama3"} into per-pair frequency divisors).
// Mixtral is arch "llama" with `llama.expert_count` > 0: every layer's FFN
// is experts of feed_forward_length rows, weighed by the softmax of the
// router, top expert_used_count, normalised (build_moe_ffn called with
// norm_w = true, no scale, LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX).
#include "arch/rows.h"

namespace barata::arch {

const ArchSpec kLlama{
    .name = "llama",
    .rope_style = RopeStyle::kNormal,
    .qkv_bias = Presence::kOptional,
    .qk_norm = Presence::kNo,
    .rope_freqs = Presence::kOptional,
    .experts = Presence::kOptional,
    .expert_weights_norm = true,
    .chat = "",
    .about =
        "Llama 1/2/3.x, Mistral, SmolLM2, Mixtral: pre-norm, SwiGLU (or experts), RoPE (normal "
        "pairs)",
};

}  // namespace barata::arch
