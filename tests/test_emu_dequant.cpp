// cuda_dequantize_to_f16 under the CUDA emulation (kernels/emu/), against the
// CPU reference dequantize_tensor rounded by fp32_to_fp16, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "barata/dtype.h"
#include "barata/error.h"
#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "dequant.cuh"

namespace barata {
namespace {

using cuda::cuda_dequantize_to_f16;

// Emulated device memory: cudaMalloc's 256-byte alignment.
struct Buf {
  explicit Buf(size_t n) { cudaMalloc(&p, n ? n : 1); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(p); }
  void* p = nullptr;
};

// Finite values only: NaN payloads are rounded differently by the hardware
// (canonical 0x7fff) and by fp32_to_fp16 (payload kept).
uint16_t random_scale(std::mt19937& rng) {
  switch (rng() % 8) {
    case 0:
      return static_cast<uint16_t>(rng() & 0x83ffu);  // +-subnormal or +-0
    case 1:
      return fp32_to_fp16(std::uniform_real_distribution<float>(-65504, 65504)(rng));
    default:
      return fp32_to_fp16(std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng));
  }
}

// Random bytes with fp16 scales / values that are not NaN.
std::vector<uint8_t> random_data(DType type, int64_t n, std::mt19937& rng) {
  const DTypeTraits& tr = dtype_traits(type);
  std::vector<uint8_t> bytes(static_cast<size_t>(n / tr.block_size) * tr.bytes_per_block);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  auto put16 = [&](size_t at, uint16_t v) { std::memcpy(bytes.data() + at, &v, 2); };
  for (int64_t i = 0; i < n / tr.block_size; ++i) {
    const size_t at = static_cast<size_t>(i) * tr.bytes_per_block;
    switch (type) {
      case DType::F32: {
        uint32_t u;
        std::memcpy(&u, bytes.data() + at, 4);
        if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) u &= ~0x7fffffu;  // NaN -> inf
        if (rng() % 2) {  // also ordinary magnitudes, where rounding ties matter
          const float f = std::uniform_real_distribution<float>(-70000, 70000)(rng);
          std::memcpy(&u, &f, 4);
        }
        std::memcpy(bytes.data() + at, &u, 4);
        break;
      }
      case DType::F16:
        put16(at, random_scale(rng));
        break;
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, bytes.data() + at, 2);
        if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu)) h &= 0xff80u;
        put16(at, h);
        break;
      }
      case DType::Q4_1:
        put16(at + 2, random_scale(rng));
        [[fallthrough]];
      default:
        put16(at, random_scale(rng));
    }
  }
  return bytes;
}

::testing::AssertionResult halves_equal(const uint16_t* got, const std::vector<uint16_t>& want) {
  int bad = 0;
  auto fail = ::testing::AssertionFailure();
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i] && bad++ < 5)
      fail << "[" << i << "] got 0x" << std::hex << got[i] << " want 0x" << want[i] << std::dec
           << "; ";
  }
  if (bad) return fail << bad << " of " << want.size() << " differ";
  return ::testing::AssertionSuccess();
}

void check(DType type, int64_t n, size_t src_offset) {
  SCOPED_TRACE(std::string(dtype_name(type)) + ", n " + std::to_string(n) + ", source offset " +
               std::to_string(src_offset));
  std::mt19937 rng(static_cast<uint32_t>(n * 131 + src_offset + static_cast<int>(type)));
  const std::vector<uint8_t> data = random_data(type, n, rng);
  std::vector<float> ref(static_cast<size_t>(n));
  dequantize_tensor(type, data.data(), n, 1, ref.data());
  std::vector<uint16_t> want(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) want[i] = fp32_to_fp16(ref[i]);

  Buf src(data.size() + src_offset), dst(want.size() * 2 + 64);
  // Uploaded as on a GPU (the race checker tracks what cudaMalloc'd memory holds).
  cudaMemcpy(src.get() + src_offset, data.data(), data.size(), cudaMemcpyHostToDevice);
  cudaMemset(dst.get(), 0xff, want.size() * 2 + 64);
  cuda_dequantize_to_f16(type, src.get() + src_offset, dst.get(), n, nullptr);
  EXPECT_TRUE(halves_equal(reinterpret_cast<const uint16_t*>(dst.get()), want));
  for (size_t i = want.size() * 2; i < want.size() * 2 + 64; ++i)
    ASSERT_EQ(dst.get()[i], 0xff) << "wrote past the end, byte " << i;
}

TEST(EmuDequant, BlockTypesMatchReference) {
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1})
    for (int64_t n_blocks : {1, 7, 64, 65, 1000})
      for (size_t offset : {0, 2}) check(t, n_blocks * 32, offset);
}

TEST(EmuDequant, FloatTypesMatchReference) {
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {1, 7, 8, 9, 100, 1000, 2048, 2049, 70001})
      for (size_t offset : {0, 2, 16}) check(t, n, offset);
}

TEST(EmuDequant, Supported) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1})
    EXPECT_TRUE(cuda::dequant_f16_supported(t)) << dtype_name(t);
  for (DType t : {DType::Q4_K, DType::Q6_K, DType::Q5_0, DType::IQ4_NL, DType::I8_ROW})
    EXPECT_FALSE(cuda::dequant_f16_supported(t)) << dtype_name(t);
}

TEST(EmuDequant, RejectsWhatItCannotDo) {
  Buf dst(1024);
  EXPECT_THROW(cuda_dequantize_to_f16(DType::Q4_K, dst.get(), dst.get(), 256, nullptr), Error);
  EXPECT_THROW(cuda_dequantize_to_f16(DType::Q8_0, dst.get(), dst.get(), 33, nullptr), Error);
  EXPECT_THROW(cuda_dequantize_to_f16(DType::F16, dst.get(), dst.get() + 8, 32, nullptr), Error);
  EXPECT_THROW(cuda_dequantize_to_f16(DType::F32, dst.get(), dst.get(), -1, nullptr), Error);
  EXPECT_NO_THROW(cuda_dequantize_to_f16(DType::Q8_0, nullptr, dst.get(), 0, nullptr));
}

}  // namespace
}  // namespace barata
