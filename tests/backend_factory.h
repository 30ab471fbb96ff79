// The backend a test asks for. In barata_emu_backend_tests (built where the
// library has no CUDA) "cuda" is the CUDA backend's own host code over the
// host emulation of its kernels and runtime (kernels/emu/): the same tests
// then run the whole backend on the CPU.
#pragma once

#include <memory>

#include "barata/backend.h"
#include "barata/engine.h"
#include "sanitizer.h"
#ifdef BARATA_TEST_EMU_BACKEND
#include "cuda/cuda_backend.h"
#endif

namespace barata::test {

inline std::unique_ptr<Backend> make_test_backend(const BackendOptions& o) {
#ifdef BARATA_TEST_EMU_BACKEND
  if (o.device == DeviceKind::kCuda) return make_emulated_cuda_backend(o);
#endif
  return make_backend(o);
}

inline std::unique_ptr<Backend> make_test_backend(DeviceKind d, int n_threads) {
  return make_test_backend({.device = d, .n_threads = n_threads});
}

inline bool emulated_backend() {
#ifdef BARATA_TEST_EMU_BACKEND
  return true;
#else
  return false;
#endif
}

}  // namespace barata::test
