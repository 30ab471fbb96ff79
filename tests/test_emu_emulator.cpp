// The CUDA emulation itself (kernels/emu/cuda_emu.h): indexing, barriers,
// shuffles, votes, shared memory, and that a broken barrier is reported.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "common.cuh"
#include "emu/host_runtime.h"

namespace {

__global__ void index_kernel(int* out) {
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  out[b * per_block + t] = static_cast<int>(b * 1000 + t);
}

// Reverses each block's slice through shared memory: needs the barrier.
__global__ void reverse_kernel(const int* in, int* out) {
  __shared__ int s[256];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = in[i];
  __syncthreads();
  out[i] = s[blockDim.x - 1 - threadIdx.x];
}

// Block sum: warp shuffles (xor and down), then one value per warp in shared memory.
__global__ void sum_kernel(const float* in, float* out_xor, float* out_down) {
  __shared__ float warp_sums[2][32];
  const float v = in[blockIdx.x * blockDim.x + threadIdx.x];
  float a = v, b = v;
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_sums[0][warp] = a;
    warp_sums[1][warp] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sa = 0, sb = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) {
      sa += warp_sums[0][w];
      sb += warp_sums[1][w];
    }
    out_xor[blockIdx.x] = sa;
    out_down[blockIdx.x] = sb;
  }
}

__global__ void vote_kernel(unsigned* ballots, int* anys, int* alls, int* bcast, int* count) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned b = __ballot_sync(0xffffffffu, lane % 3 == 0);
  const int any = __any_sync(0xffffffffu, lane == 7);
  const int all = __all_sync(0xffffffffu, lane < 31);
  const int v = __shfl_sync(0xffffffffu, lane * 10, 5);
  const int c = __syncthreads_count(threadIdx.x % 2);
  if (lane == 0) {
    ballots[warp] = b;
    anys[warp] = any;
    alls[warp] = all;
  }
  bcast[threadIdx.x] = v;
  if (threadIdx.x == 0) *count = c;
}

__global__ void dyn_smem_kernel(float* out, int n) {
  BARATA_DYNAMIC_SMEM(float, buf);
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = static_cast<float>(i) * 2.0f;
  __syncthreads();
  float s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += buf[n - 1 - i];
  atomicAdd(out, s);
}

// Half the block returns before the barrier: undefined on a GPU, a hang or
// garbage; the emulation reports it.
__global__ void divergent_kernel(int* out) {
  if (threadIdx.x >= 16) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void divergent_warp_kernel(int* out) {
  if (threadIdx.x % 32 == 3) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

template <typename T, int N>
__global__ void template_kernel(T* out) {
  out[threadIdx.x] = static_cast<T>(N) + static_cast<T>(threadIdx.x);
}

class EmuFaults : public ::testing::Test {
 protected:
  void SetUp() override { barata_emu::set_fault_mode(barata_emu::FaultMode::kThrow); }
  void TearDown() override { barata_emu::set_fault_mode(barata_emu::FaultMode::kAbort); }
};

TEST(EmuEmulator, ThreadAndBlockIndices) {
  const dim3 grid(3, 2, 2), block(8, 4, 2);
  std::vector<int> out(3 * 2 * 2 * 64, -1);
  BARATA_LAUNCH(index_kernel, grid, block, 0, nullptr, out.data());
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < 12; ++b)
    for (int t = 0; t < 64; ++t) EXPECT_EQ(out[b * 64 + t], b * 1000 + t);
}

TEST(EmuEmulator, BarrierAndSharedMemory) {
  std::vector<int> in(512), out(512, 0);
  std::iota(in.begin(), in.end(), 0);
  BARATA_LAUNCH(reverse_kernel, 2, 256, 0, nullptr, in.data(), out.data());
  for (int i = 0; i < 512; ++i) EXPECT_EQ(out[i], (i / 256) * 256 + 255 - i % 256);
}

TEST(EmuEmulator, WarpShufflesReduce) {
  std::vector<float> in(3 * 128);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7);
  std::vector<float> sx(3), sd(3);
  BARATA_LAUNCH(sum_kernel, 3, 128, 0, nullptr, in.data(), sx.data(), sd.data());
  for (int b = 0; b < 3; ++b) {
    float want = 0;
    for (int i = 0; i < 128; ++i) want += in[b * 128 + i];
    EXPECT_EQ(sx[b], want);
    EXPECT_EQ(sd[b], want);
  }
}

TEST(EmuEmulator, VotesAndBroadcast) {
  std::vector<unsigned> ballots(2);
  std::vector<int> anys(2), alls(2), bcast(64);
  int count = -1;
  BARATA_LAUNCH(vote_kernel, 1, 64, 0, nullptr, ballots.data(), anys.data(), alls.data(),
                bcast.data(), &count);
  unsigned want = 0;
  for (int l = 0; l < 32; l += 3) want |= 1u << l;
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(ballots[w], want);
    EXPECT_EQ(anys[w], 1);
    EXPECT_EQ(alls[w], 0);
  }
  for (int t = 0; t < 64; ++t) EXPECT_EQ(bcast[t], 50);
  EXPECT_EQ(count, 32);
}

TEST(EmuEmulator, DynamicSharedMemory) {
  float sum = 0;
  const int n = 1000;
  BARATA_LAUNCH(dyn_smem_kernel, 1, 96, n * sizeof(float), nullptr, &sum, n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(sum, static_cast<float>(n * (n - 1)));
}

TEST(EmuEmulator, TemplateKernelInParentheses) {
  std::vector<int> out(4);
  BARATA_LAUNCH((template_kernel<int, 40>), 1, 4, 0, nullptr, out.data());
  EXPECT_EQ(out, (std::vector<int>{40, 41, 42, 43}));
}

// Stream capture records; a graph replays what was recorded, with the
// arguments of the capture, reading memory as it is at the replay.
TEST(EmuEmulator, StreamCaptureRecordsAndAGraphReplays) {
  std::vector<int> out(64, -1);
  int host = 0, dev = 7;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  BARATA_LAUNCH(index_kernel, 2, 32, 0, s, out.data());
  ASSERT_EQ(cudaMemcpyAsync(&host, &dev, sizeof host, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(out[0], -1) << "a captured launch ran at capture";
  EXPECT_EQ(host, 0) << "a captured copy ran at capture";
  cudaGraph_t g = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  cudaGraphDestroy(g);
  for (int value : {7, 9}) {
    std::fill(out.begin(), out.end(), -1);
    dev = value;
    ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
    EXPECT_EQ(out[33], 1001);
    EXPECT_EQ(host, value);
  }
  cudaGraphExecDestroy(exec);
}

// What a capturing stream refuses on a GPU is refused here, and the capture
// is then invalidated; a bad launch configuration is an error at capture.
TEST(EmuEmulator, CaptureRefusesSynchronizeCopiesAndAllocations) {
  cudaStream_t s = nullptr;
  std::vector<int> out(64, -1);
  int a = 1, b = 2;
  void* p = nullptr;
  for (int what = 0; what < 3; ++what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    BARATA_LAUNCH(index_kernel, 2, 32, 0, s, out.data());
    const cudaError_t e = what == 0   ? cudaStreamSynchronize(s)
                          : what == 1 ? cudaMemcpy(&a, &b, sizeof a, cudaMemcpyDeviceToHost)
                                      : cudaMalloc(&p, 256);
    EXPECT_EQ(e, cudaErrorStreamCaptureUnsupported);
    cudaGraph_t g = nullptr;
    EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(g, nullptr);
    EXPECT_EQ(out[0], -1);
    EXPECT_EQ(a, 1);
  }
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);  // no capture open any more
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaErrorIllegalState);
  BARATA_LAUNCH(index_kernel, 1, 2048, 0, s, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
  cudaGraphDestroy(g);
}

TEST(EmuEmulator, BadConfigurationIsALaunchError) {
  std::vector<int> out(2048);
  BARATA_LAUNCH(index_kernel, 1, 2048, 0, nullptr, out.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared
  BARATA_LAUNCH(dyn_smem_kernel, 1, 32, 64 * 1024, nullptr, nullptr, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);  // > 48 KiB without the attribute
  // what the launchers do after each launch
  BARATA_LAUNCH(index_kernel, 0, 32, 0, nullptr, out.data());
  EXPECT_THROW(BARATA_CUDA_CHECK_LAUNCH(), barata::Error);
  EXPECT_NO_THROW(BARATA_CUDA_CHECK_LAUNCH());
}

TEST_F(EmuFaults, DivergentSyncthreadsIsReported) {
  std::vector<int> out(64);
  try {
    BARATA_LAUNCH(divergent_kernel, 1, 64, 0, nullptr, out.data());
    FAIL() << "no fault reported";
  } catch (const barata_emu::Fault& e) {
    EXPECT_NE(std::string(e.what()).find("emu: deadlock/divergent __syncthreads in "
                                         "divergent_kernel"),
              std::string::npos)
        << e.what();
  }
  // the emulator recovers: the next launch works
  std::vector<int> in(256, 3), rev(256);
  BARATA_LAUNCH(reverse_kernel, 1, 256, 0, nullptr, in.data(), rev.data());
  EXPECT_EQ(rev[0], 3);
}

TEST_F(EmuFaults, ExitedLaneInShuffleMaskIsReported) {
  std::vector<int> out(64);
  EXPECT_THROW(BARATA_LAUNCH(divergent_warp_kernel, 1, 64, 0, nullptr, out.data()),
               barata_emu::Fault);
}

TEST(EmuEmulatorDeathTest, DivergentSyncthreadsAborts) {
  std::vector<int> out(64);
  EXPECT_DEATH(BARATA_LAUNCH(divergent_kernel, 1, 64, 0, nullptr, out.data()),
               "emu: deadlock/divergent __syncthreads in divergent_kernel");
}

#if defined(__SANITIZE_ADDRESS__)
__global__ void overflow_kernel(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = 1.0f;  // no bounds check: the last block writes past n
  (void)n;
}

// The point of running under ASan: a kernel's out-of-bounds access is caught.
TEST(EmuEmulatorDeathTest, AddressSanitizerSeesKernelOverflow) {
  EXPECT_DEATH(
      {
        std::vector<float> out(100);
        BARATA_LAUNCH(overflow_kernel, 4, 32, 0, nullptr, out.data(), 100);
      },
      "heap-buffer-overflow");
}
#endif

}  // namespace
