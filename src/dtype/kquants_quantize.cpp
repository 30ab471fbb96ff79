// Reference quantizers of Q4_K, Q5_K, Q6_K and IQ4_NL.
//
// These follow the algorithm of llama.cpp's reference quantizers (ggml-quants.c,
// release b4748: quantize_row_{q4_K,q5_K,q6_K,iq4_nl}_ref, no importance
// weights), so that a file barata writes holds the very bytes llama.cpp would.
// Bit-equality depends on every float operation happening in the same order
// with no fused multiply-add (the project builds with -ffp-contract=off), so
// expressions below keep llama.cpp's association even where another order would
// read more naturally. tests/test_kquant_roundtrip.cpp checks the bytes against
// blocks produced by llama.cpp itself.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "barata/error.h"
#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "rows.h"

namespace barata::rows {
namespace {

// A group whose largest magnitude is below this is stored as zeros
// (llama.cpp's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even. Adding 1.5 * 2^23 pushes the integer part into
// the low mantissa bits; this is how llama.cpp rounds (nearest_int), and using the
// same trick keeps results identical even for inputs outside its valid range.
int round_nearest(float v) {
  const float shifted = v + 12582912.f;
  const int32_t bits = std::bit_cast<int32_t>(shifted);
  return (bits & 0x007fffff) - 0x00400000;
}

// ---- Q4_K / Q5_K: affine sub-blocks of 32, x ~= scale * L - min --------------

// Search grid for the affine fit: the code range is stretched by
// rmin + rdelta * k for k = 0..nstep before each least-squares refit.
struct AffineSearch {
  int nmax;  // codes are 0..nmax
  float rmin;
  float rdelta;
  int nstep;
};

// Weighted least-squares fit of x[i] ~= scale * L[i] + offset with offset <= 0
// (llama.cpp's make_qkx2_quants with squared error). Returns scale; *neg_offset
// gets -offset, the non-negative "min" the block format stores. n <= 32.
float fit_affine(const float* x, const float* w, int n, const AffineSearch& s, uint8_t* L,
                 float* neg_offset) {
  float lo = x[0], hi = x[0];
  float sum_w = w[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  // Zero must stay representable: the offset can only pull values down.
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::fill(L, L + n, uint8_t{0});
    *neg_offset = -lo;
    return 0.f;
  }

  float iscale = s.nmax / (hi - lo);
  float scale = 1 / iscale;
  float best_err = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(round_nearest(iscale * (x[i] - lo)), 0, s.nmax));
    float diff = scale * L[i] + lo - x[i];
    diff = diff * diff;
    best_err += w[i] * diff;
  }
  if (s.nstep < 1) {
    *neg_offset = -lo;
    return scale;
  }

  uint8_t trial[32];
  for (int k = 0; k <= s.nstep; ++k) {
    // The grid is anchored at the best offset found so far, not at min(x): a
    // quirk of the reference that changes which codes are tried, so it is kept.
    iscale = (s.rmin + s.rdelta * k + s.nmax) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(round_nearest(iscale * (x[i] - lo)), 0, s.nmax);
      trial[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0)) continue;
    float t_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float t_offset = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (t_offset > 0) {  // refit through the origin
      t_offset = 0;
      t_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      float diff = t_scale * trial[i] + t_offset - x[i];
      diff = diff * diff;
      err += w[i] * diff;
    }
    if (err < best_err) {
      std::copy(trial, trial + n, L);
      best_err = err;
      scale = t_scale;
      lo = t_offset;
    }
  }
  *neg_offset = -lo;
  return scale;
}

// 6-bit scale/min codes of the 8 sub-blocks, in the 12-byte layout that
// llama.cpp's get_scale_min_k4 and gguf-py's Q4_K.get_scale_min read:
// bytes 0-3 scales 0-3 (low 6 bits) + high bits of scales 4-7, bytes 4-7 the
// same for mins, bytes 8-11 low nibbles of scale (low half) and min (high half) 4-7.
void pack_scales_mins(const uint8_t sc[8], const uint8_t mn[8], uint8_t out[kKScaleSize]) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xf) | ((mn[j + 4] & 0xf) << 4));
  }
}

// One super-block of 256 for Q4_K (nmax 15) or Q5_K (nmax 31): fits each
// sub-block of 32, quantizes the 8 scales and 8 mins to 6 bits against fp16
// super-scales, then requantizes the values against the stored (rounded) scales
// so that codes match what the dequantizer will reconstruct. Leaves codes in L.
void quantize_affine_superblock(const float* x, const AffineSearch& search, uint16_t* d_out,
                                uint16_t* dmin_out, uint8_t scales_out[kKScaleSize],
                                uint8_t L[kQK_K]) {
  constexpr int kSub = 32;
  constexpr int kNumSub = kQK_K / kSub;
  float scales[kNumSub], mins[kNumSub];
  float max_scale = 0, max_min = 0;  // scales and mins are both non-negative here
  for (int j = 0; j < kNumSub; ++j) {
    const float* xs = x + kSub * j;
    // Weights favour large values while keeping small ones relevant.
    float sum_x2 = 0;
    for (int l = 0; l < kSub; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / kSub);
    float w[kSub];
    for (int l = 0; l < kSub; ++l) w[l] = av_x + std::fabs(xs[l]);
    scales[j] = fit_affine(xs, w, kSub, search, L + kSub * j, &mins[j]);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }

  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[kNumSub], lm[kNumSub];
  for (int j = 0; j < kNumSub; ++j) {
    // Truncation to uint8_t before the clamp is the reference's behaviour.
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(round_nearest(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(round_nearest(inv_min * mins[j])));
  }
  pack_scales_mins(ls, lm, scales_out);
  *d_out = fp32_to_fp16(max_scale / 63.f);
  *dmin_out = fp32_to_fp16(max_min / 63.f);

  const int nmax = search.nmax;
  for (int j = 0; j < kNumSub; ++j) {
    const float d = fp16_to_fp32(*d_out) * ls[j];
    if (!d) continue;  // keep the codes from the fit; they decode to -min anyway
    const float dm = fp16_to_fp32(*dmin_out) * lm[j];
    for (int i = 0; i < kSub; ++i) {
      const int l = round_nearest((x[kSub * j + i] + dm) / d);
      L[kSub * j + i] = static_cast<uint8_t>(std::clamp(l, 0, nmax));
    }
  }
}

// ---- Q6_K: symmetric sub-blocks of 16, x ~= scale * (L - 32) -----------------

// Symmetric fit with codes -nmax..nmax-1 (stored as L = code + nmax), weighted by
// x^2 so large values are reproduced best (llama.cpp's make_qx_quants with
// rmse_type 1). Tries 19 scales around nmax / max|x| and keeps the one with the
// best weighted least-squares score. Returns the (possibly negative) scale.
float fit_symmetric(const float* x, int n, int nmax, int8_t* L) {
  float amax = 0, max = 0;  // max keeps its sign: the largest magnitude maps to -nmax
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(L, L + n, int8_t{0});
    return 0.f;
  }
  auto code = [nmax](float v) { return std::clamp(round_nearest(v), -nmax, nmax - 1); };

  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = code(iscale * x[i]);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    iscale = -(nmax + 0.1f * k) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = code(iscale * x[i]);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    // Maximising sumlx^2 / suml2 minimises the weighted squared error.
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + code(iscale * x[i]));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void quantize_q6_k_block(const float* x, BlockQ6_K* y) {
  constexpr int kSub = 16;
  constexpr int kNumSub = kQK_K / kSub;
  int8_t L[kQK_K];
  float scales[kNumSub];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < kNumSub; ++ib) {
    scales[ib] = fit_symmetric(x + kSub * ib, kSub, 32, L + kSub * ib);
    const float a = std::fabs(scales[ib]);
    if (a > max_abs_scale) {
      max_abs_scale = a;
      max_scale = scales[ib];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    std::memset(y, 0, sizeof(*y));
    return;
  }

  // 8-bit sub-block scales; the largest maps to -128 so its sign is absorbed by d.
  const float iscale = -128.f / max_scale;
  y->d = fp32_to_fp16(1 / iscale);
  for (int ib = 0; ib < kNumSub; ++ib)
    y->scales[ib] = static_cast<int8_t>(std::min(127, round_nearest(iscale * scales[ib])));

  // Requantize against the stored scales so codes match the dequantizer.
  for (int ib = 0; ib < kNumSub; ++ib) {
    const float d = fp16_to_fp32(y->d) * y->scales[ib];
    if (!d) continue;
    for (int i = 0; i < kSub; ++i) {
      const int l = std::clamp(round_nearest(x[kSub * ib + i] / d), -32, 31);
      L[kSub * ib + i] = static_cast<int8_t>(l + 32);
    }
  }

  // Each half of 128 values: ql byte l holds elements l (low) and l+64 (high),
  // ql byte l+32 holds l+32 and l+96; qh byte l holds the top 2 bits of all four.
  for (int half = 0; half < 2; ++half) {
    const int8_t* Lh = L + 128 * half;
    uint8_t* ql = y->ql + 64 * half;
    uint8_t* qh = y->qh + 32 * half;
    for (int l = 0; l < 32; ++l) {
      const int a = Lh[l], b = Lh[l + 32], c = Lh[l + 64], e = Lh[l + 96];
      ql[l] = static_cast<uint8_t>((a & 0xf) | ((c & 0xf) << 4));
      ql[l + 32] = static_cast<uint8_t>((b & 0xf) | ((e & 0xf) << 4));
      qh[l] = static_cast<uint8_t>((a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6));
    }
  }
}

// ---- IQ4_NL: one scale per 32, codes index a fixed non-linear code book ------

// Index of the code-book entry nearest to v; exact ties go to the larger entry
// (as llama.cpp's best_index_int8 resolves them).
int nearest_iq4nl_index(float v) {
  const int8_t* vals = kIQ4NLValues;
  if (v <= vals[0]) return 0;
  if (v >= vals[15]) return 15;
  int hi = 15;  // first entry above v
  for (int k = 1; k < 15; ++k) {
    if (v < vals[k]) {
      hi = k;
      break;
    }
  }
  return v - vals[hi - 1] < vals[hi] - v ? hi - 1 : hi;
}

void quantize_iq4_nl_block(const float* x, BlockIQ4_NL* y) {
  constexpr int n = kQK4_NL;
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  if (amax < kGroupMaxEps) {
    // llama.cpp leaves the nibbles of such a block as whatever its scratch
    // buffer held; with d = 0 they decode to 0 regardless, so write zeros.
    y->d = fp32_to_fp16(0.f);
    std::memset(y->qs, 0, sizeof(y->qs));
    return;
  }

  // Map the largest magnitude onto the code book's extreme (-127), then refit
  // the scale by least squares weighted with x^2. The reference quantizer runs
  // no further scale search (ntry = -1 in llama.cpp).
  const float d0 = max / kIQ4NLValues[0];
  const float id = 1 / d0;
  uint8_t L[n];
  float sumqx = 0, sumq2 = 0;
  for (int j = 0; j < n; ++j) {
    L[j] = static_cast<uint8_t>(nearest_iq4nl_index(id * x[j]));
    const float q = kIQ4NLValues[L[j]];
    const float w = x[j] * x[j];
    sumqx += w * q * x[j];
    sumq2 += w * q * q;
  }
  y->d = fp32_to_fp16(sumqx / sumq2);
  // Same nibble order as Q4_0: byte j holds elements j (low) and j + 16 (high).
  for (int j = 0; j < n / 2; ++j) y->qs[j] = static_cast<uint8_t>(L[j] | (L[j + n / 2] << 4));
}

}  // namespace

void quantize_q4_k(const float* src, void* dst, int64_t n) {
  const int64_t nb = whole_blocks(n, kQK_K, "Q4_K");
  auto* y = static_cast<BlockQ4_K*>(dst);
  const AffineSearch search{15, -1.f, 0.1f, 20};
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < nb; ++i, src += kQK_K) {
    quantize_affine_superblock(src, search, &y[i].d, &y[i].dmin, y[i].scales, L);
    // Each 64 values share 32 bytes: first 32 in the low nibbles, next 32 high.
    for (int c = 0; c < kQK_K / 64; ++c)
      for (int l = 0; l < 32; ++l)
        y[i].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

void quantize_q5_k(const float* src, void* dst, int64_t n) {
  const int64_t nb = whole_blocks(n, kQK_K, "Q5_K");
  auto* y = static_cast<BlockQ5_K*>(dst);
  const AffineSearch search{31, -0.5f, 0.1f, 15};
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < nb; ++i, src += kQK_K) {
    quantize_affine_superblock(src, search, &y[i].d, &y[i].dmin, y[i].scales, L);
    // Low nibbles as in Q4_K; the fifth bit of value 64c + l goes to bit 2c of
    // qh[l], and of value 64c + 32 + l to bit 2c + 1.
    std::memset(y[i].qh, 0, sizeof(y[i].qh));
    for (int c = 0; c < kQK_K / 64; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        y[i].qs[32 * c + l] = static_cast<uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
        y[i].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

void quantize_q6_k(const float* src, void* dst, int64_t n) {
  const int64_t nb = whole_blocks(n, kQK_K, "Q6_K");
  auto* y = static_cast<BlockQ6_K*>(dst);
  for (int64_t i = 0; i < nb; ++i) quantize_q6_k_block(src + kQK_K * i, &y[i]);
}

void quantize_iq4_nl(const float* src, void* dst, int64_t n) {
  const int64_t nb = whole_blocks(n, kQK4_NL, "IQ4_NL");
  auto* y = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < nb; ++i) quantize_iq4_nl_block(src + kQK4_NL * i, &y[i]);
}

}  // namespace barata::rows
