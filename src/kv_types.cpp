#include "barata/kv_types.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstring>

#include "barata/error.h"
#include "barata/half.h"

namespace barata {
namespace {

constexpr std::array<KvTypeInfo, 12> kInfo{{
    {"f16", 1, 2, false, false, false, false},
    {"q8_0", 32, 34, false, false, false, false},
    {"q4_0", 32, 18, false, false, false, false},
    {"fp8", 32, 34, false, false, false, false},
    {"q8_0o", 32, 34, true, false, false, true},
    {"q4_0o", 32, 18, true, false, false, true},
    {"q8_0h", 32, 34, true, true, false, true},
    {"q4_0h", 32, 18, true, true, false, true},
    {"q8_0s", 32, 34, true, true, true, true},
    {"q4_0s", 32, 18, true, true, true, true},
    {"iq4_nl", 32, 18, false, false, false, false},
    {"iq4_nls", 32, 18, true, true, true, true},
}};

void store_f16(uint8_t* dst, float d) {
  const uint16_t h = fp32_to_fp16(d);
  std::memcpy(dst, &h, 2);
}
float load_f16(const uint8_t* src) {
  uint16_t h;
  std::memcpy(&h, src, 2);
  return fp16_to_fp32(h);
}

void quantize_q8_0(const float* x, uint8_t* dst) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(dst, d);
  for (int j = 0; j < 32; ++j)
    dst[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
}

void quantize_q4_0(const float* x, uint8_t* dst) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(dst, d);
  for (int j = 0; j < 16; ++j) {
    const int a = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    const int b = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
    dst[2 + j] = static_cast<uint8_t>(a | (b << 4));
  }
}

// The nearest of the 16 values to x, ties to the lower: the number of
// midpoints between neighbours (all exact in fp32) that x lies above.
// Branch-free, so the compiler vectorizes it over a block.
int iq4nl_index(float x) {
  int i = 0;
  for (int m = 0; m < 15; ++m) i += x > iq4nl_midpoint(m) ? 1 : 0;
  return i;
}

// Scale search: for each trial inverse scale id = (iq4nl_value(0) + i) / max,
// i in -kIq4NlTries..kIq4NlTries (max the value of largest magnitude), the
// codes of x * id, then the least-squares d for those codes; the d that
// explains most of the block's energy (sumqx^2 / sumq2 largest, the first on
// a tie) is kept and the codes recomputed with its fp16 value. Sums are
// sequential fp32 in the order written: the CUDA encoder
// (kernels/kv_codec.cuh) does the same.
void quantize_iq4nl(const float* x, uint8_t* dst) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  if (amax == 0.0f) {
    std::memset(dst, 0, 18);
    store_f16(dst, 0.0f);
    return;
  }
  float best_d = 0.0f, best_num = -1.0f, best_den = 1.0f;
  for (int i = -kIq4NlTries; i <= kIq4NlTries; ++i) {
    const float id = (static_cast<float>(iq4nl_value(0)) + static_cast<float>(i)) / max;
    int code[32];
    for (int j = 0; j < 32; ++j) code[j] = iq4nl_index(x[j] * id);
    float sqx = 0.0f, sq2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float q = static_cast<float>(iq4nl_value(code[j]));
      sqx += q * x[j];
      sq2 += q * q;
    }
    // sqx^2 / sq2 > best_num / best_den, without dividing
    const float num = sqx * sqx;
    if (sq2 > 0.0f && num * best_den > best_num * sq2) {
      best_num = num;
      best_den = sq2;
      best_d = sqx / sq2;
    }
  }
  store_f16(dst, best_d);
  const float d = load_f16(dst);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 16; ++j) {
    const int a = iq4nl_index(x[j] * id), b = iq4nl_index(x[j + 16] * id);
    dst[2 + j] = static_cast<uint8_t>(a | (b << 4));
  }
}

void quantize_fp8(const float* x, uint8_t* dst) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  store_f16(dst, amax / 448.0f);
  const float s = load_f16(dst);  // the scale dequantization multiplies by
  for (int j = 0; j < 32; ++j) dst[2 + j] = s != 0.0f ? fp32_to_e4m3(x[j] / s) : 0;
}

}  // namespace

const KvTypeInfo& kv_type_info(KvType t) {
  return kInfo[static_cast<size_t>(t)];
}

std::optional<KvType> parse_kv_type(std::string_view name) {
  for (size_t i = 0; i < kInfo.size(); ++i)
    if (name == kInfo[i].name) return static_cast<KvType>(i);
  return std::nullopt;
}

std::string kv_type_names(bool k) {
  std::string s;
  for (const KvTypeInfo& i : kInfo) {
    if (i.k_only && !k) continue;
    if (!s.empty()) s += ", ";
    s += i.name;
  }
  return s;
}

std::string kv_cache_label(KvType k, KvType v) {
  if (k == KvType::kF16 && v == KvType::kF16) return "fp16";
  if (k == v) return kv_type_name(k);
  return std::string("K ") + kv_type_name(k) + ", V " + kv_type_name(v);
}

KvType kv_storage_type(KvType t) {
  switch (t) {
    case KvType::kQ8_0O:
    case KvType::kQ8_0H:
    case KvType::kQ8_0S:
      return KvType::kQ8_0;
    case KvType::kQ4_0O:
    case KvType::kQ4_0H:
    case KvType::kQ4_0S:
      return KvType::kQ4_0;
    case KvType::kIq4NlS:
      return KvType::kIq4Nl;
    default:
      return t;
  }
}

void check_kv_type(KvType t, int64_t head_dim, const char* what) {
  const KvTypeInfo& i = kv_type_info(t);
  if (head_dim <= 0 || head_dim % i.block != 0)
    fail("{}: cache type {} needs a head_dim that is a multiple of {}; this model's is {}", what,
         i.name, i.block, head_dim);
  if (i.rotated && (head_dim & (head_dim - 1)) != 0)
    fail(
        "{}: cache type {} rotates each head and needs a power-of-two head_dim; this model's is {}",
        what, i.name, head_dim);
}

void kv_quantize_row(KvType t, const float* x, uint8_t* dst, int64_t n) {
  switch (kv_storage_type(t)) {
    case KvType::kF16:
      for (int64_t i = 0; i < n; ++i) store_f16(dst + 2 * i, x[i]);
      return;
    case KvType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b) quantize_q8_0(x + 32 * b, dst + 34 * b);
      return;
    case KvType::kQ4_0:
      for (int64_t b = 0; b < n / 32; ++b) quantize_q4_0(x + 32 * b, dst + 18 * b);
      return;
    case KvType::kFp8:
      for (int64_t b = 0; b < n / 32; ++b) quantize_fp8(x + 32 * b, dst + 34 * b);
      return;
    case KvType::kIq4Nl:
      for (int64_t b = 0; b < n / 32; ++b) quantize_iq4nl(x + 32 * b, dst + 18 * b);
      return;
    default:
      fail("kv_quantize_row: unknown cache type {}", static_cast<int>(t));
  }
}

void kv_dequantize_row(KvType t, const uint8_t* src, float* out, int64_t n) {
  switch (kv_storage_type(t)) {
    case KvType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = load_f16(src + 2 * i);
      return;
    case KvType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + 34 * b;
        const float d = load_f16(blk);
        for (int j = 0; j < 32; ++j)
          out[32 * b + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
      }
      return;
    case KvType::kQ4_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + 18 * b;
        const float d = load_f16(blk);
        for (int j = 0; j < 16; ++j) {
          out[32 * b + j] = d * static_cast<float>((blk[2 + j] & 15) - 8);
          out[32 * b + j + 16] = d * static_cast<float>((blk[2 + j] >> 4) - 8);
        }
      }
      return;
    case KvType::kFp8:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + 34 * b;
        const float s = load_f16(blk);
        for (int j = 0; j < 32; ++j) out[32 * b + j] = s * e4m3_to_fp32(blk[2 + j]);
      }
      return;
    case KvType::kIq4Nl:
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint8_t* blk = src + 18 * b;
        const float d = load_f16(blk);
        for (int j = 0; j < 16; ++j) {
          out[32 * b + j] = d * static_cast<float>(iq4nl_value(blk[2 + j] & 15));
          out[32 * b + j + 16] = d * static_cast<float>(iq4nl_value(blk[2 + j] >> 4));
        }
      }
      return;
    default:
      fail("kv_dequantize_row: unknown cache type {}", static_cast<int>(t));
  }
}

void kv_quantize_query(const float* x, int8_t* codes, float* d, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < 32; ++j) {
      amax = std::max(amax, std::fabs(xb[j]));
      finite = finite && std::isfinite(xb[j]);
    }
    const float id = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
    // A NaN or infinite query gives NaN scores, as the float dot would.
    d[b] = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    for (int j = 0; j < 32; ++j)
      codes[32 * b + j] = finite ? static_cast<int8_t>(std::nearbyint(xb[j] * id)) : int8_t{0};
  }
}

void hadamard_transform(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

uint8_t fp32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (std::isnan(a)) return 0x7f;
  if (a >= 448.0f) return sign | 0x7e;  // saturate (E4M3 has no infinity)
  if (a < 0.015625f)                    // below 2^-6: subnormal, steps of 2^-9
    return static_cast<uint8_t>(sign | static_cast<int>(std::nearbyint(a * 512.0f)));
  int e = 0;
  const float fr = std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1)
  int m = static_cast<int>(std::nearbyint((2.0f * fr - 1.0f) * 8.0f));
  int be = e - 1 + 7;
  if (m == 8) {
    m = 0;
    ++be;
  }
  if (be > 15 || (be == 15 && m > 6)) return sign | 0x7e;
  return static_cast<uint8_t>(sign | (be << 3) | m);
}

float e4m3_to_fp32(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::nanf("");
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                         : std::ldexp(static_cast<float>(8 + m), e - 10);
  return (c & 0x80) ? -v : v;
}

}  // namespace barata
