// Quantizing a whole model: one source tensor in memory at a time, its rows
// spread over the thread pool; error statistics from the dequantized copy.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/quantize.h"
#include "cpu/thread_pool.h"

namespace barata {
namespace {

// llama.cpp's llama_ftype values for files of one type (general.file_type is
// informative; llama.cpp reads each tensor's own type).
std::optional<uint32_t> llama_file_type(DType t) {
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q4_0:
      return 2;
    case DType::Q4_1:
      return 3;
    case DType::Q8_0:
      return 7;
    case DType::Q5_0:
      return 8;
    case DType::Q5_1:
      return 9;
    case DType::BF16:
      return 32;
    default:
      return std::nullopt;
  }
}

struct Quantized {
  std::vector<uint8_t> bytes;
  std::vector<float> back;  // dequantized, when asked for
};

Quantized quantize_one(ThreadPool& pool, DType t, const std::vector<float>& w,
                       const std::vector<int64_t>& shape, bool want_back) {
  const int64_t k = shape[0], rows = static_cast<int64_t>(w.size()) / k;
  Quantized q;
  q.bytes.resize(tensor_bytes(t, k, rows));
  quantize_tensor_header(t, w.data(), k, rows, q.bytes.data());
  pool.parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    quantize_tensor_rows(t, w.data(), k, r0, r1 - r0, q.bytes.data());
  });
  if (want_back) {
    q.back.resize(w.size());
    pool.parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r)
        dequantize_tensor_row(t, q.bytes.data(), k, r, q.back.data() + r * k);
    });
  }
  return q;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Metadata of the output: the source's, plus what a reader needs to know
// about the tensor types (barata.quant.*).
void set_metadata(GgufWriter& w, const SourceModel& src, const QuantOptions& opt,
                  const std::vector<TensorPlan>& plan) {
  for (const auto& [k, v] : src.metadata) w.set(k, v);
  bool any_llama_quant = false, any_private = false;
  std::vector<DType> used;
  std::vector<GgufValue> fallbacks;
  for (const auto& p : plan) {
    if (std::find(used.begin(), used.end(), p.type) == used.end()) used.push_back(p.type);
    any_llama_quant |= dtype_traits(p.type).is_quantized && !dtype_traits(p.type).is_private;
    any_private |= dtype_traits(p.type).is_private;
    if (p.fallback) fallbacks.emplace_back(p.name + ": " + p.why);
  }
  if (any_llama_quant) w.set("general.quantization_version", uint32_t{2});
  bool uniform = true;
  for (const auto& p : plan)
    if (p.shape.size() > 1 && p.type != opt.type) uniform = false;
  if (auto ft = llama_file_type(opt.type); ft && uniform) w.set("general.file_type", *ft);
  w.set("barata.quant.version", uint32_t{1});
  w.set("barata.quant.scheme", quant_type_label(opt.type));
  w.set("barata.quant.source", src.description);
  if (any_private) {
    std::vector<GgufValue> ids;
    for (DType t : used)
      if (dtype_traits(t).is_private)
        ids.emplace_back(fmt::format("{}={}", static_cast<uint32_t>(t), dtype_name(t)));
    // Readers that do not know these ids can name them from here.
    w.set("barata.quant.private_types", GgufValue::array(GgufType::STRING, std::move(ids)));
    w.set("barata.quant.format",
          "tensor types >= 1000 are barata's own; layouts in barata's docs/quantize.md");
  }
  if (!fallbacks.empty())
    w.set("barata.quant.fallbacks", GgufValue::array(GgufType::STRING, std::move(fallbacks)));
}

bool is_matrix(const TensorPlan& p) {
  return p.shape.size() >= 2;
}

}  // namespace

MatrixStats matrix_stats(const float* w, const float* wq, int64_t n) {
  MatrixStats s;
  s.n = n;
  double sum = 0, sum2 = 0, err2 = 0, amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = w[i];
    sum += x;
    sum2 += x * x;
    amax = std::max(amax, std::fabs(x));
    const double e = x - wq[i];
    err2 += e * e;
  }
  const double mean = n ? sum / n : 0;
  const double var = n ? std::max(0.0, sum2 / n - mean * mean) : 0;
  const double sd = std::sqrt(var);
  s.rel_error = sum2 > 0 ? std::sqrt(err2 / sum2) : 0;
  s.max_over_std = sd > 0 ? amax / sd : 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::fabs(w[i] - mean) > 6 * sd) ++s.beyond_6sigma;
  return s;
}

QuantResult quantize_model(const SourceModel& src, const QuantOptions& opt,
                           const std::filesystem::path& out) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& in : src.inputs) {
    std::error_code ec;
    if (std::filesystem::exists(out, ec) && std::filesystem::equivalent(out, in, ec))
      fail("{}: refusing to overwrite the input file", out.string());
  }
  QuantResult res;
  res.plan = plan_quantization(src, opt);
  GgufWriter w;
  for (const auto& in : src.inputs) w.protect(in);
  set_metadata(w, src, opt, res.plan);
  ThreadPool pool(std::max(1, opt.threads));
  // Each tensor is loaded, quantized and measured while the file is written:
  // one source tensor and its quantized copy in memory at a time.
  for (size_t i = 0; i < src.tensors.size(); ++i) {
    const SourceTensor& t = src.tensors[i];
    const TensorPlan& p = res.plan[i];
    w.add_tensor(t.name, p.type, t.shape, [&, i]() {
      const std::vector<float> v = t.load();
      if (static_cast<int64_t>(v.size()) != t.n_elements())
        fail("{}: tensor {} loaded {} values, expected {}", src.description, t.name, v.size(),
             t.n_elements());
      Quantized q = quantize_one(pool, p.type, v, t.shape, is_matrix(p));
      if (is_matrix(p)) {
        MatrixStats s = matrix_stats(v.data(), q.back.data(), t.n_elements());
        s.name = t.name;
        s.type = p.type;
        s.bytes = q.bytes.size();
        res.quantized_weights += s.n;
        res.quantized_bytes += s.bytes;
        res.matrices.push_back(std::move(s));
      }
      if (opt.progress) opt.progress(i + 1, src.tensors.size(), t.name);
      return std::move(q.bytes);
    });
  }
  res.file_bytes = w.size();
  w.write(out);
  res.seconds = seconds_since(t0);
  return res;
}

std::vector<SchemeReport> quantization_report(const SourceModel& src, const QuantOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<SchemeReport> reports;
  std::vector<GgufWriter> writers;
  for (const QuantScheme& s : report_schemes()) {
    QuantOptions o = opt;
    o.type = s.type;
    SchemeReport r{s, {}};
    r.result.plan = plan_quantization(src, o);
    GgufWriter w;
    set_metadata(w, src, o, r.result.plan);
    writers.push_back(std::move(w));
    reports.push_back(std::move(r));
  }
  ThreadPool pool(std::max(1, opt.threads));
  for (size_t i = 0; i < src.tensors.size(); ++i) {
    const SourceTensor& t = src.tensors[i];
    std::vector<float> v;
    for (size_t s = 0; s < reports.size(); ++s) {
      QuantResult& r = reports[s].result;
      const TensorPlan& p = r.plan[i];
      // Sizes only: the report writes nothing.
      writers[s].add_tensor(t.name, p.type, t.shape, nullptr);
      if (!is_matrix(p)) continue;
      if (v.empty()) v = t.load();
      const Quantized q = quantize_one(pool, p.type, v, t.shape, true);
      MatrixStats st = matrix_stats(v.data(), q.back.data(), t.n_elements());
      st.name = t.name;
      st.type = p.type;
      st.bytes = q.bytes.size();
      r.quantized_weights += st.n;
      r.quantized_bytes += st.bytes;
      r.matrices.push_back(std::move(st));
    }
    if (opt.progress) opt.progress(i + 1, src.tensors.size(), t.name);
  }
  for (size_t s = 0; s < reports.size(); ++s) {
    reports[s].result.file_bytes = writers[s].size();
    reports[s].result.seconds = seconds_since(t0);
  }
  return reports;
}

}  // namespace barata
