// Which type each tensor gets, and why (docs/quantize.md).
#include <fnmatch.h>

#include <algorithm>
#include <array>
#include <cctype>

#include "barata/error.h"
#include "barata/quantize.h"

namespace barata {
namespace {

constexpr std::array kSchemes = {
    QuantScheme{"int8-tensor", DType::I8_TENSOR, "int8, one fp32 scale per matrix"},
    QuantScheme{"int8-row", DType::I8_ROW, "int8, one fp32 scale per row"},
    QuantScheme{"int4-tensor", DType::I4_TENSOR, "int4, one fp32 scale per matrix"},
    QuantScheme{"int4-row", DType::I4_ROW, "int4, one fp32 scale per row"},
    QuantScheme{"int4-g128", DType::I4_G128, "int4, one fp16 scale per 128 weights"},
    QuantScheme{"nf4", DType::NF4_B64, "NF4 code book, one fp16 absmax per 64 weights"},
    QuantScheme{"q8_0", DType::Q8_0, "llama.cpp Q8_0: int8, fp16 scale per 32"},
    QuantScheme{"q4_0", DType::Q4_0, "llama.cpp Q4_0: int4, fp16 scale per 32"},
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool can_quantize_to(const DTypeTraits& t) {
  return t.quantize_row != nullptr || t.scope == ScaleScope::kTensor;
}

bool fits(DType t, int64_t k) {
  const DTypeTraits& tr = dtype_traits(t);
  return k % tr.block_size == 0;
}

// The type used when `want` cannot hold rows of k: the same bits per row for
// barata's types (per-row scales have no block constraint beyond two weights
// per byte), F16 for llama.cpp's so the file stays readable there.
DType fallback_for(DType want, int64_t k) {
  const DTypeTraits& tr = dtype_traits(want);
  if (!tr.is_private) return DType::F16;
  const bool four_bit = tr.bits_per_weight() < 6;
  if (four_bit && k % 2 == 0) return DType::I4_ROW;
  return DType::I8_ROW;
}

}  // namespace

std::span<const QuantScheme> report_schemes() {
  return kSchemes;
}

std::string quant_type_names() {
  std::string s;
  for (const auto& q : kSchemes) s += std::string(s.empty() ? "" : ", ") + q.name;
  for (const auto& t : all_dtypes()) {
    if (!can_quantize_to(t) || t.is_private) continue;
    const std::string n = lower(t.name);
    if (n == "q8_0" || n == "q4_0") continue;
    s += ", " + n;
  }
  return s;
}

DType parse_quant_type(const std::string& name) {
  const std::string n = lower(name);
  for (const auto& q : kSchemes)
    if (n == q.name) return q.type;
  if (auto t = dtype_from_name(n); t && can_quantize_to(dtype_traits(*t))) return *t;
  fail("unknown quantization type '{}' (valid: {})", name, quant_type_names());
}

std::string quant_type_label(DType t) {
  for (const auto& q : kSchemes)
    if (q.type == t) return q.name;
  return lower(dtype_name(t));
}

std::vector<TensorPlan> plan_quantization(const SourceModel& src, const QuantOptions& opt) {
  std::vector<TensorPlan> plan;
  plan.reserve(src.tensors.size());
  for (const SourceTensor& t : src.tensors) {
    TensorPlan p{t.name, t.shape, t.source_type, opt.type, "scheme"};
    const int64_t k = t.shape[0];
    bool pinned = false;
    for (const auto& [pattern, type] : opt.overrides) {
      if (::fnmatch(pattern.c_str(), t.name.c_str(), 0) == 0) {
        p.type = type;
        p.why = "override '" + pattern + "'";
        pinned = true;
        break;
      }
    }
    if (!pinned && t.shape.size() == 1) {
      p.type = DType::F32;  // norms and biases: tiny, and precision-critical
      p.why = "1-D: kept F32";
      pinned = true;
    }
    // A mixture of experts' router: small, and its logits pick the experts;
    // llama.cpp's quantizer leaves it unquantized too.
    if (!pinned && t.name.size() > 19 &&
        t.name.compare(t.name.size() - 19, 19, "ffn_gate_inp.weight") == 0) {
      p.type = DType::F32;
      p.why = "MoE router: kept F32";
      pinned = true;
    }
    if (!pinned && t.name == "token_embd.weight" && opt.embed_type) {
      p.type = *opt.embed_type;
      p.why = "--embed-type";
    } else if (!pinned && t.name == "output.weight" && opt.output_type) {
      p.type = *opt.output_type;
      p.why = "--output-type";
    }
    if (!fits(p.type, k)) {
      const DType fb = fallback_for(p.type, k);
      p.why = fmt::format("row length {} is not a multiple of the {} block of {}: {} instead", k,
                          quant_type_label(p.type), dtype_traits(p.type).block_size,
                          quant_type_label(fb));
      p.type = fb;
      p.fallback = true;
    }
    plan.push_back(std::move(p));
  }
  return plan;
}

}  // namespace barata
