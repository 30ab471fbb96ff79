#include "barata/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>

#include "barata/error.h"
#include "barata/quant_blocks.h"
#include "rows.h"

namespace barata {
namespace {

using namespace rows;

// kTensor types: fp32 scale, then zeros so that rows start 32-byte aligned.
constexpr size_t kTensorHeader = 32;

float max_abs(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, std::fabs(x[j]));
  return m;
}

constexpr std::array kTraits = {
    DTypeTraits{DType::F32, "F32", 1, 4, false, dequantize_f32, quantize_f32},
    DTypeTraits{DType::F16, "F16", 1, 2, false, dequantize_f16, quantize_f16},
    DTypeTraits{DType::Q4_0, "Q4_0", kQK4_0, sizeof(BlockQ4_0), true, dequantize_q4_0,
                quantize_q4_0},
    DTypeTraits{DType::Q4_1, "Q4_1", kQK4_1, sizeof(BlockQ4_1), true, dequantize_q4_1,
                quantize_q4_1},
    DTypeTraits{DType::Q5_0, "Q5_0", kQK5_0, sizeof(BlockQ5_0), true, dequantize_q5_0,
                quantize_q5_0},
    DTypeTraits{DType::Q5_1, "Q5_1", kQK5_1, sizeof(BlockQ5_1), true, dequantize_q5_1,
                quantize_q5_1},
    DTypeTraits{DType::Q8_0, "Q8_0", kQK8_0, sizeof(BlockQ8_0), true, dequantize_q8_0,
                quantize_q8_0},
    DTypeTraits{DType::Q4_K, "Q4_K", kQK_K, sizeof(BlockQ4_K), true, dequantize_q4_k,
                quantize_q4_k},
    DTypeTraits{DType::Q5_K, "Q5_K", kQK_K, sizeof(BlockQ5_K), true, dequantize_q5_k,
                quantize_q5_k},
    DTypeTraits{DType::Q6_K, "Q6_K", kQK_K, sizeof(BlockQ6_K), true, dequantize_q6_k,
                quantize_q6_k},
    DTypeTraits{DType::IQ4_NL, "IQ4_NL", kQK4_NL, sizeof(BlockIQ4_NL), true, dequantize_iq4_nl,
                quantize_iq4_nl},
    DTypeTraits{DType::BF16, "BF16", 1, 2, false, dequantize_bf16, quantize_bf16},
    DTypeTraits{DType::I8_TENSOR, "I8_TENSOR", 1, 1, true, dequantize_i8_levels, nullptr,
                ScaleScope::kTensor, 0, kTensorHeader, true},
    DTypeTraits{DType::I8_ROW, "I8_ROW", 1, 1, true, dequantize_i8_row, quantize_i8_row,
                ScaleScope::kRow, 4, 0, true},
    DTypeTraits{DType::I4_TENSOR, "I4_TENSOR", 2, 1, true, dequantize_i4_levels, nullptr,
                ScaleScope::kTensor, 0, kTensorHeader, true},
    DTypeTraits{DType::I4_ROW, "I4_ROW", 2, 1, true, dequantize_i4_row, quantize_i4_row,
                ScaleScope::kRow, 4, 0, true},
    DTypeTraits{DType::I4_G128, "I4_G128", 32, 16, true, dequantize_i4_g128, quantize_i4_g128,
                ScaleScope::kRow, 0, 0, true, kQKG128},
    DTypeTraits{DType::NF4_B64, "NF4_B64", kQKNF4, sizeof(BlockNF4), true, dequantize_nf4,
                quantize_nf4, ScaleScope::kBlock, 0, 0, true},
};

}  // namespace

const DTypeTraits* find_dtype(uint32_t gguf_id) {
  for (const auto& t : kTraits)
    if (static_cast<uint32_t>(t.type) == gguf_id) return &t;
  return nullptr;
}

const DTypeTraits& dtype_traits(DType t) {
  const DTypeTraits* row = find_dtype(static_cast<uint32_t>(t));
  if (!row) fail("internal: no traits row for type id {}", static_cast<uint32_t>(t));
  return *row;
}

std::span<const DTypeTraits> all_dtypes() {
  return kTraits;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& t : kTraits) {
    std::string_view n = t.name;
    if (n.size() == name.size() && std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) {
          return std::toupper(static_cast<unsigned char>(a)) ==
                 std::toupper(static_cast<unsigned char>(b));
        }))
      return t.type;
  }
  return std::nullopt;
}

size_t dtype_bytes(DType t, int64_t n_elements) {
  const DTypeTraits& tr = dtype_traits(t);
  if (tr.scope != ScaleScope::kBlock)
    fail("internal: {} has per-row or per-tensor scales: its size depends on the shape", tr.name);
  if (n_elements < 0 || n_elements % tr.block_size != 0)
    fail("{} elements is not a whole number of {} blocks of {}", n_elements, tr.name,
         tr.block_size);
  return static_cast<size_t>(n_elements / tr.block_size) * tr.bytes_per_block;
}

}  // namespace barata

namespace barata {

size_t row_bytes(DType t, int64_t k) {
  const DTypeTraits& tr = dtype_traits(t);
  if (k < 0 || k % tr.block_size != 0)
    fail("row length {} is not a whole number of {} blocks of {}", k, tr.name, tr.block_size);
  const size_t groups =
      tr.row_group ? static_cast<size_t>((k + tr.row_group - 1) / tr.row_group) : 0;
  return tr.row_header + 2 * groups + static_cast<size_t>(k / tr.block_size) * tr.bytes_per_block;
}

std::optional<uint64_t> checked_tensor_bytes(DType t, std::span<const int64_t> shape) {
  const DTypeTraits& tr = dtype_traits(t);
  if (shape.empty() || shape[0] < 0 || shape[0] % tr.block_size != 0) return std::nullopt;
  const auto k = static_cast<uint64_t>(shape[0]);
  uint64_t rows = 1;
  for (size_t i = 1; i < shape.size(); ++i)
    if (shape[i] < 0 || __builtin_mul_overflow(rows, static_cast<uint64_t>(shape[i]), &rows))
      return std::nullopt;
  const uint64_t groups = tr.row_group ? (k + tr.row_group - 1) / tr.row_group : 0;
  uint64_t row = 0, total = 0;
  if (__builtin_mul_overflow(k / tr.block_size, tr.bytes_per_block, &row) ||
      __builtin_add_overflow(row, tr.row_header + 2 * groups, &row) ||
      __builtin_mul_overflow(row, rows, &total) ||
      __builtin_add_overflow(total, tr.tensor_header, &total))
    return std::nullopt;
  return total;
}

size_t tensor_bytes(DType t, int64_t k, int64_t n_rows) {
  const int64_t shape[2] = {k, n_rows};
  return tensor_bytes(t, shape);
}

size_t tensor_bytes(DType t, std::span<const int64_t> shape) {
  if (shape.empty()) fail("internal: tensor_bytes of an empty shape");
  if (shape[0] < 0 || shape[0] % dtype_traits(t).block_size != 0) row_bytes(t, shape[0]);  // throws
  const auto n = checked_tensor_bytes(t, shape);
  if (!n) fail("a {} tensor of this shape has more bytes than 64 bits count", dtype_name(t));
  return static_cast<size_t>(*n);
}

const uint8_t* tensor_rows(DType t, const uint8_t* tensor) {
  return tensor + dtype_traits(t).tensor_header;
}

float tensor_scale(DType t, const uint8_t* tensor) {
  if (dtype_traits(t).scope != ScaleScope::kTensor) return 1.0f;
  float d;
  std::memcpy(&d, tensor, sizeof d);
  return d;
}

void quantize_tensor_header(DType t, const float* src, int64_t k, int64_t n_rows, uint8_t* dst) {
  const DTypeTraits& tr = dtype_traits(t);
  if (tr.scope != ScaleScope::kTensor) return;
  std::memset(dst, 0, tr.tensor_header);
  const float levels = t == DType::I8_TENSOR ? 127.0f : 7.0f;
  const float d = max_abs(src, k * n_rows) / levels;
  std::memcpy(dst, &d, sizeof d);
}

void quantize_tensor_rows(DType t, const float* src, int64_t k, int64_t row0, int64_t n,
                          uint8_t* dst) {
  const DTypeTraits& tr = dtype_traits(t);
  const size_t rb = row_bytes(t, k);
  uint8_t* rows = dst + tr.tensor_header;
  for (int64_t r = row0; r < row0 + n; ++r) {
    const float* x = src + r * k;
    uint8_t* out = rows + static_cast<size_t>(r) * rb;
    if (t == DType::I8_TENSOR) {
      rows::quantize_i8_scaled(x, out, k, tensor_scale(t, dst));
    } else if (t == DType::I4_TENSOR) {
      rows::quantize_i4_scaled(x, out, k, tensor_scale(t, dst));
    } else {
      if (!tr.quantize_row) fail("no quantizer for type {}", tr.name);
      tr.quantize_row(x, out, k);
    }
  }
}

void quantize_tensor(DType t, const float* src, int64_t k, int64_t n_rows, uint8_t* dst) {
  quantize_tensor_header(t, src, k, n_rows, dst);
  quantize_tensor_rows(t, src, k, 0, n_rows, dst);
}

void dequantize_tensor_row(DType t, const uint8_t* tensor, int64_t k, int64_t r, float* dst) {
  const DTypeTraits& tr = dtype_traits(t);
  tr.dequantize_row(tensor_rows(t, tensor) + static_cast<size_t>(r) * row_bytes(t, k), dst, k);
  if (tr.scope == ScaleScope::kTensor) {
    const float d = tensor_scale(t, tensor);
    for (int64_t j = 0; j < k; ++j) dst[j] *= d;
  }
}

void dequantize_tensor(DType t, const uint8_t* src, int64_t k, int64_t n_rows, float* dst) {
  for (int64_t r = 0; r < n_rows; ++r) dequantize_tensor_row(t, src, k, r, dst + r * k);
}

}  // namespace barata
