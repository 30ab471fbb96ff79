// The CUDA backend: weights uploaded once in their stored type, the paged
// fp16 KV cache in one device pool, barata's own kernels (kernels/*.cu) for
// every op, dequant-GEMV for decode and dequant + cuBLAS for prefill, and the
// decode step of each batch width captured once in a CUDA graph.
#pragma once

#include <memory>

#include "barata/backend.h"

namespace barata {

#ifdef BARATA_CUDA_EMU
// The same backend over the host emulation of its kernels (tests only).
#define make_cuda_backend make_emulated_cuda_backend
#endif
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts);

}  // namespace barata
