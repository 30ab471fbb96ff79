// The CUDA backend: weights uploaded once in their stored type, the paged
// fp16 KV cache in one device pool, barata's own kernels (kernels/*.cu) for
// every op, dequant-GEMV for decode and dequant + cuBLAS for prefill, and the
// decode step of each batch width captured once in a CUDA graph.
#pragma once

#include <memory>

#include "barata/backend.h"

namespace barata {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts);

}  // namespace barata
