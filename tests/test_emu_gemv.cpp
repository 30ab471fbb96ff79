// The decode matmul (kernels/gemv.cu) under the CUDA emulation, and its block
// decoding helpers (kernels/block_decode.cuh) on the host.
//
// The helpers must equal barata's reference dequantization bit for bit. The
// kernel is checked against a float64 dot product of the reference-
// dequantized rows with the activations. Its weights are exact (they are the
// helpers' values), so the whole error is the fp32 accumulation: each lane
// sums at most 4 * ceil(k / 128) products in order (4 consecutive elements of
// every 128-element step, one rounding for the product and one for the sum
// here on the host, a single FMA rounding on a GPU), then 5 butterfly levels,
// at most 3 more additions across warps and one rounding for the scale. With
// u = 2^-24 that is |y - scale * dot| <= (4 ceil(k/128) + 10) u |scale|
// sum_j |w_j x_j| (Higham's bound for recursive summation, first order), plus
// a tiny absolute term for underflow. For k = 4864 that is 9.7e-6 relative to
// sum |w x|: about the 1e-5 of a plain fp32 dot of that length, and it shrinks
// with k. A decode bug (a wrong nibble, scale or block) is a whole weight
// wrong, orders of magnitude above it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "barata/dtype.h"
#include "barata/error.h"
#include "barata/quant_blocks.h"
#include "block_decode.cuh"
#include "gemv.cuh"
#include "sanitizer.h"

namespace barata {
namespace {

using cuda::kGemvMaxTokens;
using cuda::launch_gemv;

// ---- block_decode.cuh against dequantize_tensor, bit for bit ----------------------

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Random blocks of whole random bytes (any fp16 scale: subnormal, inf, NaN),
// except every 4th block whose scales are ordinary, as a file's would be.
std::vector<uint8_t> random_block_bytes(DType t, int n_blocks, std::mt19937& rng) {
  const size_t bs = dtype_traits(t).bytes_per_block;
  std::vector<uint8_t> b(bs * n_blocks);
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  for (int i = 0; i < n_blocks; i += 4) {
    uint8_t* blk = b.data() + bs * i;
    blk[1] = static_cast<uint8_t>(0x20 + rng() % 16);  // |d| ~ 2^-7, sign bit clear
    if (t == DType::Q4_1) blk[3] = static_cast<uint8_t>(0xa0 + rng() % 16);  // m < 0
  }
  return b;
}

using ElementFn = float (*)(const unsigned char*, int);

void check_blocks(DType t, ElementFn element) {
  SCOPED_TRACE(dtype_name(t));
  std::mt19937 rng(1234 + static_cast<uint32_t>(t));
  constexpr int kBlocks = 2048;
  const std::vector<uint8_t> blocks = random_block_bytes(t, kBlocks, rng);
  const size_t bs = dtype_traits(t).bytes_per_block;
  std::vector<float> ref(static_cast<size_t>(kBlocks) * 32);
  dequantize_tensor(t, blocks.data(), 32 * kBlocks, 1, ref.data());
  // Each block also read at every misalignment from an odd-offset copy.
  std::vector<uint8_t> shifted(blocks.size() + 8);
  int bad = 0;
  for (int off = 0; off < 4; ++off) {
    std::memcpy(shifted.data() + off, blocks.data(), blocks.size());
    for (int b = 0; b < kBlocks; ++b) {
      for (int j = 0; j < 32; ++j) {
        const float got = element(shifted.data() + off + bs * b, j);
        const float want = ref[32 * b + j];
        if (float_bits(got) != float_bits(want) && bad++ < 5)
          ADD_FAILURE() << "block " << b << " element " << j << " offset " << off << ": got " << got
                        << " (0x" << std::hex << float_bits(got) << ") want " << want << " (0x"
                        << float_bits(want) << std::dec << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(GemvBlockDecode, Q4_0BitExact) {
  check_blocks(DType::Q4_0, cuda::q4_0_element);
}
TEST(GemvBlockDecode, Q4_1BitExact) {
  check_blocks(DType::Q4_1, cuda::q4_1_element);
}
TEST(GemvBlockDecode, Q8_0BitExact) {
  check_blocks(DType::Q8_0, cuda::q8_0_element);
}

// Every 16-bit pattern, F16 and BF16; random F32 bit patterns. A NaN only
// has to stay a NaN: whether a signalling fp16 NaN comes out quieted depends
// on the converter (F16C and the GPU's cvt set the quiet bit, portable code
// keeps the payload as it is), in the reference as much as here.
bool same_float(float a, float b) {
  return float_bits(a) == float_bits(b) || (std::isnan(a) && std::isnan(b));
}

TEST(GemvBlockDecode, FloatsBitExact) {
  std::vector<uint8_t> bytes(2 * 65536 + 1);
  for (uint32_t i = 0; i < 65536; ++i) {
    bytes[1 + 2 * i] = static_cast<uint8_t>(i);
    bytes[2 + 2 * i] = static_cast<uint8_t>(i >> 8);
  }
  for (DType t : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<float> ref(65536);
    dequantize_tensor(t, bytes.data() + 1, 65536, 1, ref.data());
    int bad = 0;
    for (int64_t j = 0; j < 65536; ++j) {
      const float got = t == DType::F16 ? cuda::f16_element(bytes.data() + 1, j)
                                        : cuda::bf16_element(bytes.data() + 1, j);
      if (!same_float(got, ref[j]) && bad++ < 5)
        ADD_FAILURE() << "pattern 0x" << std::hex << j << std::dec << ": got " << got << " want "
                      << ref[j];
    }
    EXPECT_EQ(bad, 0);
  }
  std::mt19937 rng(7);
  std::vector<uint8_t> f32(4 * 4096 + 3);
  for (auto& v : f32) v = static_cast<uint8_t>(rng());
  std::vector<float> ref(4096);
  dequantize_tensor(DType::F32, f32.data() + 3, 4096, 1, ref.data());
  for (int64_t j = 0; j < 4096; ++j)
    ASSERT_EQ(float_bits(cuda::f32_element(f32.data() + 3, j)), float_bits(ref[j])) << j;
}

// The funnel shift that assembles unaligned words in the kernel.
TEST(GemvBlockDecode, FunnelWord) {
  const unsigned char b[8] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88};
  const uint32_t lo = cuda::load_le32(b), hi = cuda::load_le32(b + 4);
  for (uint32_t s = 0; s < 4; ++s) EXPECT_EQ(cuda::funnel_word(lo, hi, s), cuda::load_le32(b + s));
}

// ---- the kernel ---------------------------------------------------------------------

struct Case {
  DType type;
  int64_t k, n_rows;
  size_t w_offset = 0;  // bytes: the matrix at an address of any alignment
  size_t row_pad = 0;   // row stride = row bytes + row_pad
  size_t x_offset = 0;  // floats: activations not 16-byte aligned
  float scale = 0.37f;
};

std::string describe(const Case& c, int64_t n_tok) {
  return std::string(dtype_name(c.type)) + " k=" + std::to_string(c.k) +
         " rows=" + std::to_string(c.n_rows) + " n_tok=" + std::to_string(n_tok) +
         " w_offset=" + std::to_string(c.w_offset) + " row_pad=" + std::to_string(c.row_pad) +
         " x_offset=" + std::to_string(c.x_offset) + " scale=" + std::to_string(c.scale);
}

constexpr float kSentinel = -12345.0f;

class EmuGemv : public ::testing::Test {
 protected:
  // Runs every n_tok in 1..8 on one weight matrix (a few of them on the
  // larger ones, which the emulation runs slowly).
  void check(const Case& c) {
    std::mt19937 rng(static_cast<uint32_t>(c.k * 7919 + c.n_rows * 31 + c.w_offset * 3 + c.row_pad +
                                           static_cast<uint32_t>(c.type)));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const int64_t k = c.k, n = c.n_rows;

    std::vector<float> src(static_cast<size_t>(k * n));
    for (auto& v : src) v = normal(rng) * 0.05f;
    for (int i = 0; i < 8 && !src.empty(); ++i) src[rng() % src.size()] = 0.8f;  // outliers
    const size_t need = row_bytes(c.type, k);
    std::vector<uint8_t> packed(tensor_bytes(c.type, k, n));
    quantize_tensor(c.type, src.data(), k, n, packed.data());
    std::vector<float> deq(src.size());
    dequantize_tensor(c.type, packed.data(), k, n, deq.data());

    // The matrix as the kernel sees it: at w_offset, rows row_pad bytes apart
    // beyond their size, the padding filled with NaN-ish garbage bytes. Only
    // the bytes the contract names are allocated (no slack after the last row).
    const size_t stride = need + c.row_pad;
    std::vector<uint8_t> wbuf(c.w_offset + (n - 1) * stride + need, 0xff);
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(wbuf.data() + c.w_offset + r * stride, packed.data() + r * need, need);

    std::vector<float> xbuf(c.x_offset + kGemvMaxTokens * k);
    for (auto& v : xbuf) v = uniform(rng);
    const float* x = xbuf.data() + c.x_offset;

    const bool big = k * n > 100000;
    for (int64_t n_tok = 1; n_tok <= kGemvMaxTokens; ++n_tok) {
      if (big && n_tok != 1 && n_tok != 2 && n_tok != 5 && n_tok != kGemvMaxTokens) continue;
      SCOPED_TRACE(describe(c, n_tok));
      const int64_t ldy = n + 3;
      std::vector<float> y(static_cast<size_t>(ldy * n_tok), kSentinel);
      launch_gemv(c.type, wbuf.data() + c.w_offset, stride, k, n, c.scale, x, n_tok, y.data(), ldy,
                  nullptr);
      int bad = 0;
      const double slack = (4.0 * std::ceil(k / 128.0) + 10.0) * std::ldexp(1.0, -24);
      for (int64_t t = 0; t < n_tok; ++t) {
        for (int64_t r = 0; r < ldy; ++r) {
          const float got = y[t * ldy + r];
          if (r >= n) {
            if (got != kSentinel && bad++ < 5)
              ADD_FAILURE() << "y[" << t << "][" << r << "] written";
            continue;
          }
          double dot = 0.0, mag = 0.0;
          for (int64_t j = 0; j < k; ++j) {
            const double p = static_cast<double>(deq[r * k + j]) * x[t * k + j];
            dot += p;
            mag += std::fabs(p);
          }
          const double want = c.scale * dot;
          const double bound = slack * std::fabs(c.scale) * mag + 1e-30;
          if (!(std::fabs(got - want) <= bound) && bad++ < 5)
            ADD_FAILURE() << "row " << r << " token " << t << ": got " << got << " want " << want
                          << " (err " << std::fabs(got - want) << " > bound " << bound << ")";
        }
      }
      ASSERT_EQ(bad, 0);
    }
  }
};

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1};

TEST_F(EmuGemv, AllTypesAndShapes) {
  for (DType t : kTypes) {
    std::vector<int64_t> ks = {32, 96, 896, 4864};
    if (dtype_traits(t).block_size == 1) ks.insert(ks.end(), {17, 100, 1});
    for (int64_t k : ks)
      for (int64_t n_rows : {1, 7, 33, 130}) check(Case{t, k, n_rows});
  }
}

// Misaligned matrices (each possible byte phase), padded strides, unaligned
// activations, other scales.
TEST_F(EmuGemv, AlignmentAndStrides) {
  for (DType t : kTypes) {
    for (size_t off : {1, 2, 3, 5, 8, 13}) check(Case{t, 96, 9, off});
    check(Case{t, 896, 6, 7, 5});
    check(Case{t, 4864, 5, 3, 1, 1, -1.5f});
    check(Case{t, 128, 13, 0, 3, 2, 1.0f});
    check(Case{t, 2048, 3, 0, 0, 3, 0.0f});
  }
  for (int64_t k : {17, 31, 33, 1}) {
    check(Case{DType::F16, k, 11, 1, 0, 1});
    check(Case{DType::BF16, k, 11, 3, 1});
    check(Case{DType::F32, k, 11, 2, 3, 3});
  }
}

// launch_gemv_grouped (a mixture of experts' experts in one launch): three
// matrices at their own addresses, 3, 1 and 4 rows of x each, under a
// launch sized for 4: each group's outputs are the ones launch_gemv gives
// it alone, and nothing outside its rows is written.
TEST(EmuGemvGrouped, EachGroupAsItsOwnLaunch) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (DType t : kTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t k = 256, n = 40, ldy = n + 3;
    const size_t rb = row_bytes(t, k);
    std::vector<std::vector<uint8_t>> w(3, std::vector<uint8_t>(rb * n));
    for (auto& m : w) {
      std::vector<float> src(static_cast<size_t>(k * n));
      for (auto& v : src) v = normal(rng);
      quantize_tensor(t, src.data(), k, n, m.data());
    }
    std::vector<float> x(static_cast<size_t>(8 * k));
    for (auto& v : x) v = normal(rng) * 10.0f;
    const std::vector<cuda::GemvGroup> groups = {
        {w[0].data(), 0, 3, 0}, {w[1].data(), 3, 1, 3}, {w[2].data(), 4, 4, 4}};
    std::vector<float> got(static_cast<size_t>(ldy * 8), kSentinel), want = got;
    cuda::launch_gemv_grouped(t, groups.data(), 3, 4, rb, k, n, 0.5f, x.data(), got.data(), ldy,
                              nullptr);
    for (const auto& g : groups)
      launch_gemv(t, g.w, rb, k, n, 0.5f, x.data() + g.x_row * k, g.n_tok,
                  want.data() + g.y_row * ldy, ldy, nullptr);
    for (size_t i = 0; i < got.size(); ++i) {
      const float scale = std::max(std::fabs(want[i]), 1.0f);
      ASSERT_LE(std::fabs(got[i] - want[i]), 1e-5f * scale)
          << "y[" << i / ldy << "][" << i % ldy << "]";
    }
  }
}

// A long row: several segments per warp and all four warps of a CTA.
TEST_F(EmuGemv, LongRows) {
  for (DType t : kTypes) check(Case{t, 32 * 1024, 5, 1, 2});
  check(Case{DType::F32, 1000, 9});
}

TEST(EmuGemvArgs, Supported) {
  for (DType t : kTypes) EXPECT_TRUE(cuda::gemv_supported(t)) << dtype_name(t);
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q5_0, DType::IQ4_NL, DType::I8_ROW})
    EXPECT_FALSE(cuda::gemv_supported(t)) << dtype_name(t);
}

TEST(EmuGemvArgs, BadArgumentsThrow) {
  std::vector<uint8_t> w(34 * 4 * 8, 0);
  std::vector<float> x(8 * 128, 1.0f), y(8 * 64, 0.0f);
  auto run = [&](DType t, size_t rb, int64_t k, int64_t n_rows, int64_t n_tok, int64_t ldy) {
    launch_gemv(t, w.data(), rb, k, n_rows, 1.0f, x.data(), n_tok, y.data(), ldy, nullptr);
  };
  EXPECT_THROW(run(DType::Q4_K, 144, 256, 1, 1, 1), Error);
  EXPECT_THROW(run(DType::Q4_0, 72, 128, 4, 0, 4), Error);
  EXPECT_THROW(run(DType::Q4_0, 72, 128, 4, 9, 4), Error);
  EXPECT_THROW(run(DType::Q4_0, 72, 112, 4, 1, 4), Error);  // not whole blocks
  EXPECT_THROW(run(DType::Q4_0, 72, 0, 4, 1, 4), Error);    // empty rows
  EXPECT_THROW(run(DType::Q4_0, 71, 128, 4, 1, 4), Error);  // stride below a row
  EXPECT_THROW(run(DType::Q4_0, 72, 128, 4, 2, 3), Error);  // outputs overlap
  EXPECT_THROW(run(DType::Q4_0, 72, 128, -1, 1, 4), Error);
  EXPECT_THROW(
      launch_gemv(DType::F32, nullptr, 512, 128, 1, 1.0f, x.data(), 1, y.data(), 1, nullptr),
      Error);
  EXPECT_NO_THROW(run(DType::Q4_0, 72, 128, 0, 1, 0));  // nothing to do
  EXPECT_NO_THROW(run(DType::Q4_0, 72, 128, 4, 1, 0));  // one token: ldy unused
}

}  // namespace
}  // namespace barata
