// Reference quantizers of Q4_K, Q5_K, Q6_K and IQ4_NL: round-trip accuracy
// through barata's dequantizers, and byte-equality with llama.cpp's reference
// quantizers on the vectors in tests/data/kquants (see its README.md).
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "barata/dtype.h"
#include "barata/error.h"
#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "test_util.h"

namespace barata {
namespace {

struct KQuantCase {
  DType type;
  double gaussian_bound;  // relative RMS error allowed on N(0, 1) rows
  double outlier_bound;   // ... on N(0, 1) rows with a few 20-50x outliers
};

// Bounds sit about 10% above the worst row seen over many seeds, so a
// regression in the fit shows while float-level changes do not. Worst row,
// gaussian / outliers, with the seeds used below: Q4_K 0.0729 / 0.0985,
// Q5_K 0.0368 / 0.0489, Q6_K 0.0183 / 0.0343, IQ4_NL 0.0808 / 0.1142; over
// 20 / 50 other seeds: 0.0738 / 0.1020, 0.0375 / 0.0593, 0.0183 / 0.0367,
// 0.0809 / 0.1197.
constexpr KQuantCase kCases[] = {
    {DType::Q4_K, 0.080, 0.110},
    {DType::Q5_K, 0.041, 0.065},
    {DType::Q6_K, 0.020, 0.040},
    {DType::IQ4_NL, 0.089, 0.130},
};

std::string case_name(const ::testing::TestParamInfo<KQuantCase>& info) {
  return dtype_name(info.param.type);
}

std::vector<uint8_t> quantize(DType t, const std::vector<float>& x) {
  const auto& tr = dtype_traits(t);
  std::vector<uint8_t> q(dtype_bytes(t, static_cast<int64_t>(x.size())));
  tr.quantize_row(x.data(), q.data(), static_cast<int64_t>(x.size()));
  return q;
}

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
  const auto q = quantize(t, x);
  std::vector<float> y(x.size());
  dtype_traits(t).dequantize_row(q.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

double relative_rms_error(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(x[i]) - y[i];
    err += d * d;
    ref += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

constexpr int64_t kRowLen = 4096;

// std::normal_distribution differs between standard libraries; this one does
// not (mt19937 is fully specified; Box-Muller differs at most in the last ulp).
class Sampler {
 public:
  explicit Sampler(uint32_t seed) : gen_(seed) {}
  double uniform() { return (static_cast<double>(gen_() >> 8) + 0.5) * 0x1.0p-24; }
  float normal() {
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    return static_cast<float>(r * std::cos(6.283185307179586 * uniform()));
  }
  int64_t index(int64_t n) { return static_cast<int64_t>(gen_() % static_cast<uint32_t>(n)); }
  std::vector<float> gaussian_row() {
    std::vector<float> x(kRowLen);
    for (auto& v : x) v = normal();
    return x;
  }

 private:
  std::mt19937 gen_;
};

class KQuantRoundTrip : public ::testing::TestWithParam<KQuantCase> {};

TEST_P(KQuantRoundTrip, GaussianRowsStayWithinBound) {
  const auto& c = GetParam();
  Sampler rng(1234);
  for (int row = 0; row < 16; ++row) {
    const auto x = rng.gaussian_row();
    const double e = relative_rms_error(x, round_trip(c.type, x));
    EXPECT_LT(e, c.gaussian_bound) << "row " << row;
    // The floor catches a round trip that never really went through the
    // quantized form (e.g. a dequantizer reading the wrong buffer of floats).
    EXPECT_GT(e, c.gaussian_bound / 20) << "row " << row;
  }
}

TEST_P(KQuantRoundTrip, RowsWithOutliersStayWithinBound) {
  const auto& c = GetParam();
  Sampler rng(99);
  for (int row = 0; row < 8; ++row) {
    auto x = rng.gaussian_row();
    for (int k = 0; k < 8; ++k)
      x[rng.index(kRowLen)] *= static_cast<float>(20 + 30 * rng.uniform());
    EXPECT_LT(relative_rms_error(x, round_trip(c.type, x)), c.outlier_bound) << "row " << row;
  }
}

TEST_P(KQuantRoundTrip, ZeroRowRoundTripsToExactZeros) {
  const auto& c = GetParam();
  const std::vector<float> x(kRowLen, 0.f);
  for (float v : round_trip(c.type, x)) ASSERT_EQ(v, 0.f);
}

TEST_P(KQuantRoundTrip, ConstantRowIsNearlyExact) {
  const auto& c = GetParam();
  for (float value : {0.75f, -3.5f}) {
    const std::vector<float> x(kRowLen, value);
    // Only the fp16 / 6-bit rounding of the scales remains (measured <= 2.5e-4).
    EXPECT_LT(relative_rms_error(x, round_trip(c.type, x)), 1e-3) << "value " << value;
  }
}

TEST_P(KQuantRoundTrip, RejectsPartialBlocks) {
  const auto& c = GetParam();
  const auto& tr = dtype_traits(c.type);
  const std::vector<float> x(static_cast<size_t>(tr.block_size + 1), 1.f);
  std::vector<uint8_t> q(2 * tr.bytes_per_block);
  EXPECT_THROW(tr.quantize_row(x.data(), q.data(), tr.block_size + 1), Error);
}

INSTANTIATE_TEST_SUITE_P(KQuant, KQuantRoundTrip, ::testing::ValuesIn(kCases), case_name);

// ---- byte-equality with llama.cpp ------------------------------------------

std::filesystem::path vectors_dir() {
  return test::source_dir() / "tests/data/kquants";
}

constexpr int kVectorRows = 16, kVectorRowLen = 1024;

std::vector<float> vector_inputs() {
  const auto bytes = test::read_bytes(vectors_dir() / "inputs.f32");
  std::vector<float> x(bytes.size() / 4);
  std::memcpy(x.data(), bytes.data(), x.size() * 4);
  return x;
}

// Quantizes the rows one call at a time, as the llama.cpp driver did, and
// compares block by block. Where payload_unspecified(llama.cpp's block) holds,
// llama.cpp leaves the payload undefined and only the first header_bytes count.
void expect_matches_llama_cpp(DType t, size_t header_bytes,
                              bool (*payload_unspecified)(const uint8_t*)) {
  const auto& tr = dtype_traits(t);
  const auto x = vector_inputs();
  ASSERT_EQ(x.size(), size_t{kVectorRows * kVectorRowLen});
  const auto want = test::read_bytes(vectors_dir() / (std::string(tr.name) + ".bin"));
  const size_t row_bytes = dtype_bytes(t, kVectorRowLen);
  ASSERT_EQ(want.size(), kVectorRows * row_bytes);

  std::vector<uint8_t> got(want.size());
  for (int r = 0; r < kVectorRows; ++r)
    tr.quantize_row(x.data() + r * kVectorRowLen, got.data() + r * row_bytes, kVectorRowLen);

  const size_t bb = tr.bytes_per_block;
  int bad = 0;
  for (size_t b = 0; b < want.size() / bb; ++b) {
    const uint8_t* g = got.data() + b * bb;
    const uint8_t* w = want.data() + b * bb;
    const size_t n = payload_unspecified && payload_unspecified(w) ? header_bytes : bb;
    if (std::memcmp(g, w, n) != 0) {
      size_t k = 0;
      while (g[k] == w[k]) ++k;
      if (bad++ < 5)
        ADD_FAILURE() << tr.name << " row " << b * bb / row_bytes << " block "
                      << (b * bb % row_bytes) / bb << ": first differing byte " << k << " (got "
                      << int{g[k]} << ", llama.cpp " << int{w[k]} << ")";
    }
  }
  EXPECT_EQ(bad, 0) << "blocks differing from llama.cpp";
}

TEST(KQuantLlamaCpp, Q4_KMatchesReferenceBytes) {
  expect_matches_llama_cpp(DType::Q4_K, 0, nullptr);
}
TEST(KQuantLlamaCpp, Q5_KMatchesReferenceBytes) {
  expect_matches_llama_cpp(DType::Q5_K, 0, nullptr);
}
TEST(KQuantLlamaCpp, Q6_KMatchesReferenceBytes) {
  expect_matches_llama_cpp(DType::Q6_K, 0, nullptr);
}

TEST(KQuantLlamaCpp, IQ4_NLMatchesReferenceBytes) {
  // For an all-zero block llama.cpp writes d = 0 and leaves the nibbles as
  // stale scratch memory; only d is compared there.
  expect_matches_llama_cpp(DType::IQ4_NL, sizeof(uint16_t), [](const uint8_t* block) {
    BlockIQ4_NL b;
    std::memcpy(&b, block, sizeof b);
    return fp16_to_fp32(b.d) == 0.f;
  });
}

// The committed vectors are small, so they rarely hit the cases where the
// order of float operations decides a code. These 1M generated values do
// (reordering one product in the fits changes ~1% of blocks); only hashes of
// llama.cpp's output are kept. The generator is spelled out so it can be
// rewritten in C for the llama.cpp side: splitmix64, 24-bit uniforms, a sum of
// four uniforms as a bell curve; every float operation is exact or
// correctly-rounded, so the inputs are the same on any IEEE machine.
class GeneratedRows {
 public:
  static constexpr int kRows = 512, kLen = 2048;

  std::vector<float> make() {
    state_ = 4748;
    std::vector<float> x(static_cast<size_t>(kRows) * kLen);
    for (int r = 0; r < kRows; ++r) {
      const float scale = static_cast<float>(1 << (r / 4 % 16)) * 0x1.0p-8f;
      for (int i = 0; i < kLen; ++i) {
        float v;
        switch (r % 4) {
          case 0:
            v = bell() * scale;
            break;
          case 1:  // sparse outliers, 16-47x
            v = bell();
            if (next() % 64 == 0) v *= static_cast<float>(16 + next() % 32);
            break;
          case 2:
            v = uniform() * scale;
            break;
          default:
            v = bell() * static_cast<float>(1 + (i / 32 + r) % 7);
            break;
        }
        x[static_cast<size_t>(r) * kLen + i] = v;
      }
    }
    return x;
  }

 private:
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }
  float bell() {
    float s = uniform();
    s += uniform();
    s += uniform();
    s += uniform();
    return s - 2.0f;
  }
  uint64_t state_ = 0;
};

uint64_t fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

TEST(KQuantLlamaCpp, GeneratedRowsHashMatch) {
  const auto x = GeneratedRows().make();
  ASSERT_EQ(fnv1a(x.data(), x.size() * sizeof(float)), 0xa2d80f44fd8cc8f3ull)
      << "input generator changed; the hashes below no longer apply";
  // FNV-1a 64 of the concatenated rows, from llama.cpp b4748 quantize_row_*_ref
  // (see tests/data/kquants/README.md).
  const std::pair<DType, uint64_t> want[] = {
      {DType::Q4_K, 0x54a8bff2be829508ull},
      {DType::Q5_K, 0x7b371c7fb1c6f43cull},
      {DType::Q6_K, 0x38630c92aac9d021ull},
      {DType::IQ4_NL, 0x88895f2e18f66b32ull},
  };
  for (const auto& [type, hash] : want) {
    const auto& tr = dtype_traits(type);
    const size_t row_bytes = dtype_bytes(type, GeneratedRows::kLen);
    std::vector<uint8_t> q(row_bytes * GeneratedRows::kRows);
    for (int r = 0; r < GeneratedRows::kRows; ++r)
      tr.quantize_row(x.data() + static_cast<size_t>(r) * GeneratedRows::kLen,
                      q.data() + r * row_bytes, GeneratedRows::kLen);
    EXPECT_EQ(fnv1a(q.data(), q.size()), hash) << tr.name;
  }
}

}  // namespace
}  // namespace barata
