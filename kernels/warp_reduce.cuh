// Reducing many per-lane partial sums across a warp at once (gemv.cu, qmm.cu).
#pragma once

#include "common.cuh"

namespace barata::cuda {

// ---- warp reduce-scatter -----------------------------------------------------------
// v[0..N) are per-lane partials. At xor offset O, while the count is even,
// each lane keeps one half (the upper half when its bit O is set) summed with
// its partner's copy of that half; an odd count is reduced whole. Afterwards
// every lane holds Final<N>::n totals, v[i] being the total of original index
// base + i, and lanes differing only in the "whole" offsets hold equal copies.
template <int N, int O>
struct Scatter {
  static constexpr bool kHalve = N % 2 == 0 && N > 1;
  static constexpr int kNext = kHalve ? N / 2 : N;
  static constexpr int kFinal = Scatter<kNext, O / 2>::kFinal;
  static constexpr unsigned kWholeMask =
      (kHalve ? 0u : unsigned(O)) | Scatter<kNext, O / 2>::kWholeMask;

  __device__ static void run(float* v, unsigned lane, int& base) {
    if constexpr (kHalve) {
      const bool upper = (lane & O) != 0;
#pragma unroll
      for (int i = 0; i < kNext; ++i) {
        const float send = upper ? v[i] : v[i + kNext];
        const float keep = upper ? v[i + kNext] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
      }
      if (upper) base += kNext;
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], O);
    }
    Scatter<kNext, O / 2>::run(v, lane, base);
  }
};
template <int N>
struct Scatter<N, 0> {
  static constexpr int kFinal = N;
  static constexpr unsigned kWholeMask = 0;
  __device__ static void run(float*, unsigned, int&) {}
};

}  // namespace barata::cuda
