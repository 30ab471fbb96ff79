// barata's own tensor types (int8/int4 per tensor and per row, int4 group-128,
// NF4 block-64): layout, round-trip error bounds that follow from each scheme's
// definition, and every matmul kernel against a float64 reference on random
// shapes (rows not a multiple of the block included).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "barata/dtype.h"
#include "barata/error.h"
#include "barata/half.h"
#include "cpu/isa.h"
#include "cpu/matmul.h"
#include "barata/quant_blocks.h"
#include "cpu/thread_pool.h"

namespace barata {
namespace {

constexpr DType kOwn[] = {DType::I8_TENSOR, DType::I8_ROW,  DType::I4_TENSOR,
                          DType::I4_ROW,    DType::I4_G128, DType::NF4_B64};

std::vector<float> gaussian(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

std::vector<float> round_trip(DType t, const std::vector<float>& w, int64_t k, int64_t rows) {
  std::vector<uint8_t> q(tensor_bytes(t, k, rows));
  quantize_tensor(t, w.data(), k, rows, q.data());
  std::vector<float> back(w.size());
  dequantize_tensor(t, q.data(), k, rows, back.data());
  return back;
}

float absmax(const float* x, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

TEST(QuantTypes, LayoutAndPrivateIds) {
  EXPECT_EQ(tensor_bytes(DType::I8_TENSOR, 576, 10), 32u + 5760u);
  EXPECT_EQ(tensor_bytes(DType::I8_ROW, 576, 10), 10u * (4 + 576));
  EXPECT_EQ(tensor_bytes(DType::I4_TENSOR, 172, 3), 32u + 3u * 86);
  EXPECT_EQ(tensor_bytes(DType::I4_ROW, 172, 3), 3u * (4 + 86));
  EXPECT_EQ(tensor_bytes(DType::I4_G128, 1536, 2), 2u * (12 * 2 + 768));
  EXPECT_EQ(tensor_bytes(DType::I4_G128, 576, 1), 5u * 2 + 288);  // last group of 64
  EXPECT_THROW(row_bytes(DType::I4_G128, 172), Error);
  EXPECT_EQ(tensor_bytes(DType::NF4_B64, 576, 2), 2u * 9 * 34);
  EXPECT_DOUBLE_EQ(dtype_traits(DType::I4_G128).bits_per_weight(), 4.125);
  EXPECT_DOUBLE_EQ(dtype_traits(DType::NF4_B64).bits_per_weight(), 4.25);
  EXPECT_THROW(row_bytes(DType::I4_ROW, 171), Error);
  EXPECT_THROW(row_bytes(DType::NF4_B64, 100), Error);
  EXPECT_THROW(dtype_bytes(DType::I8_ROW, 100), Error);
  for (DType t : kOwn) {
    EXPECT_TRUE(dtype_traits(t).is_private);
    EXPECT_GE(static_cast<uint32_t>(t), 1000u) << dtype_name(t);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  // Block types keep llama.cpp's layout rules; existing byte sizes are unchanged.
  EXPECT_EQ(tensor_bytes(DType::Q8_0, 64, 3), dtype_bytes(DType::Q8_0, 192));
}

TEST(QuantTypes, NF4CodeBookIsSortedAndSymmetricAtTheEnds) {
  for (int i = 1; i < 16; ++i) EXPECT_LT(kNF4Values[i - 1], kNF4Values[i]);
  EXPECT_EQ(kNF4Values[0], -1.0f);
  EXPECT_EQ(kNF4Values[7], 0.0f);
  EXPECT_EQ(kNF4Values[15], 1.0f);
}

// Each element's error is at most half a step of its own scale: the bound is
// the scheme's definition, checked element by element.
TEST(QuantTypes, RoundTripWithinHalfAStep) {
  const int64_t k = 320, rows = 6;  // 320: a last group-128 of 64
  std::vector<float> w = gaussian(static_cast<size_t>(k * rows), 7);
  w[17] = 9.0f;  // an outlier in row 0
  const float tensor_amax = absmax(w.data(), k * rows);
  for (DType t : kOwn) {
    const std::vector<float> back = round_trip(t, w, k, rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const float x = w[static_cast<size_t>(r * k + j)];
        const float* row = w.data() + r * k;
        float step = 0, bound = 0;
        switch (t) {
          case DType::I8_TENSOR:
            step = tensor_amax / 127;
            break;
          case DType::I8_ROW:
            step = absmax(row, k) / 127;
            break;
          case DType::I4_TENSOR:
            step = tensor_amax / 7;
            break;
          case DType::I4_ROW:
            step = absmax(row, k) / 7;
            break;
          case DType::I4_G128:  // the last group of a row may be shorter
            step = absmax(row + j / 128 * 128, std::min<int64_t>(128, k - j / 128 * 128)) / 7;
            break;
          case DType::NF4_B64: {
            // widest gap between neighbouring code values (-1 .. -0.696)
            step = absmax(row + j / 64 * 64, 64) * (kNF4Values[1] - kNF4Values[0]);
            break;
          }
          default:
            FAIL();
        }
        bound = step * 0.5f * 1.002f + 1e-7f;  // fp16 scales: 2^-11 relative
        ASSERT_LE(std::fabs(back[static_cast<size_t>(r * k + j)] - x), bound)
            << dtype_name(t) << " row " << r << " col " << j;
      }
    }
  }
}

// Relative Frobenius error on N(0,1) matrices: where the scale lives decides
// the error (per tensor >> per row > group-128 ~ NF4 for 4 bits). Bounds sit
// ~15% above what these seeds give; the ordering is the point.
TEST(QuantTypes, RelativeErrorOrdering) {
  const int64_t k = 512, rows = 64;
  std::vector<float> w = gaussian(static_cast<size_t>(k * rows), 11);
  for (int64_t r = 0; r < rows; ++r)  // rows of very different scale, as in real models
    for (int64_t j = 0; j < k; ++j) w[static_cast<size_t>(r * k + j)] *= 0.05f + 0.1f * r;
  w[3] = 40.0f;  // one outlier
  auto rel = [&](DType t) {
    const std::vector<float> back = round_trip(t, w, k, rows);
    double num = 0, den = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      num += double(back[i] - w[i]) * (back[i] - w[i]);
      den += double(w[i]) * w[i];
    }
    return std::sqrt(num / den);
  };
  const double i8t = rel(DType::I8_TENSOR), i8r = rel(DType::I8_ROW);
  const double i4t = rel(DType::I4_TENSOR), i4r = rel(DType::I4_ROW);
  const double g128 = rel(DType::I4_G128), nf4 = rel(DType::NF4_B64);
  std::printf(
      "relative error: i8 tensor %.4f row %.4f; i4 tensor %.4f row %.4f g128 %.4f nf4 %.4f\n", i8t,
      i8r, i4t, i4r, g128, nf4);
  EXPECT_LT(i8r, i8t);
  EXPECT_LT(i8r, 0.009);
  EXPECT_LT(i4r, i4t);
  EXPECT_LT(g128, i4r);
  EXPECT_LT(nf4, i4r);
  EXPECT_LT(g128, 0.135);
  EXPECT_LT(nf4, 0.105);
  EXPECT_GT(i4t, 0.3);  // per-tensor int4 with an outlier wipes out the small rows
}

TEST(QuantTypes, ZeroAndConstantRows) {
  const int64_t k = 128;
  std::vector<float> w(static_cast<size_t>(2 * k), 0.0f);
  for (int64_t j = 0; j < k; ++j) w[static_cast<size_t>(k + j)] = -0.5f;
  for (DType t : kOwn) {
    const std::vector<float> back = round_trip(t, w, k, 2);
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(back[static_cast<size_t>(j)], 0.0f) << dtype_name(t);
      EXPECT_NEAR(back[static_cast<size_t>(k + j)], -0.5f, 1e-3f) << dtype_name(t);
    }
  }
}

// The activations a kernel sees: fp32, or the Q8 blocks it is given (the
// float64 reference uses the same values, so only the kernel's own error is
// measured).
std::vector<double> act_values(const MatmulKernel& kern, const std::vector<float>& x, int64_t k,
                               int64_t n_tok) {
  std::vector<double> v(x.begin(), x.end());
  if (kern.act != ActFormat::kQ8) return v;
  std::vector<BlockQ8Act> blocks(static_cast<size_t>(k / 32));
  for (int64_t t = 0; t < n_tok; ++t) {
    quantize_row_q8_act(x.data() + t * k, blocks.data(), k);
    for (int64_t j = 0; j < k; ++j)
      v[static_cast<size_t>(t * k + j)] = double(blocks[static_cast<size_t>(j / 32)].d) *
                                          blocks[static_cast<size_t>(j / 32)].q[j % 32];
  }
  return v;
}

void check_kernel(ThreadPool& pool, DType t, int64_t k, int64_t n_rows, int64_t n_tok,
                  uint32_t seed) {
  SCOPED_TRACE(testing::Message() << dtype_name(t) << " k=" << k << " rows=" << n_rows
                                  << " tokens=" << n_tok);
  const std::vector<float> w = gaussian(static_cast<size_t>(k * n_rows), seed, 0.02f);
  const std::vector<float> x = gaussian(static_cast<size_t>(k * n_tok), seed + 1);
  std::vector<uint8_t> q(tensor_bytes(t, k, n_rows));
  quantize_tensor(t, w.data(), k, n_rows, q.data());
  std::vector<float> wd(w.size());
  dequantize_tensor(t, q.data(), k, n_rows, wd.data());

  const WeightView view = make_weight_view(t, k, n_rows, q.data());
  const std::vector<double> xv = act_values(*view.kernel, x, k, n_tok);

  PreparedActs acts;
  prepare_acts(pool, view.kernel->act, x.data(), n_tok, k, acts);
  std::vector<float> y(static_cast<size_t>(n_tok * n_rows));
  matmul(pool, view, acts, y.data(), n_rows);

  for (int64_t tk = 0; tk < n_tok; ++tk) {
    for (int64_t r = 0; r < n_rows; ++r) {
      double ref = 0, mag = 0;
      for (int64_t j = 0; j < k; ++j) {
        const double a = wd[static_cast<size_t>(r * k + j)],
                     b = xv[static_cast<size_t>(tk * k + j)];
        ref += a * b;
        mag += std::fabs(a * b);
      }
      ASSERT_NEAR(y[static_cast<size_t>(tk * n_rows + r)], ref, 4e-6 * mag + 1e-9)
          << "row " << r << " token " << tk;
    }
  }
  // Matrix-vector and matrix-matrix paths agree bit for bit.
  for (int64_t tk = 0; tk < n_tok; tk += std::max<int64_t>(1, n_tok / 3)) {
    PreparedActs one;
    prepare_acts(pool, view.kernel->act, x.data() + tk * k, 1, k, one);
    std::vector<float> y1(static_cast<size_t>(n_rows));
    matmul(pool, view, one, y1.data(), n_rows);
    for (int64_t r = 0; r < n_rows; ++r)
      ASSERT_EQ(y1[static_cast<size_t>(r)], y[static_cast<size_t>(tk * n_rows + r)])
          << "row " << r << " token " << tk;
  }
}

// Every test below runs once per instruction set (BARATA_ISA's names), forced
// with set_cpu_isa; an ISA this CPU (or this build) lacks is skipped, saying so.
class QuantKernelsIsa : public testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!cpu_isa_available(GetParam()))
      GTEST_SKIP() << "this CPU or build has no " << cpu_isa_name(GetParam())
                   << " kernels (best here: " << cpu_isa_name(cpu_best_isa()) << ")";
    saved_ = cpu_isa();
    set_cpu_isa(GetParam());
  }
  void TearDown() override { set_cpu_isa(saved_); }
  CpuIsa saved_ = CpuIsa::kScalar;
};

TEST_P(QuantKernelsIsa, OwnTypesMatchFloat64ReferenceOnRandomShapes) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  uint32_t seed = 100;
  for (DType t : kOwn) {
    const int64_t block = t == DType::I4_G128 ? 32 : t == DType::NF4_B64 ? 64 : 2;
    // Shapes: block multiples (fast kernels: 576 is 9 AVX-512 units of 64,
    // 96 is 1.5, which the AVX2 kernel takes), and for the per-row /
    // per-tensor types rows that are not a multiple of 32 (d_ff 172 of the
    // tiny models).
    std::vector<int64_t> ks = {256, 1536, 576};
    if (block > 2) ks.insert(ks.end(), {block * 3});
    if (block == 2) ks.insert(ks.end(), {96, 172, 46});
    for (int64_t k : ks) {
      for (int64_t n_tok : {1, 2, 3, 4, 5, 37}) {
        const int64_t n_rows = 1 + static_cast<int64_t>(rng() % 45);
        check_kernel(pool, t, k, n_rows, n_tok, seed++);
      }
    }
  }
}

// llama.cpp's block types through the same check (their fast kernels and
// the reference kernel for rows they cannot take).
TEST_P(QuantKernelsIsa, LlamaCppTypesMatchFloat64Reference) {
  ThreadPool pool(2);
  std::mt19937 rng(9);
  uint32_t seed = 500;
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::IQ4_NL,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::F16, DType::BF16, DType::F32}) {
    const bool k_quant = t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
    std::vector<int64_t> ks = {256, 512, 1536};
    if (!k_quant) ks.insert(ks.end(), {96, 576});  // 1.5 and 9 units of 64
    if (t == DType::F16 || t == DType::BF16 || t == DType::F32) ks.push_back(90);  // masked tail
    for (int64_t k : ks) {
      // 2-8 tokens: the few-token register paths (a speculative verify pass);
      // 9 and 33: the wide paths.
      for (int64_t n_tok : {1, 2, 3, 4, 6, 8, 9, 33}) {
        const int64_t n_rows = 1 + static_cast<int64_t>(rng() % 37);
        check_kernel(pool, t, k, n_rows, n_tok, seed++);
      }
    }
  }
}

// The ISA asked for is the one whose kernels get bound, where it has one.
TEST_P(QuantKernelsIsa, KernelsOfTheForcedIsaAreBound) {
  const std::string suffix = std::string(".") + cpu_isa_name(GetParam());
  const MatmulKernel& q4 = cpu_matmul_kernel(DType::Q4_0, 256);
  EXPECT_TRUE(std::string(q4.name).ends_with(suffix)) << q4.name;
  if (GetParam() == CpuIsa::kAvx512) {
    for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q5_0, DType::Q8_0, DType::I4_G128,
                    DType::I8_ROW, DType::F16, DType::BF16}) {
      EXPECT_TRUE(std::string(cpu_matmul_kernel(t, 512).name).ends_with(".avx512"))
          << cpu_matmul_kernel(t, 512).name;
    }
    // k = 96 is not whole 64-weight units: the AVX2 kernel takes it.
    EXPECT_TRUE(std::string(cpu_matmul_kernel(DType::I8_ROW, 96).name).ends_with(".avx2"))
        << cpu_matmul_kernel(DType::I8_ROW, 96).name;
    // Repacking kernels only where the caller will repack.
    EXPECT_EQ(cpu_matmul_kernel(DType::Q4_0, 96).repack, nullptr);
    EXPECT_NE(cpu_matmul_kernel(DType::Q4_0, 96, CpuIsa::kAvx512, true).repack, nullptr);
  }
  if (GetParam() == CpuIsa::kAvx2) {
    // The 8-row kernels where the caller repacks, their file-row twins where not.
    for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::IQ4_NL, DType::Q8_0, DType::Q4_K,
                    DType::Q5_K, DType::Q6_K, DType::I4_G128, DType::I4_TENSOR, DType::F16,
                    DType::BF16, DType::F32}) {
      const bool f = t == DType::F16 || t == DType::BF16 || t == DType::F32;
      EXPECT_STREQ(std::strchr(cpu_matmul_kernel(t, 256, CpuIsa::kAvx2, true).name, '.'),
                   ".r8.avx2");
      EXPECT_STREQ(std::strchr(cpu_matmul_kernel(t, 256).name, '.'), f ? ".f32.avx2" : ".q8.avx2");
    }
  }
}

// Load-time repacking (the 16-row interleaved layouts): on `isa`, the same
// bits as the same ISA's kernel on the file's rows, for every shape, row
// counts that are not whole groups of 16 included. With `also`, the repacked
// kernel of that ISA gives the same bits too. Returns the cases checked.
// A repacking kernel for (type, k), or null where the source has none.
using RepackedKernelFor = std::function<const MatmulKernel*(DType, int64_t)>;

int check_repacked_layouts(CpuIsa isa, const std::vector<DType>& types,
                           std::vector<RepackedKernelFor> also = {}) {
  const CpuIsa saved = cpu_isa();
  set_cpu_isa(isa);
  ThreadPool pool(2);
  uint32_t seed = 900;
  int n_checked = 0;
  for (DType t : types) {
    const bool k_quant = t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
    const bool f = t == DType::F16 || t == DType::BF16 || t == DType::F32;
    const std::vector<int64_t> ks = k_quant ? std::vector<int64_t>{256, 512, 1536, 768}
                                    : f     ? std::vector<int64_t>{7, 90, 256, 577}
                                            : std::vector<int64_t>{32, 96, 256, 576};
    for (int64_t k : ks) {
      for (int64_t n_rows : {1, 7, 9, 15, 16, 17, 37, 64}) {
        for (int64_t n_tok : {1, 2, 3, 5, 8, 9, 33}) {
          SCOPED_TRACE(testing::Message() << cpu_isa_name(isa) << " " << dtype_name(t) << " k=" << k
                                          << " rows=" << n_rows << " tokens=" << n_tok);
          const std::vector<float> w = gaussian(static_cast<size_t>(k * n_rows), seed, 0.02f);
          const std::vector<float> x = gaussian(static_cast<size_t>(k * n_tok), seed + 1);
          ++seed;
          std::vector<uint8_t> q(tensor_bytes(t, k, n_rows));
          quantize_tensor(t, w.data(), k, n_rows, q.data());
          const WeightView plain = make_weight_view(t, k, n_rows, q.data());
          EXPECT_EQ(plain.kernel->repack, nullptr) << plain.kernel->name;
          PreparedActs acts;
          prepare_acts(pool, plain.kernel->act, x.data(), n_tok, k, acts);
          std::vector<float> y0(static_cast<size_t>(n_tok * n_rows), -1.0f);
          matmul(pool, plain, acts, y0.data(), n_rows);
          std::vector<RepackedKernelFor> packs = {
              [isa](DType ty, int64_t kk) { return &cpu_matmul_kernel(ty, kk, isa, true); }};
          packs.insert(packs.end(), also.begin(), also.end());
          for (const RepackedKernelFor& p : packs) {
            WeightView packed = plain;
            packed.kernel = p(t, k);
            EXPECT_NE(packed.kernel, nullptr) << dtype_name(t);
            if (packed.kernel == nullptr) return n_checked;
            EXPECT_NE(packed.kernel->repack, nullptr) << packed.kernel->name;
            if (packed.kernel->repack == nullptr) return n_checked;
            RepackArena copy;
            const size_t at = copy.reserve(repacked_bytes(packed));
            copy.allocate();
            repack_weight(pool, packed, copy.at(at));
            std::vector<float> y1(y0.size(), -2.0f);
            matmul(pool, packed, acts, y1.data(), n_rows);
            EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * sizeof(float)), 0)
                << packed.kernel->name << ": first values " << y0[0] << " vs " << y1[0];
          }
          ++n_checked;
        }
      }
    }
  }
  set_cpu_isa(saved);
  return n_checked;
}

TEST(QuantKernels, RepackedLayoutsGiveTheBitsOfTheFileLayout) {
  if (!cpu_isa_available(CpuIsa::kAvx512))
    GTEST_SKIP() << "the 16-row layouts here are AVX-512 kernels, not on this CPU (best here: "
                 << cpu_isa_name(cpu_best_isa()) << ")";
  const std::vector<DType> types = {DType::Q4_0,    DType::Q4_1,      DType::Q5_0, DType::IQ4_NL,
                                    DType::Q8_0,    DType::Q4_K,      DType::Q5_K, DType::Q6_K,
                                    DType::I4_G128, DType::I4_TENSOR, DType::F16,  DType::BF16,
                                    DType::F32};
  EXPECT_EQ(check_repacked_layouts(CpuIsa::kAvx512, types), 13 * 4 * 8 * 7);
}

// The AVX2 kernels on the same layouts (two halves of 8 rows): the bits of
// the AVX2 kernel on the file's rows, and, where the CPU has AVX-512, of the
// AVX-512 kernel on the layout (one arithmetic contract for both ISAs) and of
// the avxvnni copy's code (built on EVEX vpdpbusd there).
TEST(QuantKernels, Avx2EightRowKernelsGiveTheBitsOfTheFileLayoutAndOfAvx512) {
  if (!cpu_isa_available(CpuIsa::kAvx2))
    GTEST_SKIP() << "no avx2 kernels on this CPU or build (best here: "
                 << cpu_isa_name(cpu_best_isa()) << ")";
  const std::vector<DType> types = {DType::Q4_0,    DType::Q4_1,      DType::Q5_0, DType::IQ4_NL,
                                    DType::Q8_0,    DType::Q4_K,      DType::Q5_K, DType::Q6_K,
                                    DType::I4_G128, DType::I4_TENSOR, DType::F16,  DType::BF16,
                                    DType::F32};
  std::vector<RepackedKernelFor> also;
  if (cpu_isa_available(CpuIsa::kAvx512)) {
    also.emplace_back(
        [](DType t, int64_t k) { return &cpu_matmul_kernel(t, k, CpuIsa::kAvx512, true); });
    // The avxvnni copy's arithmetic (vpdpbusd on 256 bits), built with the
    // EVEX encoding in the avx512 copy: AVX-VNNI itself is on no machine here.
    also.emplace_back([](DType t, int64_t) -> const MatmulKernel* {
      const CpuKernelSet& s = cpu_kernel_set(CpuIsa::kAvx512);
      for (size_t i = 0; i < s.n_r8_vnni; ++i)
        if (s.r8_vnni[i].type == t && s.r8_vnni[i].repack != nullptr) return &s.r8_vnni[i];
      return nullptr;
    });
  }
  EXPECT_EQ(check_repacked_layouts(CpuIsa::kAvx2, types, also), 13 * 4 * 8 * 7);
}

// The vector activation quantizers (AVX2, AVX-512; prepare_acts uses them) give the scalar
// reference's bits, NaN, Inf, signed zeros, subnormals and zero blocks included.
TEST_P(QuantKernelsIsa, VectorActivationQuantizerGivesTheScalarBits) {
  const auto quantize = cpu_kernel_set(GetParam()).quantize_row_q8;
  if (GetParam() == CpuIsa::kScalar) {
    EXPECT_EQ(quantize, nullptr) << "the scalar copy is the reference itself";
    return;
  }
  ASSERT_NE(quantize, nullptr);
  const int64_t k = 32 * 64;
  for (float sd : {1e-30f, 1e-3f, 1.0f, 1e3f, 3e38f}) {
    std::vector<float> x = gaussian(static_cast<size_t>(k), static_cast<uint32_t>(sd * 7 + 3), sd);
    x[5] = NAN;
    x[40] = INFINITY;
    x[70] = -INFINITY;
    x[100] = -0.0f;
    x[130] = 1e-45f;  // subnormal
    std::fill(x.begin() + 32 * 10, x.begin() + 32 * 11, 0.0f);
    std::fill(x.begin() + 32 * 12, x.begin() + 32 * 13, NAN);
    std::vector<BlockQ8Act> a(static_cast<size_t>(k / 32)), b(a.size());
    quantize_row_q8_act(x.data(), a.data(), k);
    quantize(x.data(), b.data(), k);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(BlockQ8Act)), 0) << "block " << i << " sd " << sd;
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, QuantKernelsIsa, testing::ValuesIn(kAllCpuIsas),
                         [](const testing::TestParamInfo<CpuIsa>& i) {
                           return std::string(cpu_isa_name(i.param));
                         });

TEST(QuantKernels, FastKernelsAreBoundWhereTheyApply) {
  for (DType t : kOwn) {
    const MatmulKernel& k256 = cpu_matmul_kernel(t, 256);
    EXPECT_EQ(k256.type, t);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    EXPECT_EQ(std::string(k256.name).find("dequant"), std::string::npos) << k256.name;
#endif
  }
  // Rows that are not whole Q8 activation blocks fall back to the reference.
  EXPECT_EQ(cpu_matmul_kernel(DType::I8_ROW, 172).act, ActFormat::kF32);
  EXPECT_NE(std::string(cpu_matmul_kernel(DType::I8_ROW, 172).name).find("dequant"),
            std::string::npos);
}

}  // namespace
}  // namespace barata
