// The CUDA fp16 dequantizers against the CPU reference rows, bit for bit. Without
// a GPU the device tests skip, or fail when BARATA_REQUIRE_GPU=1 (scripts/gpu-check.sh).
#include <gtest/gtest.h>

#ifndef BARATA_HAVE_CUDA

TEST(CudaDequant, Unavailable) {
  GTEST_SKIP() << "built without CUDA";
}

#else

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "barata/dtype.h"
#include "barata/error.h"
#include "barata/half.h"
#include "barata/quant_blocks.h"
#include "dequant.cuh"
#include "device.cuh"

namespace barata {
namespace {

using cuda::cuda_dequantize_to_f16;

#define ASSERT_CUDA(expr)                                     \
  do {                                                        \
    const cudaError_t err_ = (expr);                          \
    ASSERT_EQ(err_, cudaSuccess) << cudaGetErrorString(err_); \
  } while (0)

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  unsigned char* get() const { return static_cast<unsigned char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// Finite fp16 scales only: a NaN's payload is kept by fp32_to_fp16 but not by
// __float2half_rn, and NaN weights are not something a model file carries.
// Subnormal scales and ones large enough to overflow to inf are included.
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

template <typename Block>
std::vector<uint8_t> random_blocks(int64_t n_blocks, std::mt19937& rng) {
  std::vector<Block> blocks(static_cast<size_t>(n_blocks));
  for (Block& b : blocks) {
    unsigned char* p = reinterpret_cast<unsigned char*>(&b);
    for (size_t i = 0; i < sizeof(Block); ++i) p[i] = static_cast<unsigned char>(rng());
    b.d = random_scale(rng);
    if constexpr (requires { b.m; }) b.m = random_scale(rng);
  }
  std::vector<uint8_t> bytes(blocks.size() * sizeof(Block));
  std::memcpy(bytes.data(), blocks.data(), bytes.size());
  return bytes;
}

::testing::AssertionResult halves_equal(const std::vector<uint16_t>& got,
                                        const std::vector<uint16_t>& want) {
  int bad = 0;
  auto fail = ::testing::AssertionFailure();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && bad++ < 5)
      fail << "[" << i << "] got 0x" << std::hex << got[i] << " want 0x" << want[i] << std::dec
           << "; ";
  }
  if (bad) return fail << bad << " of " << got.size() << " differ";
  return ::testing::AssertionSuccess();
}

class CudaDequant : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::cuda_device_available(&why)) return;
    const char* require = std::getenv("BARATA_REQUIRE_GPU");
    if (require && std::string(require) == "1")
      FAIL() << "no CUDA device, and BARATA_REQUIRE_GPU=1: " << why;
    GTEST_SKIP() << "no CUDA device: " << why;
  }

  // src_offset > 0 puts the blocks at an address that is not 16-byte aligned.
  template <typename Block>
  void check(DType type, int64_t n_blocks, size_t src_offset) {
    SCOPED_TRACE(std::string(dtype_name(type)) + ", " + std::to_string(n_blocks) +
                 " blocks, source offset " + std::to_string(src_offset));
    std::mt19937 rng(static_cast<uint32_t>(n_blocks * 131 + src_offset));
    const std::vector<uint8_t> blocks = random_blocks<Block>(n_blocks, rng);
    const int64_t n = n_blocks * dtype_traits(type).block_size;

    std::vector<float> ref(static_cast<size_t>(n));
    dtype_traits(type).dequantize_row(blocks.data(), ref.data(), n);
    std::vector<uint16_t> want(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) want[i] = fp32_to_fp16(ref[i]);

    DeviceBuffer src(blocks.size() + src_offset);
    DeviceBuffer dst(want.size() * sizeof(uint16_t));
    ASSERT_NE(src.get(), nullptr);
    ASSERT_NE(dst.get(), nullptr);
    ASSERT_CUDA(
        cudaMemcpy(src.get() + src_offset, blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemset(dst.get(), 0xff, want.size() * sizeof(uint16_t)));
    cudaStream_t stream;
    ASSERT_CUDA(cudaStreamCreate(&stream));
    cuda_dequantize_to_f16(type, src.get() + src_offset, dst.get(), n, stream);
    const cudaError_t sync = cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    ASSERT_CUDA(sync);

    std::vector<uint16_t> got(want.size());
    ASSERT_CUDA(
        cudaMemcpy(got.data(), dst.get(), got.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(halves_equal(got, want));
  }

  // Plain float sources: any element count, source offsets 0 (vector loads),
  // 2 and 6 (misaligned: scalar loads).
  void check_float(DType type, int64_t n, size_t src_offset) {
    SCOPED_TRACE(std::string(dtype_name(type)) + ", n " + std::to_string(n) + ", source offset " +
                 std::to_string(src_offset));
    std::mt19937 rng(static_cast<uint32_t>(n * 7 + src_offset));
    std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
    const size_t esize = type == DType::F32 ? 4 : 2;
    std::vector<uint8_t> data(static_cast<size_t>(n) * esize);
    for (int64_t i = 0; i < n; ++i) {
      const float f = (i % 3 == 0) ? u(rng) * 1e-9f : u(rng);
      const uint16_t h = type == DType::F16 ? fp32_to_fp16(f) : fp32_to_bf16(f);
      if (type == DType::F32)
        std::memcpy(data.data() + 4 * i, &f, 4);
      else
        std::memcpy(data.data() + 2 * i, &h, 2);
    }
    std::vector<float> ref(static_cast<size_t>(n));
    dequantize_tensor(type, data.data(), n, 1, ref.data());
    std::vector<uint16_t> want(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) want[i] = fp32_to_fp16(ref[i]);

    DeviceBuffer src(data.size() + src_offset);
    DeviceBuffer dst(want.size() * sizeof(uint16_t));
    ASSERT_NE(src.get(), nullptr);
    ASSERT_NE(dst.get(), nullptr);
    ASSERT_CUDA(
        cudaMemcpy(src.get() + src_offset, data.data(), data.size(), cudaMemcpyHostToDevice));
    cuda_dequantize_to_f16(type, src.get() + src_offset, dst.get(), n, nullptr);
    ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> got(want.size());
    ASSERT_CUDA(
        cudaMemcpy(got.data(), dst.get(), got.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(halves_equal(got, want));
  }

  template <typename Block>
  void check_all_sizes(DType type) {
    // 64 blocks fill one CTA's tile exactly; 65 and 1000 leave a partial tile.
    for (int64_t n_blocks : {1, 7, 64, 65, 1000})
      for (size_t offset : {0, 2}) {
        check<Block>(type, n_blocks, offset);
        if (HasFatalFailure()) return;
      }
  }
};

TEST_F(CudaDequant, Q8_0MatchesReference) {
  check_all_sizes<BlockQ8_0>(DType::Q8_0);
}
TEST_F(CudaDequant, Q4_0MatchesReference) {
  check_all_sizes<BlockQ4_0>(DType::Q4_0);
}
TEST_F(CudaDequant, Q4_1MatchesReference) {
  check_all_sizes<BlockQ4_1>(DType::Q4_1);
}

TEST_F(CudaDequant, FloatTypesMatchReference) {
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (int64_t n : {1, 7, 8, 9, 1000, 2049, 100003})
      for (size_t offset : {0, 2, 6}) {
        check_float(t, n, offset);
        if (HasFatalFailure()) return;
      }
}

// Argument checks happen before any CUDA call, so these need no device.
TEST(CudaDequantArgs, RejectsWhatItCannotDo) {
  void* aligned = nullptr;
  EXPECT_THROW(cuda_dequantize_to_f16(DType::Q4_K, nullptr, aligned, 256, nullptr), Error);
  EXPECT_THROW(cuda_dequantize_to_f16(DType::Q8_0, nullptr, aligned, 33, nullptr), Error);
  void* misaligned = reinterpret_cast<void*>(uintptr_t{8});
  EXPECT_THROW(cuda_dequantize_to_f16(DType::Q8_0, nullptr, misaligned, 32, nullptr), Error);
  EXPECT_NO_THROW(cuda_dequantize_to_f16(DType::Q8_0, nullptr, aligned, 0, nullptr));
}

}  // namespace
}  // namespace barata

#endif  // BARATA_HAVE_CUDA
