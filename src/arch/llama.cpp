// Llama (1, 2, 3.x), Mistral 7B v0.2+, SmolLM2 and every model the GGUF
// converter writes as arch "llama". Source of the facts: llama.cpp's
// LLM_ARCH_LLAMA (src/llama-model.cpp, llama-arch.cpp): rotary pairs
// (2i, 2i+1) (LLAMA_ROPE_TYPE_NORM), q/k/v biases optional (some fine-tunes
// carry them), rope_freqs.weight optional (Llama 3.1+: the converter bakes
// rope_scaling {"rope_type": "llama3"} into per-pair frequency divisors).
#include "arch/rows.h"

namespace barata::arch {

const ArchSpec kLlama{
    .name = "llama",
    .rope_style = RopeStyle::kNormal,
    .qkv_bias = Presence::kOptional,
    .qk_norm = Presence::kNo,
    .rope_freqs = Presence::kOptional,
    .about = "Llama 1/2/3.x, Mistral, SmolLM2: pre-norm, SwiGLU, RoPE (normal pairs)",
};

}  // namespace barata::arch
