#include "barata/backend.h"

#include <cmath>

#include "barata/error.h"
#include "cpu/cpu_backend.h"
#ifdef BARATA_HAVE_CUDA
#include <dlfcn.h>
#include <fmt/core.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>
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

#ifdef BARATA_HAVE_CUDA
namespace {

// The CUDA backend is a module (libbarata-cuda.so, src/cuda/), loaded the
// first time --device cuda asks for it: a CPU run never maps the CUDA
// runtime or cuBLAS (hundreds of MB and a fifth of a second at start). Looked
// for in $BARATA_CUDA_MODULE, beside the executable, in the build directory,
// then by the loader's own search (LD_LIBRARY_PATH).
using CreateFn = Backend* (*)(const BackendOptions*);

CreateFn cuda_module() {
  static std::once_flag once;
  static CreateFn create = nullptr;
  static std::string why;
  std::call_once(once, [] {
    std::vector<std::string> tried;
    if (const char* env = std::getenv("BARATA_CUDA_MODULE"); env && *env) tried.push_back(env);
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) tried.push_back((exe.parent_path() / "libbarata-cuda.so").string());
    tried.push_back(std::string(BARATA_CUDA_MODULE_BUILD_DIR) + "/libbarata-cuda.so");
    tried.push_back("libbarata-cuda.so");
    for (const std::string& path : tried) {
      if (path.find('/') != std::string::npos && !std::filesystem::exists(path, ec)) continue;
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        why += fmt::format("{}{}", why.empty() ? "" : "; ", dlerror());
        continue;
      }
      create = reinterpret_cast<CreateFn>(dlsym(h, "barata_cuda_backend_create"));
      if (create) return;
      why += fmt::format("{}{}: no barata_cuda_backend_create", why.empty() ? "" : "; ", path);
      dlclose(h);
    }
    if (why.empty()) why = "libbarata-cuda.so is not beside the barata binary";
  });
  if (!create) fail("--device cuda: cannot load the CUDA backend: {}", why);
  return create;
}

}  // namespace
#endif

std::unique_ptr<Backend> make_backend(const BackendOptions& opts) {
  switch (opts.device) {
    case DeviceKind::kCpu:
      return make_cpu_backend(opts.n_threads);
    case DeviceKind::kCuda:
#ifdef BARATA_HAVE_CUDA
      return std::unique_ptr<Backend>(cuda_module()(&opts));
#else
      fail(
          "--device cuda: this barata was built without CUDA (configure with -DBARATA_CUDA=ON "
          "on a machine with the CUDA toolkit)");
#endif
  }
  fail("internal: unknown device {}", static_cast<int>(opts.device));
}

}  // namespace barata
