// What a launcher header needs from CUDA (cudaStream_t), and nothing more: the
// real runtime under nvcc and in host code built with CUDA, or the host
// emulation (kernels/emu/) when the kernel sources are compiled for the CPU
// with BARATA_CUDA_EMU, which needs no CUDA toolkit at all.
#pragma once

#ifdef BARATA_CUDA_EMU
#include "emu/cuda_emu.h"
#else
#include <cuda_runtime.h>
#endif

namespace barata::cuda {

// What a matmul kernel does with each output v = scale * dot(W row r, x row
// t): y = v, then + bias[r] where bias is set, then + the y already there
// where accumulate is (the residual add). The same additions, in the same
// order and rounding, as the add_bias and add kernels after a plain matmul.
struct Epilogue {
  const float* bias = nullptr;
  bool accumulate = false;
};

// Where a kernel that writes a matmul's input also writes its 8-bit copy
// (as launch_quantize_q8 lays it out: n_tok * k int8 values, then one fp32
// scale per 32 in xd); null xq: no copy.
struct Q8Out {
  signed char* xq = nullptr;
  float* xd = nullptr;
};

}  // namespace barata::cuda
