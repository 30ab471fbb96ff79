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
