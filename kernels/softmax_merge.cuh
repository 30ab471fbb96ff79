// The arithmetic of a softmax computed in pieces. A partial state over some
// keys is (m, l, acc): m the largest score seen, l = sum exp(s - m) and
// acc = sum exp(s - m) * v. Two states over disjoint key sets combine into the
// state over their union by rescaling both to the larger max; the final
// attention output is acc / l. An empty state is (-inf, 0, 0) and is the
// identity of the merge (no exp(-inf - -inf) = NaN ever appears).
//
// Plain host C++ as well as device code: the host tests check these helpers
// directly, and the emulated kernels use the very same functions.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define BARATA_HD __host__ __device__
#else
#define BARATA_HD
#endif

namespace barata::cuda {

// exp(m_old - m_new) for m_new >= m_old, the factor that moves a state's l and
// acc from max m_old to max m_new; 0 for an empty state (m_old = -inf), also
// when m_new is -inf too.
BARATA_HD inline float softmax_rescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
}

// The max of the union of two states and the factors for each side.
struct SoftmaxMergeScales {
  float m;       // max(ma, mb)
  float sa, sb;  // multiply state a's (l, acc) by sa, state b's by sb
};

BARATA_HD inline SoftmaxMergeScales softmax_merge_scales(float ma, float mb) {
  SoftmaxMergeScales r;
  r.m = ma > mb ? ma : mb;
  r.sa = softmax_rescale(ma, r.m);
  r.sb = softmax_rescale(mb, r.m);
  if (ma == -INFINITY && mb == -INFINITY) r.sa = 1.0f;  // empty + empty stays empty
  return r;
}

// State a becomes the merge of a and b; acc vectors of n elements.
BARATA_HD inline void softmax_merge(float& ma, float& la, float* acc_a, float mb, float lb,
                                    const float* acc_b, int n) {
  const SoftmaxMergeScales s = softmax_merge_scales(ma, mb);
  ma = s.m;
  la = la * s.sa + lb * s.sb;
  for (int i = 0; i < n; ++i) acc_a[i] = acc_a[i] * s.sa + acc_b[i] * s.sb;
}

}  // namespace barata::cuda
