#include "barata/backend.h"

#include "barata/error.h"
#include "cpu/cpu_backend.h"
#ifdef BARATA_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace barata {

const char* device_name(DeviceKind d) {
  return d == DeviceKind::kCuda ? "cuda" : "cpu";
}

std::optional<DeviceKind> parse_device(std::string_view name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return std::nullopt;
}

std::unique_ptr<Backend> make_backend(const BackendOptions& opts) {
  switch (opts.device) {
    case DeviceKind::kCpu:
      return make_cpu_backend(opts.n_threads);
    case DeviceKind::kCuda:
#ifdef BARATA_HAVE_CUDA
      return make_cuda_backend(opts);
#else
      fail(
          "--device cuda: this barata was built without CUDA (configure with -DBARATA_CUDA=ON "
          "on a machine with the CUDA toolkit)");
#endif
  }
  fail("internal: unknown device {}", static_cast<int>(opts.device));
}

}  // namespace barata
