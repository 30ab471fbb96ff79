// The per-channel key scales of the scaled K cache types (q8_0s, q4_0s,
// iq4_nls; kv_types.h), measured at load on a short built-in text.
//
// Quantizing k makes an error e in every score q.k of q.e. A channel where
// the keys are large takes a large share of a block's range (or, rotated,
// spreads it over the head), while what it costs depends on how much the
// queries weigh that channel. Dividing channel c of every key by s_c and
// multiplying the query's channel c by s_c leaves every score as it was and
// moves range between the two; s_c = sqrt(max|k_c| / rms(q_c)) makes both
// sides' channel c proportional to sqrt(max|k_c| rms(q_c)) (SmoothQuant's
// alpha = 0.5, applied to the scores instead of a matmul). The two channels
// of a RoPE pair that turns more than pi/4 over the context share a scale
// (their statistics pooled), so that the scales hold at positions far past
// the calibration text. The scales are
// normalised per head (their geometric mean 1) and kept as they are:
// rounding them to powers of two, which would make k / s and q s exact,
// measured worse (Qwen2.5-0.5B, 4-bit K: PPL +6.5% -> +11%). Every backend
// divides k by s and multiplies q by s, correctly rounded, so they agree.
// Alpha 0.5 measured best of 0.2-0.6 by KL on Qwen2.5-0.5B (0.3: KL 0.042,
// 0.5: 0.035 for q4_0s).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "barata/backend.h"
#include "barata/kv_cache.h"
#include "barata/model.h"

namespace barata {

// The text the scales are measured on: prose, code, numbers and a chat turn
// (written for barata; a few hundred tokens).
std::string_view kv_calibration_text();

// Runs the model on the CPU backend with an fp16 cache over
// kv_calibration_text() (tokenized with the model's vocabulary; a model
// without one gets a fixed pseudo-random token sequence) and returns the
// scales, n_layer x kv_dim positive floats. The keys are measured after RoPE
// less key_offsets(model, n_ctx), as the cache stores them. n_threads as in
// EngineOptions. A CPU backend in *lend (not yet prepared, no key scales)
// is used and handed back with the weights bound, so that the engine it is
// for does not bind and repack them a second time; otherwise a CPU backend
// of its own is made (the CUDA engine's calibration runs on the host).
std::vector<float> calibrate_key_scales(const Model& model, int64_t n_ctx, int n_threads,
                                        std::unique_ptr<Backend>* lend = nullptr);

// Throws barata::Error unless `scales` suits a cache of layout kv: empty
// unless the K type is scaled, then n_layer x kv_dim finite positive floats.
void check_key_scales(const ModelConfig& c, const KvLayout& kv, const std::vector<float>& scales);

}  // namespace barata
