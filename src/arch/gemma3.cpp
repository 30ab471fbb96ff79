// Gemma 3 (text). Source: llama.cpp's LLM_ARCH_GEMMA3 (build of 2025-08,
// llm_build_gemma3_iswa and its hparams) and Google's gemma_pytorch config:
// the embedding rows times sqrt(d_model); per-head q/k RMSNorm; an RMSNorm
// after attention and after the FFN, before each residual add
// (post_attention_norm, post_ffw_norm); GeGLU with the tanh form of GELU;
// NeoX rotary pairs; five sliding-window layers of attention.sliding_window
// positions to one global layer (layer l is local when l % 6 < 5), the local
// layers with RoPE base 10,000 and no scaling, the global ones with the
// file's base and scaling. The converter stores the norms' gains with
// Gemma's "+1" already added, so they are plain RMSNorm gains here.
// The attention scale is 1 / sqrt(head_dim) except for the 62-layer (27B)
// model, which uses 1 / sqrt(d_model / n_head) (ModelConfig::from_gguf).
#include "arch/rows.h"

namespace barata::arch {

const ArchSpec kGemma3{
    .name = "gemma3",
    .rope_style = RopeStyle::kNeox,
    .qkv_bias = Presence::kNo,
    .qk_norm = Presence::kYes,
    .rope_freqs = Presence::kNo,
    .post_norms = Presence::kYes,
    .glu = Glu::kGeGLU,
    .embed_scale = true,
    .swa_pattern = 6,
    .rope_base_swa = 10000.0f,
    .chat = "gemma",
    .about =
        "Gemma 3: embedding x sqrt(d), q/k norms, post-norms, GeGLU, 5 local : 1 global layers",
};

}  // namespace barata::arch
