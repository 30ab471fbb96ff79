// The batched decode matmul of every weight type (kernels/qmm.cu), its row
// dequantizer to fp16 and the embedding lookup of the types beyond gemv.cu,
// under the CUDA emulation; and their decoder (kernels/qdecode.cuh) on the
// host, bit for bit against barata's reference dequantization.
//
// qmm's bound: its weights are exact (the decoder's values), so the whole
// error is fp32 accumulation: a thread sums 4 ceil(k / 512) products in order,
// then 5 butterfly levels, 3 cross-warp additions and the scale. The emulation
// rounds a * b + c twice, so with u = 2^-24 the test allows
// 2 (4 ceil(k/512) + 10) u |scale| sum_j |w_j x_j| plus a tiny absolute term.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "barata/dtype.h"
#include "barata/error.h"
#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "cpu/matmul.h"
#include "elementwise.cuh"
#include "embed.cuh"
#include "qdecode.cuh"
#include "qmm.cuh"
#include "rmsnorm.cuh"
#include "sanitizer.h"

namespace barata {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
bool same_float(float a, float b) {
  return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b));
}

// Every type of the table, and a row length that is legal for it and not a
// multiple of anything convenient where the type allows that.
struct TypeShape {
  DType type;
  int64_t k;
};
std::vector<TypeShape> all_types() {
  return {{DType::F32, 37},       {DType::F16, 70},      {DType::BF16, 66},
          {DType::Q8_0, 96},      {DType::Q4_0, 160},    {DType::Q4_1, 64},
          {DType::Q5_0, 224},     {DType::Q5_1, 96},     {DType::Q4_K, 512},
          {DType::Q5_K, 256},     {DType::Q6_K, 768},    {DType::IQ4_NL, 160},
          {DType::I8_TENSOR, 45}, {DType::I8_ROW, 53},   {DType::I4_TENSOR, 90},
          {DType::I4_ROW, 78},    {DType::I4_G128, 416}, {DType::NF4_B64, 320}};
}

// A quantized matrix from random normal weights (with outliers).
struct Matrix {
  DType type;
  int64_t k, n;
  std::vector<uint8_t> packed;  // tensor_bytes: header (kTensor) then rows
  std::vector<float> deq;       // dequantize_tensor: the tensor scale applied
  const uint8_t* rows() const { return tensor_rows(type, packed.data()); }
  float scale() const { return tensor_scale(type, packed.data()); }
  size_t row_bytes() const { return barata::row_bytes(type, k); }
};

Matrix make_matrix(DType t, int64_t k, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> src(static_cast<size_t>(k * n));
  for (auto& v : src) v = normal(rng) * 0.05f;
  for (int i = 0; i < 4; ++i) src[rng() % src.size()] = 0.7f;
  Matrix m{t, k, n, std::vector<uint8_t>(tensor_bytes(t, k, n)), std::vector<float>(src.size())};
  quantize_tensor(t, src.data(), k, n, m.packed.data());
  dequantize_tensor(t, m.packed.data(), k, n, m.deq.data());
  return m;
}

template <DType T>
float decode_one(const uint8_t* row, int64_t k, int64_t j, const float* lut) {
  float v[4];
  cuda::qdec::QFmt<T>::decode4(row, k, j & ~int64_t{3}, lut, v);
  return v[j & 3];
}

float decode_any(DType t, const uint8_t* row, int64_t k, int64_t j, const float* lut) {
  switch (t) {
#define C(T)     \
  case DType::T: \
    return decode_one<DType::T>(row, k, j, lut);
    BARATA_QFMT_TYPES(C)
#undef C
  }
  return NAN;
}

float lut_any(DType t, int i) {
  switch (t) {
#define C(T)     \
  case DType::T: \
    return cuda::qdec::QFmt<DType::T>::lut_entry(i);
    BARATA_QFMT_TYPES(C)
#undef C
  }
  return NAN;
}

// The 8-bit-activation form of each type that has one, dispatched.
template <DType T>
bool q8_one(const uint8_t* row, int64_t k, int64_t e, const float* lut, uint32_t& q, float& scale,
            float& off, bool& has_off) {
  if constexpr (cuda::qdec::QFmt<T>::kQ8) {
    cuda::qdec::QFmt<T>::decode4_q8(row, k, e, lut, q, scale, off);
    has_off = cuda::qdec::QFmt<T>::kOff;
    return true;
  }
  return false;
}
bool q8_any(DType t, const uint8_t* row, int64_t k, int64_t e, const float* lut, uint32_t& q,
            float& scale, float& off, bool& has_off) {
  switch (t) {
#define C(T)     \
  case DType::T: \
    return q8_one<DType::T>(row, k, e, lut, q, scale, off, has_off);
    BARATA_QFMT_TYPES(C)
#undef C
  }
  return false;
}

// The q8 form's rows: whole 32-element blocks (a short int4-g128 group kept).
std::vector<TypeShape> q8_types() {
  return {{DType::Q8_0, 96},      {DType::Q4_0, 160},   {DType::Q4_1, 64},
          {DType::Q5_0, 224},     {DType::Q5_1, 96},    {DType::Q4_K, 512},
          {DType::Q5_K, 256},     {DType::Q6_K, 768},   {DType::IQ4_NL, 160},
          {DType::I8_TENSOR, 64}, {DType::I8_ROW, 96},  {DType::I4_TENSOR, 128},
          {DType::I4_ROW, 96},    {DType::I4_G128, 416}};
}

TEST(QDecode, CodeBooksEqualTheTables) {
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(bits(cuda::qdec::nf4_entry(i)), bits(kNF4Values[i])) << i;
    EXPECT_EQ(cuda::qdec::iq4nl_entry(i), static_cast<float>(kIQ4NLValues[i])) << i;
  }
}

// Every element of quantized rows, and of rows of random bytes (any scale:
// subnormal, inf, NaN), equals the reference's, bit for bit; rows are also
// read at odd addresses; elements at or past k read as 0.
TEST(QDecode, EveryTypeBitExactAgainstTheReference) {
  for (const TypeShape& ts : all_types()) {
    SCOPED_TRACE(dtype_name(ts.type));
    for (int src_kind = 0; src_kind < 2; ++src_kind) {
      Matrix m = make_matrix(ts.type, ts.k, 5, 11 + static_cast<uint32_t>(ts.type));
      std::mt19937 rng(3);
      if (src_kind == 1) {  // random bytes in the rows (the tensor header keeps its scale)
        const size_t hdr = dtype_traits(ts.type).tensor_header;
        for (size_t i = hdr; i < m.packed.size(); ++i) m.packed[i] = static_cast<uint8_t>(rng());
        dequantize_tensor(ts.type, m.packed.data(), m.k, m.n, m.deq.data());
      }
      float lut[16];
      for (int i = 0; i < 16; ++i) lut[i] = lut_any(ts.type, i);
      const float scale = m.scale();
      const size_t rb = m.row_bytes();
      for (int off = 0; off < 3; ++off) {
        std::vector<uint8_t> shifted(rb * m.n + off);
        std::memcpy(shifted.data() + off, m.rows(), rb * m.n);
        int bad = 0;
        for (int64_t r = 0; r < m.n; ++r) {
          const uint8_t* row = shifted.data() + off + r * rb;
          for (int64_t j = 0; j < m.k; ++j) {
            float got = decode_any(ts.type, row, m.k, j, lut);
            if (scale != 1.0f) got *= scale;  // kTensor: dequantize_tensor's own multiply
            const float want = m.deq[static_cast<size_t>(r * m.k + j)];
            if (!same_float(got, want) && bad++ < 5)
              ADD_FAILURE() << "src " << src_kind << " offset " << off << " row " << r << " el "
                            << j << ": got " << got << " want " << want;
          }
          for (int64_t j = m.k; j < (m.k + 3) / 4 * 4; ++j)
            EXPECT_EQ(decode_any(ts.type, row, m.k, j, lut), 0.0f) << "past k: " << j;
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

// Every element of the q8 form, scale * q + off (the mul, then the add for the
// types with an offset), equals the float form's, bit for bit, on quantized
// rows and on random bytes. The block types' decode4 is built from decode4_q8
// (FromQ8), so for them this is the chain to the reference that the test
// above checks; barata's int8/int4 rows have two separate forms. NF4 and
// the floats have no q8 form.
TEST(QDecode, Q8FormEqualsTheFloatForm) {
  for (const TypeShape& ts : q8_types()) {
    SCOPED_TRACE(dtype_name(ts.type));
    for (int src_kind = 0; src_kind < 2; ++src_kind) {
      Matrix m = make_matrix(ts.type, ts.k, 3, 21 + static_cast<uint32_t>(ts.type));
      std::mt19937 rng(9);
      if (src_kind == 1) {
        const size_t hdr = dtype_traits(ts.type).tensor_header;
        for (size_t i = hdr; i < m.packed.size(); ++i) m.packed[i] = static_cast<uint8_t>(rng());
      }
      float lut[16];
      for (int i = 0; i < 16; ++i) lut[i] = lut_any(ts.type, i);
      int bad = 0;
      for (int64_t r = 0; r < m.n; ++r) {
        const uint8_t* row = m.rows() + r * m.row_bytes();
        for (int64_t e = 0; e < m.k; e += 4) {
          uint32_t q = 0;
          float scale = 0, off = 0;
          bool has_off = false;
          ASSERT_TRUE(q8_any(ts.type, row, m.k, e, lut, q, scale, off, has_off));
          for (int j = 0; j < 4; ++j) {
            const float qj = static_cast<float>(static_cast<int8_t>(q >> (8 * j)));
            float got = scale * qj;
            if (has_off) got = got + off;
            const float want = decode_any(ts.type, row, m.k, e + j, lut);
            if (!same_float(got, want) && bad++ < 5)
              ADD_FAILURE() << "src " << src_kind << " row " << r << " el " << e + j << ": got "
                            << got << " want " << want;
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
  uint32_t q;
  float a, b;
  bool o;
  const uint8_t row[64] = {};
  EXPECT_FALSE(q8_any(DType::NF4_B64, row, 64, 0, nullptr, q, a, b, o));
  EXPECT_FALSE(q8_any(DType::F16, row, 32, 0, nullptr, q, a, b, o));
  EXPECT_FALSE(cuda::qmm_q8_supported(DType::NF4_B64));
  EXPECT_FALSE(cuda::qmm_q8_supported(DType::BF16));
  for (const TypeShape& ts : q8_types()) EXPECT_TRUE(cuda::qmm_q8_supported(ts.type));
}

// ---- the kernels under the emulation -------------------------------------------------

void check_qmm(const Matrix& m, int64_t n_tok, size_t x_offset) {
  SCOPED_TRACE(std::string(dtype_name(m.type)) + " k=" + std::to_string(m.k) +
               " rows=" + std::to_string(m.n) + " n_tok=" + std::to_string(n_tok) +
               " x_offset=" + std::to_string(x_offset));
  std::mt19937 rng(static_cast<uint32_t>(n_tok * 131 + m.k));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> xbuf(x_offset + n_tok * m.k);
  for (auto& v : xbuf) v = uniform(rng);
  const float* x = xbuf.data() + x_offset;
  const int64_t ldy = m.n + 3;
  const float kSentinel = -12345.0f;
  std::vector<float> y(static_cast<size_t>(n_tok * ldy), kSentinel);
  cuda::launch_qmm(m.type, m.rows(), m.row_bytes(), m.k, m.n, m.scale(), x, n_tok, y.data(), ldy,
                   nullptr);
  const double u = std::ldexp(1.0, -24);
  const double bound_terms = 2.0 * (4.0 * std::ceil(m.k / 512.0) + 10.0);
  int bad = 0;
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t r = 0; r < ldy; ++r) {
      const float got = y[static_cast<size_t>(t * ldy + r)];
      if (r >= m.n) {
        EXPECT_EQ(got, kSentinel) << "wrote past the rows at t=" << t;
        continue;
      }
      double dot = 0, mag = 0;
      for (int64_t j = 0; j < m.k; ++j) {
        const double p = static_cast<double>(m.deq[static_cast<size_t>(r * m.k + j)]) *
                         x[static_cast<size_t>(t * m.k + j)];
        dot += p;
        mag += std::fabs(p);
      }
      const double tol = bound_terms * u * mag + 1e-30;
      if (!(std::fabs(got - dot) <= tol) && bad++ < 5)
        ADD_FAILURE() << "row " << r << " token " << t << ": got " << got << " want " << dot
                      << " (tolerance " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0);
}

// Every type, odd row counts (rows past a CTA's 4, 2 or 1), the widths of the
// issue (1, 3, 8, 64) and one of each padded width, misaligned activations.
TEST(EmuQmm, EveryTypeEveryWidthAgainstFloat64) {
  for (const TypeShape& ts : all_types()) {
    const Matrix m = make_matrix(ts.type, ts.k, 7, 100 + static_cast<uint32_t>(ts.type));
    for (int64_t n_tok : {1, 3, 8, 13, 27, 64}) {
      check_qmm(m, n_tok, n_tok == 3 ? 1 : 0);
    }
  }
}

// Long rows: several 512-element steps per thread, a partial last step.
TEST(EmuQmm, LongRows) {
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::NF4_B64, DType::I4_G128, DType::I8_ROW}) {
    const int64_t k = t == DType::NF4_B64 ? 2368 : t == DType::I8_ROW ? 2001 : 2304;
    const Matrix m = make_matrix(t, k, 5, 7);
    check_qmm(m, 1, 0);
    check_qmm(m, 5, 0);
  }
}

TEST(EmuQmm, RefusesBadShapes) {
  const Matrix m = make_matrix(DType::Q4_K, 256, 2, 1);
  std::vector<float> x(256 * 65), y(2 * 65);
  EXPECT_THROW(cuda::launch_qmm(DType::Q4_K, m.rows(), m.row_bytes(), 256, 2, 1.0f, x.data(), 65,
                                y.data(), 2, nullptr),
               Error);
  EXPECT_THROW(cuda::launch_qmm(DType::Q4_K, m.rows(), m.row_bytes(), 200, 2, 1.0f, x.data(), 1,
                                y.data(), 2, nullptr),
               Error);
  EXPECT_THROW(
      cuda::launch_qmm(DType::Q4_K, m.rows(), 100, 256, 2, 1.0f, x.data(), 1, y.data(), 2, nullptr),
      Error);
  EXPECT_EQ(cuda::qmm_variant(DType::Q4_K, 3), "qmm<Q4_K, 4 rows x 4 tokens>");
  EXPECT_EQ(cuda::qmm_variant(DType::NF4_B64, 33), "qmm<NF4_B64, 1 rows x 64 tokens>");
}

// The activation quantizer: the bits of the CPU's quantize_row_q8_act, on
// normal values, an all-zero block, a block with a NaN and one with an Inf.
TEST(EmuQmm, QuantizeQ8MatchesTheCpu) {
  const int64_t k = 256, n_tok = 3;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(n_tok * k));
  for (auto& v : x) v = normal(rng);
  for (int j = 0; j < 32; ++j) x[32 + j] = 0.0f;
  x[100] = NAN;
  x[300] = INFINITY;
  x[301] = -1e-30f;
  std::vector<int8_t> xq(x.size());
  std::vector<float> xd(x.size() / 32);
  cuda::launch_quantize_q8(x.data(), n_tok, k, xq.data(), xd.data(), nullptr);
  std::vector<BlockQ8Act> want(x.size() / 32);
  for (int64_t t = 0; t < n_tok; ++t)
    quantize_row_q8_act(x.data() + t * k, want.data() + t * k / 32, k);
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(bits(xd[b]), bits(want[b].d)) << "block " << b;
    for (int j = 0; j < 32; ++j)
      ASSERT_EQ(xq[b * 32 + j], want[b].q[j]) << "block " << b << " el " << j;
  }
  EXPECT_THROW(cuda::launch_quantize_q8(x.data(), 1, 48, xq.data(), xd.data(), nullptr), Error);
}

// rms_norm and swiglu that also write their output's 8-bit copy (one launch
// fewer per matmul input): the same output as without it, and a copy with the
// bits of quantize_q8 on that output; d = 96 rows (3 warps' blocks by 1 warp
// of a 32-thread CTA) and 896 (the 0.5B shape: 7 warps, 28 blocks).
TEST(EmuQmm, NormAndSwigluWriteTheQuantizersBits) {
  for (const int64_t d : {96, 896}) {
    SCOPED_TRACE("d " + std::to_string(d));
    const int64_t n_tok = 3;
    std::mt19937 rng(static_cast<uint32_t>(d));
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<float> x(static_cast<size_t>(n_tok * d)), g(static_cast<size_t>(d)), up(x.size());
    for (auto& v : x) v = normal(rng);
    for (auto& v : g) v = normal(rng);
    for (auto& v : up) v = normal(rng);
    for (int j = 0; j < 32; ++j) up[static_cast<size_t>(d + j)] = 0.0f;  // an all-zero block
    std::vector<int8_t> xq(x.size()), want_q(x.size());
    std::vector<float> xd(x.size() / 32), want_d(xd.size());
    auto same = [&](const char* what) {
      for (size_t b = 0; b < xd.size(); ++b) {
        EXPECT_EQ(bits(xd[b]), bits(want_d[b])) << what << " block " << b;
        for (int j = 0; j < 32; ++j)
          ASSERT_EQ(xq[b * 32 + j], want_q[b * 32 + j]) << what << " block " << b << " el " << j;
      }
    };
    std::vector<float> y(x.size()), y8(x.size());
    cuda::launch_rmsnorm(x.data(), g.data(), y.data(), n_tok, d, 1e-5f, nullptr, nullptr);
    cuda::launch_rmsnorm(x.data(), g.data(), y8.data(), n_tok, d, 1e-5f, nullptr, nullptr,
                         {xq.data(), xd.data()});
    EXPECT_EQ(0, std::memcmp(y.data(), y8.data(), y.size() * 4)) << "rms_norm output";
    cuda::launch_quantize_q8(y.data(), n_tok, d, want_q.data(), want_d.data(), nullptr);
    same("rms_norm");
    std::vector<float> s1(x), s2(x);
    cuda::launch_swiglu(s1.data(), up.data(), static_cast<int64_t>(x.size()), nullptr);
    cuda::launch_swiglu_q8(s2.data(), up.data(), static_cast<int64_t>(x.size()),
                           {xq.data(), xd.data()}, nullptr);
    EXPECT_EQ(0, std::memcmp(s1.data(), s2.data(), s1.size() * 4)) << "swiglu output";
    cuda::launch_quantize_q8(s1.data(), n_tok, d, want_q.data(), want_d.data(), nullptr);
    same("swiglu");
  }
  std::vector<float> v(40);
  std::vector<int8_t> q(40);
  std::vector<float> dq(2);
  EXPECT_THROW(cuda::launch_swiglu_q8(v.data(), v.data(), 40, {q.data(), dq.data()}, nullptr),
               Error);
  EXPECT_THROW(cuda::launch_rmsnorm(v.data(), v.data(), v.data(), 1, 40, 1e-5f, nullptr, nullptr,
                                    {q.data(), dq.data()}),
               Error);
}

// qmm_q8: against float64 of the exact weights times the CPU's quantized
// activations (d * q), so only fp32 rounding remains: per 4 weights one
// rounded scale product and one FMA (two with an offset), then the reduction.
void check_qmm_q8(const Matrix& m, int64_t n_tok) {
  SCOPED_TRACE(std::string(dtype_name(m.type)) + " k=" + std::to_string(m.k) +
               " rows=" + std::to_string(m.n) + " n_tok=" + std::to_string(n_tok));
  std::mt19937 rng(static_cast<uint32_t>(n_tok * 17 + m.k));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tok * m.k));
  for (auto& v : x) v = uniform(rng);
  std::vector<int8_t> xq(x.size());
  std::vector<float> xd(x.size() / 32);
  cuda::launch_quantize_q8(x.data(), n_tok, m.k, xq.data(), xd.data(), nullptr);
  const int64_t ldy = m.n + 1;
  const float kSentinel = -12345.0f;
  std::vector<float> y(static_cast<size_t>(n_tok * ldy), kSentinel);
  cuda::launch_qmm_q8(m.type, m.rows(), m.row_bytes(), m.k, m.n, m.scale(), xq.data(), xd.data(),
                      n_tok, y.data(), ldy, nullptr);
  float lut[16];
  for (int i = 0; i < 16; ++i) lut[i] = lut_any(m.type, i);
  const double u = std::ldexp(1.0, -24);
  const double bound_terms = 2.0 * (6.0 * std::ceil(m.k / 512.0) + 10.0);
  int bad = 0;
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t r = 0; r < ldy; ++r) {
      const float got = y[static_cast<size_t>(t * ldy + r)];
      if (r >= m.n) {
        EXPECT_EQ(got, kSentinel) << "wrote past the rows at t=" << t;
        continue;
      }
      const uint8_t* row = m.rows() + r * m.row_bytes();
      double dot = 0, mag = 0;
      for (int64_t e = 0; e < m.k; e += 4) {
        uint32_t q;
        float sc, off;
        bool has_off = false;
        q8_any(m.type, row, m.k, e, lut, q, sc, off, has_off);
        for (int j = 0; j < 4; ++j) {
          const size_t i = static_cast<size_t>(t * m.k + e + j);
          const double xv = static_cast<double>(xd[i / 32]) * xq[i];
          const double qv = static_cast<int8_t>(q >> (8 * j));
          dot += (static_cast<double>(sc) * qv + off) * xv;
          mag += (std::fabs(static_cast<double>(sc) * qv) + std::fabs(off)) * std::fabs(xv);
        }
      }
      dot *= m.scale();
      mag *= std::fabs(m.scale());
      const double tol = bound_terms * u * mag + 1e-30;
      if (!(std::fabs(got - dot) <= tol) && bad++ < 5)
        ADD_FAILURE() << "row " << r << " token " << t << ": got " << got << " want " << dot
                      << " (tolerance " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(EmuQmm, Q8EveryTypeEveryWidth) {
  for (const TypeShape& ts : q8_types()) {
    const Matrix m = make_matrix(ts.type, ts.k, 7, 300 + static_cast<uint32_t>(ts.type));
    for (int64_t n_tok : {1, 3, 8, 27, 64}) {
      check_qmm_q8(m, n_tok);
    }
  }
  const Matrix m = make_matrix(DType::Q4_K, 2304, 5, 8);  // several 512-element steps
  check_qmm_q8(m, 2);
}

TEST(EmuQmm, Q8RefusesWhatItCannotRead) {
  const Matrix nf4 = make_matrix(DType::NF4_B64, 64, 2, 1);
  const Matrix i8 = make_matrix(DType::I8_ROW, 48, 2, 1);
  std::vector<int32_t> xq(64);
  std::vector<float> xd(8), y(8);
  EXPECT_THROW(cuda::launch_qmm_q8(DType::NF4_B64, nf4.rows(), nf4.row_bytes(), 64, 2, 1.0f,
                                   xq.data(), xd.data(), 1, y.data(), 2, nullptr),
               Error);
  EXPECT_THROW(cuda::launch_qmm_q8(DType::I8_ROW, i8.rows(), i8.row_bytes(), 48, 2, 1.0f, xq.data(),
                                   xd.data(), 1, y.data(), 2, nullptr),
               Error);
  EXPECT_EQ(cuda::qmm_q8_variant(DType::Q6_K, 9), "qmm_q8<Q6_K, 4 rows x 16 tokens>");
}

// fp16 rows for cuBLAS: fp32_to_fp16 of the reference, bit for bit (unit
// scale for the kTensor types, whose scale cuBLAS's alpha applies).
TEST(EmuQmm, DequantRowsToF16BitExact) {
  for (const TypeShape& ts : all_types()) {
    SCOPED_TRACE(dtype_name(ts.type));
    const Matrix m = make_matrix(ts.type, ts.k, 6, 5);
    std::vector<uint16_t> got(static_cast<size_t>(m.k * m.n) + 1, 0xdead);
    cuda::launch_dequant_rows_f16(m.type, m.rows(), m.row_bytes(), m.k, m.n, got.data(), nullptr);
    std::vector<float> row(static_cast<size_t>(m.k));
    int bad = 0;
    for (int64_t r = 0; r < m.n; ++r) {
      dtype_traits(m.type).dequantize_row(m.rows() + r * m.row_bytes(), row.data(), m.k);
      for (int64_t j = 0; j < m.k; ++j) {
        const uint16_t want = fp32_to_fp16(row[static_cast<size_t>(j)]);
        if (got[static_cast<size_t>(r * m.k + j)] != want && bad++ < 5)
          ADD_FAILURE() << "row " << r << " el " << j;
      }
    }
    EXPECT_EQ(got.back(), 0xdead) << "wrote past the matrix";
    EXPECT_EQ(bad, 0);
  }
}

// Embedding rows of every type: scale * reference, bit for bit.
TEST(EmuQmm, EmbedEveryType) {
  for (const TypeShape& ts : all_types()) {
    SCOPED_TRACE(dtype_name(ts.type));
    ASSERT_TRUE(cuda::embed_supported(ts.type));
    const Matrix m = make_matrix(ts.type, ts.k, 9, 17);
    const std::vector<int32_t> tokens = {8, 0, 3, 3};
    std::vector<float> x(tokens.size() * m.k, -1.0f);
    cuda::launch_embed(m.type, m.rows(), m.row_bytes(), m.scale(), m.k, tokens.data(),
                       static_cast<int64_t>(tokens.size()), x.data(), nullptr);
    std::vector<float> row(static_cast<size_t>(m.k));
    for (size_t i = 0; i < tokens.size(); ++i) {
      dtype_traits(m.type).dequantize_row(m.rows() + tokens[i] * m.row_bytes(), row.data(), m.k);
      for (int64_t j = 0; j < m.k; ++j)
        ASSERT_TRUE(same_float(x[i * m.k + j], row[static_cast<size_t>(j)] * m.scale()))
            << "token " << tokens[i] << " el " << j;
    }
  }
}

}  // namespace
}  // namespace barata
