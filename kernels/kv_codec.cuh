// The KV cache's row codecs on the device: the same bytes and values as the
// host's reference codecs (include/barata/kv_types.h, src/kv_types.cpp), with
// every rounding explicit (__fmul_rn, __fdiv_rn, __fadd_rn) so that no FMA
// contraction makes the device's codes differ from the CPU's.
#pragma once

#include <cmath>
#include <cstdint>

#include "barata/kv_types.h"
#include "common.cuh"

namespace barata::cuda {

// Bytes per block of 32 values of a storage type (f16: 64).
__device__ __forceinline__ int kv_block_bytes(KvType t) {
  return t == KvType::kQ4_0 || t == KvType::kIq4Nl ? 18 : t == KvType::kF16 ? 64 : 34;
}

// Bytes of one head's row of hd values (hd a multiple of 32 unless f16).
__device__ __forceinline__ int kv_head_bytes(KvType t, int hd) {
  return t == KvType::kF16 ? 2 * hd : hd / 32 * kv_block_bytes(t);
}

__device__ __forceinline__ float kv_e4m3_to_float(uint32_t c) {
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  // e > 0: (8 + m) 2^(e - 10) = (1 + m / 8) 2^(e - 7); e = 0: m 2^-9.
  const float v = e == 0 ? static_cast<float>(m) * 0.001953125f
                         : __uint_as_float(((e + 120u) << 23) | (m << 20));
  return (c & 0x80u) ? -v : v;
}

__device__ __forceinline__ uint8_t kv_float_to_e4m3(float x) {
  const uint32_t sign = (__float_as_uint(x) >> 31) != 0 ? 0x80u : 0u;
  const float a = fabsf(x);
  if (a != a) return 0x7f;  // NaN
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7eu);
  if (a < 0.015625f) return static_cast<uint8_t>(sign | static_cast<uint32_t>(rintf(a * 512.0f)));
  int e = 0;
  const float fr = frexpf(a, &e);
  int m = static_cast<int>(rintf(__fmul_rn(__fsub_rn(__fmul_rn(2.0f, fr), 1.0f), 8.0f)));
  int be = e - 1 + 7;
  if (m == 8) {
    m = 0;
    ++be;
  }
  if (be > 15 || (be == 15 && m > 6)) return static_cast<uint8_t>(sign | 0x7eu);
  return static_cast<uint8_t>(sign | (static_cast<uint32_t>(be) << 3) | static_cast<uint32_t>(m));
}

__device__ __forceinline__ float kv_load_scale(const uint8_t* p) {
  return fp16_bits_to_float(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

// Values i0 .. i0 + 7 (i0 a multiple of 8) of a head's row of storage type
// t, starting at `row`.
__device__ __forceinline__ void kv_decode8(KvType t, const uint8_t* row, int i0, float* out) {
  if (t == KvType::kF16) {
    for (int e = 0; e < 8; ++e)
      out[e] = fp16_bits_to_float(
          static_cast<uint16_t>(row[2 * (i0 + e)] | (row[2 * (i0 + e) + 1] << 8)));
    return;
  }
  const int b = i0 / 32, j0 = i0 % 32;
  const uint8_t* blk = row + b * kv_block_bytes(t);
  const float d = kv_load_scale(blk);
  const uint8_t* q = blk + 2;
  if (t == KvType::kQ8_0) {
    for (int e = 0; e < 8; ++e)
      out[e] = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(q[j0 + e])));
  } else if (t == KvType::kQ4_0) {
    const int shift = j0 < 16 ? 0 : 4, base = j0 % 16;
    for (int e = 0; e < 8; ++e)
      out[e] = __fmul_rn(d, static_cast<float>(((q[base + e] >> shift) & 15) - 8));
  } else if (t == KvType::kIq4Nl) {
    const int shift = j0 < 16 ? 0 : 4, base = j0 % 16;
    for (int e = 0; e < 8; ++e)
      out[e] = __fmul_rn(d, static_cast<float>(iq4nl_value((q[base + e] >> shift) & 15)));
  } else {  // fp8
    for (int e = 0; e < 8; ++e) out[e] = __fmul_rn(d, kv_e4m3_to_float(q[j0 + e]));
  }
}

// The nearest IQ4_NL value's index (ties to the lower), as kv_types.cpp:
// the midpoints x lies above.
__device__ __forceinline__ int kv_iq4nl_index(float x) {
  int i = 0;
  for (int m = 0; m < 15; ++m) i += x > iq4nl_midpoint(m) ? 1 : 0;
  return i;
}

// One block of 32 values (x) into `dst` in storage type t (not f16).
__device__ __forceinline__ void kv_encode_block(KvType t, const float* x, uint8_t* dst) {
  auto store_scale = [dst](float d) {
    const uint16_t h = __half_as_ushort(float_to_half_rn(d));
    dst[0] = static_cast<uint8_t>(h & 0xff);
    dst[1] = static_cast<uint8_t>(h >> 8);
  };
  if (t == KvType::kQ8_0) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    store_scale(d);
    for (int j = 0; j < 32; ++j)
      dst[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(roundf(__fmul_rn(x[j], id))));
  } else if (t == KvType::kQ4_0) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j)
      if (fabsf(x[j]) > amax) {
        amax = fabsf(x[j]);
        max = x[j];
      }
    const float d = __fdiv_rn(max, -8.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    store_scale(d);
    for (int j = 0; j < 16; ++j) {
      int a = static_cast<int>(__fadd_rn(__fmul_rn(x[j], id), 8.5f));
      int b = static_cast<int>(__fadd_rn(__fmul_rn(x[j + 16], id), 8.5f));
      a = a < 15 ? a : 15;
      b = b < 15 ? b : 15;
      dst[2 + j] = static_cast<uint8_t>(a | (b << 4));
    }
  } else if (t == KvType::kIq4Nl) {  // kv_types.cpp's scale search, step for step
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j)
      if (fabsf(x[j]) > amax) {
        amax = fabsf(x[j]);
        max = x[j];
      }
    if (amax == 0.0f) {
      for (int j = 0; j < 18; ++j) dst[j] = 0;
      store_scale(0.0f);
      return;
    }
    float best_d = 0.0f, best_num = -1.0f, best_den = 1.0f;
    for (int i = -kIq4NlTries; i <= kIq4NlTries; ++i) {
      const float id =
          __fdiv_rn(__fadd_rn(static_cast<float>(iq4nl_value(0)), static_cast<float>(i)), max);
      float sqx = 0.0f, sq2 = 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float q = static_cast<float>(iq4nl_value(kv_iq4nl_index(__fmul_rn(x[j], id))));
        sqx = __fadd_rn(sqx, __fmul_rn(q, x[j]));
        sq2 = __fadd_rn(sq2, __fmul_rn(q, q));
      }
      const float num = __fmul_rn(sqx, sqx);
      if (sq2 > 0.0f && __fmul_rn(num, best_den) > __fmul_rn(best_num, sq2)) {
        best_num = num;
        best_den = sq2;
        best_d = __fdiv_rn(sqx, sq2);
      }
    }
    store_scale(best_d);
    const float d = kv_load_scale(dst);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    for (int j = 0; j < 16; ++j) {
      const int a = kv_iq4nl_index(__fmul_rn(x[j], id));
      const int b = kv_iq4nl_index(__fmul_rn(x[j + 16], id));
      dst[2 + j] = static_cast<uint8_t>(a | (b << 4));
    }
  } else {  // fp8
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
    store_scale(__fdiv_rn(amax, 448.0f));
    const float s = kv_load_scale(dst);
    for (int j = 0; j < 32; ++j) dst[2 + j] = s != 0.0f ? kv_float_to_e4m3(__fdiv_rn(x[j], s)) : 0;
  }
}

}  // namespace barata::cuda
