// The CPU backend: today's kernels behind the Backend seam. Weights stay in
// the file's mapping; one matmul kernel per weight is picked for this CPU at
// prepare(); the KV pool is one host mapping.
#pragma once

#include <memory>

#include "barata/backend.h"

namespace barata {

std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace barata
