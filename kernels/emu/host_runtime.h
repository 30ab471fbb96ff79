// The rest of the CUDA runtime and the one cuBLAS call that the CUDA
// backend's host side (src/cuda/cuda_backend.cpp) makes, for running that host
// side under the emulation too: the whole backend, its kernels emulated, on
// the CPU (tests/emu_backend/). Header-only; device memory is host memory.
//
// What it stands in for and how:
//  - device properties: a fictitious device ("barata emulated GPU"), with
//    zero peaks, so that no number derived from it could pass for measured;
//  - streams and events: every call is synchronous (launches already are);
//  - CUDA graphs: stream capture records the launches, asynchronous copies
//    and sets and cuBLAS calls (cuda_emu.h, "Stream capture"); an
//    instantiated graph replays them in order;
//  - cublasGemmEx: the (op T, op N), fp16 x fp16 -> fp32 GEMM with fp32
//    accumulation the backend uses, as a plain loop; any other form is
//    CUBLAS_STATUS_NOT_SUPPORTED.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "emu/cuda_emu.h"

// ---- runtime -----------------------------------------------------------------
struct cudaDeviceProp {
  char name[256];
  int major, minor, multiProcessorCount, memoryBusWidth;
  size_t totalGlobalMem;
};
enum cudaDeviceAttr : int { cudaDevAttrClockRate = 13, cudaDevAttrMemoryClockRate = 36 };
inline constexpr unsigned cudaStreamNonBlocking = 1;

inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::memset(p, 0, sizeof *p);
  std::strcpy(p->name, "barata emulated GPU");
  p->major = 0;
  p->multiProcessorCount = 1;
  p->totalGlobalMem = size_t{8} << 30;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) {
  *v = 0;
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  *free_b = *total_b = size_t{8} << 30;
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

struct barata_emu_event_st {
  std::chrono::steady_clock::time_point t;
};
using cudaEvent_t = barata_emu_event_st*;
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = new barata_emu_event_st{};
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  e->t = std::chrono::steady_clock::now();
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}

struct barata_emu_graph_st {
  std::vector<barata_emu::detail::GraphNode> nodes;
};
using cudaGraph_t = barata_emu_graph_st*;
using cudaGraphExec_t = barata_emu_graph_st*;
enum cudaStreamCaptureMode : int { cudaStreamCaptureModeThreadLocal = 1 };
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  return barata_emu::detail::capture_begin();
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
  auto* graph = new barata_emu_graph_st{};
  const cudaError_t err = barata_emu::detail::capture_end(&graph->nodes);
  if (err != cudaSuccess) {
    delete graph;
    graph = nullptr;
  }
  *g = graph;
  return err;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long) {
  if (!g) return cudaErrorInvalidValue;
  *exec = new barata_emu_graph_st{g->nodes};
  return cudaSuccess;
}
// Runs the nodes in order (launches log and run as when eager; a replay while
// capturing is refused: barata never nests graphs).
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  if (!exec) return cudaErrorInvalidValue;
  if (barata_emu::detail::capturing())
    return barata_emu::detail::refuse_in_capture("cudaGraphLaunch");
  for (const auto& node : exec->nodes) node();
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
  delete g;
  return cudaSuccess;
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g) {
  delete g;
  return cudaSuccess;
}

// ---- cuBLAS --------------------------------------------------------------------
enum cublasStatus_t : int {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType : int { CUDA_R_32F = 0, CUDA_R_16F = 2 };
enum cublasComputeType_t : int { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t : int { CUBLAS_GEMM_DEFAULT = -1 };
struct barata_emu_cublas_st {};
using cublasHandle_t = barata_emu_cublas_st*;

inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new barata_emu_cublas_st{};
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) {
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t, void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}

// Column-major C (m x n, ldc) = alpha op(A) op(B) + beta C, for op(A) = A^T
// (A: k x m, lda), op(B) = B (k x n, ldb), A and B fp16, C fp32.
inline cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void* alpha, const void* A,
                                   cudaDataType at, int lda, const void* B, cudaDataType bt,
                                   int ldb, const void* beta, void* C, cudaDataType ct, int ldc,
                                   cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (ta != CUBLAS_OP_T || tb != CUBLAS_OP_N || at != CUDA_R_16F || bt != CUDA_R_16F ||
      ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m < 0 || n < 0 || k < 0 || lda < k || ldb < k || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  auto gemm = [=] {
    barata_emu::detail::log_launch("cublasGemmEx");
    if (barata_emu::detail::dry_launches()) return;
    const auto* a = static_cast<const unsigned short*>(A);
    const auto* b = static_cast<const unsigned short*>(B);
    auto* c = static_cast<float*>(C);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float s = 0.0f;
        for (int l = 0; l < k; ++l)
          s += barata_emu::detail::half_bits_to_float(a[l + static_cast<int64_t>(i) * lda]) *
               barata_emu::detail::half_bits_to_float(b[l + static_cast<int64_t>(j) * ldb]);
        float& out = c[i + static_cast<int64_t>(j) * ldc];
        out = be == 0.0f ? al * s : al * s + be * out;
      }
    for (int j = 0; j < n; ++j)  // (the race checker's view: C is written)
      barata_emu::detail::rc::mark_written(c + static_cast<int64_t>(j) * ldc,
                                           static_cast<size_t>(m) * sizeof(float));
  };
  // Host-pointer scalars are read when the call is made (captured: into the node).
  barata_emu::detail::run_or_record(gemm, "cublasGemmEx");
  return CUBLAS_STATUS_SUCCESS;
}

// ---- kernels/device.cuh -------------------------------------------------------------
namespace barata::cuda {
inline bool cuda_device_available(std::string*) {
  return true;
}
}  // namespace barata::cuda
