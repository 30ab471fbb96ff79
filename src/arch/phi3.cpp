// Phi-3 and Phi-3.5 mini (dense). Source: llama.cpp's LLM_ARCH_PHI3 (build
// of 2025-08, llm_build_phi3): q, k and v in one matrix (attn_qkv; separate
// ones accepted), gate and up in one (ffn_up with 2 d_ff rows, the gate's
// first: ggml_swiglu's split), NeoX rotary pairs, LongRoPE through
// rope_factors_long / rope_factors_short (the long ones when the context is
// beyond the original one) and rope.scaling.attn_factor. Its
// attention.sliding_window is read and not applied, as llama.cpp does
// (its PR 13676: the converted files do not say which layers use it).
#include "arch/rows.h"

namespace barata::arch {

const ArchSpec kPhi3{
    .name = "phi3",
    .rope_style = RopeStyle::kNeox,
    .qkv_bias = Presence::kNo,
    .qk_norm = Presence::kNo,
    .rope_freqs = Presence::kNo,
    .fused_qkv = Presence::kOptional,
    .fused_gate_up = true,
    .rope_long_short = Presence::kOptional,
    .ignores_sliding_window = true,
    .chat = "phi3",
    .about = "Phi-3/3.5 mini: fused qkv and gate+up, SwiGLU, RoPE (NeoX) with LongRoPE factors",
};

}  // namespace barata::arch
