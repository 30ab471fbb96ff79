// The element types of the KV cache (--cache-type-k / --cache-type-v), and
// the row codecs every backend's cache writes and attention's reads agree on.
//
// A cache row is one token's K (or V) of one layer: kv_dim = n_head_kv x
// head_dim values, stored as kv_dim / block blocks of the type, head after
// head (head_dim is a multiple of 32, so no block straddles two heads).
//
//   f16    2 bytes a value (the default).
//   q8_0   ggml's Q8_0 block: fp16 scale d = absmax / 127, 32 int8 codes,
//          x = d * q (34 bytes per 32 values).
//   q4_0   ggml's Q4_0 block: fp16 d = (the value of largest magnitude) / -8,
//          32 4-bit codes (values 0..15 in the low nibbles, 16..31 in the
//          high ones), x = d * (q - 8) (18 bytes per 32 values).
//   iq4_nl ggml's IQ4_NL block layout: fp16 d, 32 4-bit codes packed as
//          q4_0's, x = d * kIq4NlValues[q], a non-uniform grid that fits
//          bell-shaped values (rotated keys, values) better than q4_0's
//          uniform one. The scale is chosen per block by a least-squares
//          search (kv_types.cpp), so the bytes are barata's, not ggml's.
//   fp8    OCP FP8 E4M3 (bias 7, no infinities, max 448) with an fp16 scale
//          per block of 32, s = absmax / 448: x = s * e4m3(q) (34 bytes).
//
// barata's outlier-aware K types (K only), two exact changes of the keys that
// leave attention as it was and make them cheap to quantize:
//   q8_0o, q4_0o   the keys' constant part (key_offsets() in backend.h: the
//          k_proj bias after RoPE, averaged over the context) is subtracted
//          from every key before it is quantized as q8_0 / q4_0. A constant
//          c shifts every score of a query by q.c, which softmax ignores, so
//          nothing has to be added back. Qwen2's keys carry bias channels of
//          |b| up to 145 next to values of a few units; per-block absmax
//          quantization spent its whole range on them.
//   q8_0h, q4_0h   the same, then each head's key rotated by the
//          Walsh-Hadamard matrix H (head_dim a power of two) and each query
//          by H / head_dim, so q.k is unchanged: (H q / n).(H k) = q.k since
//          H H = n I (ik_llama.cpp rotates K the same way, QuaRot too). The
//          rotation spreads what outliers are left over the whole head.
//   q8_0s, q4_0s   the offset subtracted, then each channel c of k divided
//          by a calibrated scale s_c and the query's channel multiplied by
//          it ((q s).(k / s) = q.k), then rotated as the h types.
//          s_c = sqrt(max|k_c| / rms(q_c)) balances where the keys are large
//          against where the queries look (SmoothQuant's migration applied
//          to q.k), so that the rotation no longer spreads a channel that
//          the queries weigh lightly over the ones they weigh heavily.
//          kv_calibrate.h measures it on a short text at load.
//   iq4_nls   the same, stored as iq4_nl.
// Measured on Qwen2.5-Coder-0.5B (docs/kv-cache.md): q8_0s is the best
// 8-bit K and iq4_nls the best 4-bit one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace barata {

enum class KvType : uint8_t {
  kF16,
  kQ8_0,
  kQ4_0,
  kFp8,
  kQ8_0O,
  kQ4_0O,
  kQ8_0H,
  kQ4_0H,
  kQ8_0S,
  kQ4_0S,
  kIq4Nl,
  kIq4NlS
};

struct KvTypeInfo {
  const char* name;
  int32_t block;        // values per block
  int32_t block_bytes;  // bytes per block
  bool offset;          // the keys' constant part subtracted before quantizing
  bool rotated;         // K rotated per head (Walsh-Hadamard) before quantizing
  bool scaled;          // K divided per channel by calibrated scales (q multiplied)
  bool k_only;          // valid for K only
};
const KvTypeInfo& kv_type_info(KvType t);
inline const char* kv_type_name(KvType t) {
  return kv_type_info(t).name;
}
// "f16", "q8_0", ...; nullopt for an unknown name.
std::optional<KvType> parse_kv_type(std::string_view name);
// The names, comma separated (for help and errors).
std::string kv_type_names(bool k);
// How the cache is named in reports: "fp16" (both f16), "q8_0" (both the
// same), "K q8_0h, V q4_0" otherwise.
std::string kv_cache_label(KvType k, KvType v);
// The type an outlier-aware type stores its codes in (q8_0h -> q8_0); t otherwise.
KvType kv_storage_type(KvType t);

// Bytes of a row of n values (n a multiple of the type's block).
inline int64_t kv_row_bytes(KvType t, int64_t n) {
  const KvTypeInfo& i = kv_type_info(t);
  return n / i.block * i.block_bytes;
}
// Throws barata::Error naming `what` when head_dim does not suit type t (a
// multiple of its block; a power of two for the rotated types).
void check_kv_type(KvType t, int64_t head_dim, const char* what);

// One row of n values (n a multiple of the block) to and from the storage
// of type t (a rotated type's storage: rotation is the caller's, see below).
// The reference codecs: every backend's stores give these bytes, and every
// attention reads these values.
void kv_quantize_row(KvType t, const float* x, uint8_t* dst, int64_t n);
void kv_dequantize_row(KvType t, const uint8_t* src, float* out, int64_t n);

// Whether the CPU's attention reads keys of storage type t as int8 codes:
// q8_0, q4_0 and iq4_nl (blocks of 32 codes times an fp16 scale d_k). Their
// scores are integer dots with the query quantized to 8 bits per block of
// 32 (kv_quantize_query), as llama.cpp's CPU dots do:
//   q.k = sum over blocks b of d_k[b] * d_q[b] * (sum of code_q * code_k),
// the integer sums exact (vpdpbusd, pmaddubsw or int32), so every ISA gives
// the same sums. fp8 and f16 keys are read as floats. The CUDA attention
// rounds its queries the same way (kernels/attention.cu).
constexpr bool kv_int_keys(KvType storage) {
  return storage == KvType::kQ8_0 || storage == KvType::kQ4_0 || storage == KvType::kIq4Nl;
}
// A query (n values, a multiple of 32) to int8 codes per block of 32:
// d = amax / 127, code = nearbyint(x * (127 / amax)) in [-127, 127] (all 0
// and d = 0 for a block of zeros). d[n / 32] are floats, not fp16.
void kv_quantize_query(const float* x, int8_t* codes, float* d, int64_t n);

// In-place unnormalised Walsh-Hadamard transform of n values (n a power of
// two): x <- H x, the butterflies in the order the backends use (stride 1,
// 2, 4, ...), so every backend rounds the same way.
void hadamard_transform(float* x, int64_t n);

// IQ4_NL's 16 values, ascending (ggml's kvalues_iq4nl, a fact of the
// format): -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113, as
// int8 bytes packed into two words. A function of shifts, so that device
// code (nvcc --expt-relaxed-constexpr) calls it without a table in memory.
constexpr int iq4nl_value(int i) {
  constexpr uint64_t lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull;
  return static_cast<int8_t>(static_cast<uint8_t>(((i < 8 ? lo : hi) >> (8 * (i & 7))) & 0xff));
}
// The iq4_nl encoder's scale search tries 2 kIq4NlTries + 1 scales
// (kv_types.cpp). Measured on Qwen2.5-0.5B (K iq4_nls, V iq4_nl): 1 try KL
// 0.0368, 5 tries 0.0343, 17 finer ones 0.0336 at four times the cost.
inline constexpr int kIq4NlTries = 2;

// The midpoint between values m and m + 1 (m in 0..14), exact in fp32.
constexpr float iq4nl_midpoint(int m) {
  return 0.5f * static_cast<float>(iq4nl_value(m) + iq4nl_value(m + 1));
}
static_assert(iq4nl_value(0) == -127 && iq4nl_value(7) == -10 && iq4nl_value(8) == 1 &&
              iq4nl_value(15) == 113);

// E4M3 codes: round to nearest even, saturating at +-448; and back.
uint8_t fp32_to_e4m3(float x);
float e4m3_to_fp32(uint8_t c);

}  // namespace barata
