#include "barata/backend.h"

#include <cmath>

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

void rope_tables(const ModelConfig& c, int64_t p0, int64_t p1, float* cos, float* sin) {
  const int64_t half = c.rope_dims / 2;
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double theta =
          static_cast<double>(p) *
          std::pow(static_cast<double>(c.rope_base), -2.0 * static_cast<double>(i) / c.rope_dims);
      cos[(p - p0) * half + i] = static_cast<float>(std::cos(theta));
      sin[(p - p0) * half + i] = static_cast<float>(std::sin(theta));
    }
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
