// `barata quantize`: choose a type for every tensor of a source model, quantize
// it (rows spread over threads), measure what it cost, write a GGUF atomically.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "barata/convert.h"
#include "barata/dtype.h"

namespace barata {

// The schemes the report compares, under their command-line names.
struct QuantScheme {
  const char* name;  // "int8-row", "nf4", "q8_0"
  DType type;
  const char* summary;
};
std::span<const QuantScheme> report_schemes();

// A --type value: a scheme name above, or any type barata can quantize to by
// its GGUF name (f32, f16, bf16, q4_1, q5_k, ...). Throws, listing the valid
// names, when unknown.
DType parse_quant_type(const std::string& name);
std::string quant_type_names();         // for help and error messages
std::string quant_type_label(DType t);  // "int8-row" for scheme types, else "q4_k"

struct QuantOptions {
  DType type = DType::Q8_0;
  std::optional<DType> embed_type;   // token_embd.weight
  std::optional<DType> output_type;  // output.weight
  // (glob over tensor names, type); the first match wins over everything else.
  std::vector<std::pair<std::string, DType>> overrides;
  int threads = 1;
  // Called after each tensor: (done, total, name).
  std::function<void(size_t, size_t, const std::string&)> progress;
};

struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  std::string source_type;
  DType type;
  std::string why;        // "scheme", "1-D: kept F32", "override 'blk.*.ffn_down*'", ...
  bool fallback = false;  // the scheme's type could not hold this shape
};

// The type for each tensor; fallbacks are explicit (TensorPlan::fallback).
std::vector<TensorPlan> plan_quantization(const SourceModel& src, const QuantOptions& opt);

// Error of one quantized matrix and outlier statistics of the original.
struct MatrixStats {
  std::string name;
  DType type;
  int64_t n = 0;
  double rel_error = 0;       // ||W - W^||_F / ||W||_F
  double max_over_std = 0;    // max |w| / std(w)
  int64_t beyond_6sigma = 0;  // |w - mean| > 6 std
  size_t bytes = 0;
};

struct QuantResult {
  std::vector<TensorPlan> plan;
  std::vector<MatrixStats> matrices;  // every 2-D tensor
  uint64_t file_bytes = 0;
  int64_t quantized_weights = 0;  // elements of the 2-D tensors
  uint64_t quantized_bytes = 0;   // their stored bytes
  double seconds = 0;
  double bits_per_weight() const {
    return quantized_weights ? 8.0 * static_cast<double>(quantized_bytes) / quantized_weights : 0;
  }
};

// Quantizes and writes `out` atomically (refusing to overwrite an input).
QuantResult quantize_model(const SourceModel& src, const QuantOptions& opt,
                           const std::filesystem::path& out);

// The dry run: every scheme of report_schemes() on every 2-D tensor (each
// source tensor loaded once), nothing written. Row i of the result is scheme i.
struct SchemeReport {
  QuantScheme scheme;
  QuantResult result;
};
std::vector<SchemeReport> quantization_report(const SourceModel& src, const QuantOptions& opt);

// Statistics of w against its quantized copy (threads split the work).
MatrixStats matrix_stats(const float* w, const float* wq, int64_t n);

}  // namespace barata
