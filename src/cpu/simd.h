// Small AVX2 helpers shared by the dot-product kernels. Internal.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace barata::BARATA_ISA_NS::simd {

#ifndef BARATA_R_AHEAD
#define BARATA_R_AHEAD 16384
#endif

// Software prefetch for the quantized kernels whose weights are read as one
// linear stream (a 16-row group's sections and the groups after it, or the
// rows of a row tile, lie back to back). Per block the kernel says how many
// bytes of the stream it has consumed; every line up to BARATA_R_AHEAD bytes
// past that is prefetched once into L2 (prefetcht1), and every line up to
// BARATA_R_NEAR bytes past it once more into L1 (prefetcht0), across section
// and group ends. (A prefetch per section, each kAhead blocks ahead, ran
// behind: it left a section's tail and the next group's head to demand
// misses. The L1 stage, on top of the L2 one, took the Qwen 0.5B Q4_0 decode
// at t=1 from 84-86 to 93-95 tokens/s on a Zen 5; an L1 prefetch alone,
// 4 KiB ahead, was slower than either: it ties up the few L1 miss buffers
// for a whole DRAM round trip.)
#ifndef BARATA_R_NEAR
#define BARATA_R_NEAR 2048
#endif
class AheadPrefetch {
 public:
  explicit AheadPrefetch(const void* grp)
      : grp_(reinterpret_cast<uintptr_t>(grp)),
        far_(grp_ + BARATA_R_AHEAD),
        near_(grp_ + BARATA_R_NEAR) {}
  void upto(size_t consumed) {
    for (const uintptr_t end = grp_ + consumed + BARATA_R_AHEAD; far_ < end; far_ += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(far_), 0, 2);
    for (const uintptr_t end = grp_ + consumed + BARATA_R_NEAR; near_ < end; near_ += 64)
      __builtin_prefetch(reinterpret_cast<const void*>(near_), 0, 3);
  }

 private:
  uintptr_t grp_, far_, near_;
};

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (the
// packing of llama.cpp's get_scale_min_k4, ggml-quants.c, b4748).
inline void scale_min(const uint8_t* q, int j, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 bytes of packed nibbles -> 32 bytes in element order: the low nibbles are
// elements 0..15 and the high nibbles 16..31 (llama.cpp's Q4 layout).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

// Sum of u8 x s8 products, as 8 float lanes.
inline __m256 dot_u8_s8(__m256i u, __m256i s) {
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}
#endif

}  // namespace barata::BARATA_ISA_NS::simd
