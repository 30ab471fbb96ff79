// The emulation's race and initialization checker (kernels/emu/racecheck.cpp):
// kernels with each kind of bug are reported, and their corrected versions
// are not. This file is compiled with the checker's instrumentation (as the
// emulated kernels are, tests/CMakeLists.txt); under AddressSanitizer, which
// excludes it, the checker runs on the backend tests instead and these tests
// are not built (there is nothing to skip).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common.cuh"
#include "emu/host_runtime.h"

#if defined(__SANITIZE_THREAD__)

namespace {

constexpr unsigned kFull = 0xffffffffu;

// Each thread writes its slot, then reads its neighbour's: with no barrier
// between, a race on shared memory.
__global__ void neighbour_kernel(const int* in, int* out, int with_barrier) {
  __shared__ int s[64];
  s[threadIdx.x] = in[threadIdx.x];
  if (with_barrier) __syncthreads();
  out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// Every block writes out[0] (a race between blocks), or its own out[block].
__global__ void per_block_kernel(int* out, int own_slot) {
  if (threadIdx.x == 0) out[own_slot ? blockIdx.x : 0] = static_cast<int>(blockIdx.x);
}

// A tree reduction in shared memory; `last_barrier` 0 leaves out the barrier
// before the last step (thread 0 then reads what thread 1 just wrote).
__global__ void reduce_kernel(const float* in, float* out, int last_barrier) {
  __shared__ float s[64];
  s[threadIdx.x] = in[threadIdx.x];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
    if (half > 2 || last_barrier) __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = s[0];
}

// A broadcast through a shuffle whose mask leaves out lanes that call it.
__global__ void shuffle_kernel(const int* in, int* out, unsigned mask) {
  out[threadIdx.x] = __shfl_sync(mask, in[threadIdx.x], 0);
}

// Reads one slot past what the block wrote (uninitialized shared memory).
__global__ void uninit_shared_kernel(int* out, int fill_all) {
  __shared__ int s[33];
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  if (fill_all && threadIdx.x == 0) s[32] = -1;
  __syncthreads();
  out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x + 1];
}

// Reads a cudaMalloc'd buffer.
__global__ void copy_kernel(const int* in, int* out) {
  out[threadIdx.x] = in[threadIdx.x];
}

// Warp 0 writes, warp 1 reads: only __syncthreads orders two warps;
// within a warp, __syncwarp does.
__global__ void cross_warp_kernel(int* out, int mode) {
  __shared__ int s[64];
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  if (mode == 0) __syncwarp();
  if (mode == 1) __syncthreads();
  const unsigned partner = mode == 0 ? (threadIdx.x ^ 1u) : (threadIdx.x + 32) % 64;
  out[threadIdx.x] = s[partner];
}

class EmuRacecheck : public ::testing::Test {
 protected:
  void SetUp() override {
    barata_emu::set_fault_mode(barata_emu::FaultMode::kThrow);
    barata_emu::set_racecheck(true);
  }
  void TearDown() override {
    barata_emu::set_fault_mode(barata_emu::FaultMode::kAbort);
    barata_emu::set_racecheck(true);
  }
  // The launch's fault, or "" when it ran clean.
  template <typename F>
  static std::string fault_of(F&& launch) {
    try {
      launch();
    } catch (const barata_emu::Fault& e) {
      return e.what();
    }
    return {};
  }
};

TEST_F(EmuRacecheck, IsOnInTheEmulatedKernels) {
  EXPECT_TRUE(barata_emu::racecheck_available());
  EXPECT_TRUE(barata_emu::racecheck_enabled());
}

TEST_F(EmuRacecheck, SharedMemoryRace) {
  std::vector<int> in(64), out(64);
  for (int i = 0; i < 64; ++i) in[i] = i * 3;
  const std::string bad = fault_of([&] {
    BARATA_LAUNCH(neighbour_kernel, dim3(1), dim3(64), 0, nullptr, in.data(), out.data(), 0);
  });
  std::printf("the report: %s\n", bad.c_str());
  EXPECT_NE(bad.find("shared memory race in neighbour_kernel"), std::string::npos) << bad;
  EXPECT_NE(bad.find("static shared memory"), std::string::npos) << bad;
  // the two threads and where: thread 0 reads what thread 1 writes later (or the reverse)
  EXPECT_NE(bad.find("block (0,0,0) thread ("), std::string::npos) << bad;
  EXPECT_NE(bad.find("with no barrier between"), std::string::npos) << bad;
  // where: the function of the second access (addr2line; its line with debug info)
  ASSERT_NE(bad.find("(at "), std::string::npos) << bad;
  EXPECT_LT(bad.find("(at "), bad.rfind("neighbour_kernel")) << bad;
  const std::string good = fault_of([&] {
    BARATA_LAUNCH(neighbour_kernel, dim3(1), dim3(64), 0, nullptr, in.data(), out.data(), 1);
  });
  EXPECT_EQ(good, "");
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], in[(i + 1) % 64]);
}

TEST_F(EmuRacecheck, GlobalRaceBetweenBlocks) {
  std::vector<int> out(4, -1);
  const std::string bad = fault_of(
      [&] { BARATA_LAUNCH(per_block_kernel, dim3(4), dim3(32), 0, nullptr, out.data(), 0); });
  EXPECT_NE(bad.find("global memory race in per_block_kernel"), std::string::npos) << bad;
  EXPECT_NE(bad.find("written by block (1,0,0) thread (0,0,0), written by block (0,0,0) thread "
                     "(0,0,0)"),
            std::string::npos)
      << bad;
  const std::string good = fault_of(
      [&] { BARATA_LAUNCH(per_block_kernel, dim3(4), dim3(32), 0, nullptr, out.data(), 1); });
  EXPECT_EQ(good, "");
  EXPECT_EQ(out, (std::vector<int>{0, 1, 2, 3}));
}

TEST_F(EmuRacecheck, MissingBarrierBeforeTheLastStepOfAReduction) {
  std::vector<float> in(64, 1.0f), out(1);
  const std::string bad = fault_of([&] {
    BARATA_LAUNCH(reduce_kernel, dim3(1), dim3(64), 0, nullptr, in.data(), out.data(), 0);
  });
  EXPECT_NE(bad.find("shared memory race in reduce_kernel"), std::string::npos) << bad;
  const std::string good = fault_of([&] {
    BARATA_LAUNCH(reduce_kernel, dim3(1), dim3(64), 0, nullptr, in.data(), out.data(), 1);
  });
  EXPECT_EQ(good, "");
  EXPECT_EQ(out[0], 64.0f);
}

TEST_F(EmuRacecheck, ShuffleMaskLeavingOutACallingLane) {
  std::vector<int> in(32), out(32);
  for (int i = 0; i < 32; ++i) in[i] = 100 + i;
  const std::string bad = fault_of([&] {
    BARATA_LAUNCH(shuffle_kernel, dim3(1), dim3(32), 0, nullptr, in.data(), out.data(),
                  0x0000ffffu);
  });
  EXPECT_NE(bad.find("omits the calling lane 16"), std::string::npos) << bad;
  const std::string good = fault_of([&] {
    BARATA_LAUNCH(shuffle_kernel, dim3(1), dim3(32), 0, nullptr, in.data(), out.data(), kFull);
  });
  EXPECT_EQ(good, "");
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], 100);
}

TEST_F(EmuRacecheck, UninitializedSharedRead) {
  std::vector<int> out(64);
  const std::string bad = fault_of(
      [&] { BARATA_LAUNCH(uninit_shared_kernel, dim3(2), dim3(32), 0, nullptr, out.data(), 0); });
  EXPECT_NE(bad.find("uninitialized shared memory read in uninit_shared_kernel"), std::string::npos)
      << bad;
  EXPECT_NE(bad.find("read by block (0,0,0) thread (31,0,0)"), std::string::npos) << bad;
  const std::string good = fault_of(
      [&] { BARATA_LAUNCH(uninit_shared_kernel, dim3(2), dim3(32), 0, nullptr, out.data(), 1); });
  EXPECT_EQ(good, "");
  EXPECT_EQ(out[31], -1);
}

TEST_F(EmuRacecheck, SharedMemoryIsEachBlocksOwn) {
  // Block 1 finds block 0's values in the emulated static storage: still
  // uninitialized for block 1 (fill_all in block 0 only would not do).
  std::vector<int> out(96);
  EXPECT_EQ(fault_of([&] {
              BARATA_LAUNCH(uninit_shared_kernel, dim3(3), dim3(32), 0, nullptr, out.data(), 1);
            }),
            "");
}

TEST_F(EmuRacecheck, UninitializedGlobalRead) {
  int *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, 32 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 32 * sizeof(int)), cudaSuccess);
  const std::string bad =
      fault_of([&] { BARATA_LAUNCH(copy_kernel, dim3(1), dim3(32), 0, nullptr, in, out); });
  EXPECT_NE(bad.find("uninitialized global memory read"), std::string::npos) << bad;
  EXPECT_NE(bad.find("in copy_kernel"), std::string::npos) << bad;
  ASSERT_EQ(cudaMemset(in, 0, 32 * sizeof(int)), cudaSuccess);
  EXPECT_EQ(fault_of([&] { BARATA_LAUNCH(copy_kernel, dim3(1), dim3(32), 0, nullptr, in, out); }),
            "");
  // what a kernel wrote is initialized for the next one
  EXPECT_EQ(fault_of([&] { BARATA_LAUNCH(copy_kernel, dim3(1), dim3(32), 0, nullptr, out, in); }),
            "");
  cudaFree(in);
  cudaFree(out);
}

TEST_F(EmuRacecheck, WarpBarrierOrdersItsWarpOnly) {
  std::vector<int> out(64);
  // lanes of one warp exchange after __syncwarp: ordered
  EXPECT_EQ(fault_of([&] {
              BARATA_LAUNCH(cross_warp_kernel, dim3(1), dim3(64), 0, nullptr, out.data(), 0);
            }),
            "");
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], i ^ 1);
  // two warps after __syncthreads: ordered
  EXPECT_EQ(fault_of([&] {
              BARATA_LAUNCH(cross_warp_kernel, dim3(1), dim3(64), 0, nullptr, out.data(), 1);
            }),
            "");
  // two warps with no barrier: a race
  const std::string bad = fault_of(
      [&] { BARATA_LAUNCH(cross_warp_kernel, dim3(1), dim3(64), 0, nullptr, out.data(), 2); });
  EXPECT_NE(bad.find("shared memory race in cross_warp_kernel"), std::string::npos) << bad;
}

TEST_F(EmuRacecheck, OversizedLaunchIsRefused) {
  std::vector<int> out(2048);
  (void)cudaGetLastError();
  BARATA_LAUNCH(copy_kernel, dim3(1), dim3(1025), 0, nullptr, out.data(), out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  BARATA_LAUNCH(copy_kernel, dim3(1), dim3(32), 49 * 1024, nullptr, out.data(), out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  BARATA_LAUNCH(copy_kernel, dim3(1), dim3(1024), 0, nullptr, out.data(), out.data() + 1024);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(EmuRacecheck, OffByEnvironmentOrCall) {
  barata_emu::set_racecheck(false);
  std::vector<int> in(64), out(64);
  EXPECT_EQ(fault_of([&] {
              BARATA_LAUNCH(neighbour_kernel, dim3(1), dim3(64), 0, nullptr, in.data(), out.data(),
                            0);
            }),
            "");
}

}  // namespace

#endif  // __SANITIZE_THREAD__
