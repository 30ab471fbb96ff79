#include "barata/backend.h"

#include <algorithm>
#include <cmath>
#include <numbers>

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

void rope_tables(const ModelConfig& c, int64_t p0, int64_t p1, float* cos, float* sin,
                 int64_t n_ctx, bool swa) {
  const int64_t half = c.rope_dims / 2;
  const RopeScaling plain;
  const RopeScaling& s = swa ? plain : c.rope_scaling;
  const double base = swa ? c.rope_base_swa : c.rope_base;
  // YaRN's correction range in pair indices (ggml_rope_yarn_corr_dims): the
  // pairs below `lo` rotate more than beta_fast times over the original
  // context and keep their frequency (extrapolation), those above `hi`
  // rotate less than beta_slow times and are interpolated; a linear ramp
  // between.
  double lo = 0.0, hi = 0.0;
  if (s.ext_factor != 0.0f) {
    const auto corr_dim = [&](double n_rot) {
      return static_cast<double>(c.rope_dims) *
             std::log(static_cast<double>(s.n_ctx_orig) / (n_rot * 2.0 * std::numbers::pi)) /
             (2.0 * std::log(base));
    };
    lo = std::max(0.0, std::floor(corr_dim(s.beta_fast)));
    hi = std::min(static_cast<double>(c.rope_dims - 1), std::ceil(corr_dim(s.beta_slow)));
  }
  // Frequency divisors: Llama 3's, or Phi-3's long or short ones by the
  // context asked for (llama.cpp's get_rope_factors).
  const std::vector<float>* ff = nullptr;
  if (!swa && !c.rope_freq_factors.empty()) ff = &c.rope_freq_factors;
  if (!swa && !c.rope_factors_long.empty())
    ff = n_ctx > s.n_ctx_orig ? &c.rope_factors_long : &c.rope_factors_short;
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double theta =
          static_cast<double>(p) * std::pow(base, -2.0 * static_cast<double>(i) / c.rope_dims);
      if (ff != nullptr) theta /= (*ff)[static_cast<size_t>(i)];
      const double extrap = theta;
      theta *= s.freq_scale;  // interpolation: positions compressed by the scaling factor
      double mscale = s.attn_factor;
      if (s.ext_factor != 0.0f) {
        const double y = (static_cast<double>(i) - lo) / std::max(0.001, hi - lo);
        const double mix = (1.0 - std::min(1.0, std::max(0.0, y))) * s.ext_factor;
        theta = theta * (1.0 - mix) + extrap * mix;
        mscale *= 1.0 + 0.1 * std::log(1.0 / s.freq_scale);
      }
      cos[(p - p0) * half + i] = static_cast<float>(std::cos(theta) * mscale);
      sin[(p - p0) * half + i] = static_cast<float>(std::sin(theta) * mscale);
    }
}

std::vector<float> key_offsets(const Model& model, int64_t n_ctx) {
  const ModelConfig& c = model.config();
  const int64_t hd = c.head_dim, kv_dim = c.n_head_kv * hd, half = c.rope_dims / 2;
  std::vector<float> out(static_cast<size_t>(c.n_layer * kv_dim), 0.0f);
  // Mean cos and sin per pair over the positions, plain and sliding-window tables.
  std::vector<double> mean[2][2];
  constexpr int64_t kChunk = 1024;
  std::vector<float> cs(static_cast<size_t>(kChunk * half)), sn(cs.size());
  const int64_t n = std::max<int64_t>(n_ctx, 1);
  for (int swa = 0; swa < (c.n_swa > 0 ? 2 : 1); ++swa) {
    mean[swa][0].assign(static_cast<size_t>(half), 0.0);
    mean[swa][1].assign(static_cast<size_t>(half), 0.0);
    for (int64_t p0 = 0; p0 < n; p0 += kChunk) {
      const int64_t p1 = std::min(n, p0 + kChunk);
      rope_tables(c, p0, p1, cs.data(), sn.data(), n_ctx, swa == 1);
      for (int64_t p = 0; p < p1 - p0; ++p)
        for (int64_t i = 0; i < half; ++i) {
          mean[swa][0][static_cast<size_t>(i)] += cs[static_cast<size_t>(p * half + i)];
          mean[swa][1][static_cast<size_t>(i)] += sn[static_cast<size_t>(p * half + i)];
        }
    }
    for (auto& m : mean[swa])
      for (double& x : m) x /= static_cast<double>(n);
  }
  const bool neox = c.rope_style == RopeStyle::kNeox;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::vector<float>& b = model.layers()[static_cast<size_t>(l)].bk;
    if (b.empty()) continue;
    const int swa = c.is_swa(l) ? 1 : 0;
    float* o = out.data() + l * kv_dim;
    for (int64_t h = 0; h < c.n_head_kv; ++h) {
      const float* bh = b.data() + h * hd;
      float* oh = o + h * hd;
      for (int64_t i = 0; i < hd; ++i) oh[i] = bh[i];  // past rope_dims: not rotated
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = neox ? i : 2 * i, z = neox ? i + half : 2 * i + 1;
        const double mc = mean[swa][0][static_cast<size_t>(i)];
        const double ms = mean[swa][1][static_cast<size_t>(i)];
        oh[a] = static_cast<float>(bh[a] * mc - bh[z] * ms);
        oh[z] = static_cast<float>(bh[a] * ms + bh[z] * mc);
      }
    }
  }
  return out;
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

void Backend::set_qk_observer(QkObserver) {
  fail("the {} backend cannot report q and k (calibration runs on the CPU)", device_name(kind()));
}

void Backend::moe(const LayerWeights&, const float*, float*) {
  fail("the {} backend cannot run a mixture of experts yet (run it with --device cpu)",
       device_name(kind()));
}

void Backend::run_step(const StepProgram& program, const Batch& batch, const ModelConfig& c,
                       float* host_logits, const std::function<void(int64_t)>& on_layer_end) {
  const int64_t T = batch.size();
  const int64_t d = c.d_model;
  const std::vector<float> none;
  struct Reset {  // op_ never outlives the step, even one that throws
    Backend* b;
    ~Reset() {
      b->op_ = nullptr;
      b->op_index_ = -1;
    }
  } reset{this};
  if (step_begin(!on_layer_end)) {
    step_end(host_logits);
    return;
  }
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const StepOp& op = program.ops[i];
    op_ = &op;
    op_index_ = static_cast<int64_t>(i);
    switch (op.kind) {
      case OpKind::kEmbed:
        embed(act(op.y));
        break;
      case OpKind::kRmsNorm:
        rms_norm(act(op.x), *op.vec, act(op.y), d);
        break;
      case OpKind::kMatmul:
        matmul(*op.w, act(op.x), act(op.y));
        break;
      case OpKind::kMatmulBias:
        matmul_bias(*op.w, act(op.x), act(op.y), op.vec ? *op.vec : none);
        break;
      case OpKind::kMatmulAdd:
        matmul_add(*op.w, act(op.x), act(op.y), act(Act::kOut), T * d);
        break;
      case OpKind::kHeadNorm:
        head_norm(act(op.x), *op.vec, op.n_heads);
        break;
      case OpKind::kRopeKv:
        rope_kv(op.layer, act(op.x), act(op.y), act(Act::kV));
        break;
      case OpKind::kAttention:
        attention(op.layer, act(op.x), act(op.y));
        break;
      case OpKind::kSwiGlu:
        swiglu(act(op.y), act(op.x), T * c.d_ff);
        break;
      case OpKind::kGeGlu:
        geglu(act(op.y), act(op.x), T * c.d_ff);
        break;
      case OpKind::kAdd:
        add(act(op.y), act(op.x), T * d);
        break;
      case OpKind::kMoe:
        moe(*op.experts, act(op.x), act(op.y));
        break;
      case OpKind::kLayerEnd:
        if (on_layer_end) on_layer_end(op.layer);
        break;
      case OpKind::kLogits:
        logits(act(op.x), host_logits);
        break;
    }
  }
  step_end(host_logits);
}

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
