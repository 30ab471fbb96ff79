// Tensor data types: one traits row per type (ggml's type_traits idea).
// Adding a type is adding a row in src/dtype/dtype.cpp and its block struct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace barata {

// Values are GGUF type ids, so files from the wider ecosystem load as they are.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  BF16 = 30,
  // barata's own schemes (docs/quantize.md). Ids far above llama.cpp's range
  // (< 64 in 2026) so that no reader mistakes them for one of its types; a
  // file using them says so in its `barata.quant.*` metadata.
  I8_TENSOR = 1000,  // int8, one fp32 scale per matrix
  I8_ROW = 1001,     // int8, one fp32 scale per row
  I4_TENSOR = 1002,  // int4 levels -8..7, one fp32 scale per matrix
  I4_ROW = 1003,     // int4, one fp32 scale per row
  I4_G128 = 1004,    // int4, one fp16 scale per 128 weights of a row (last group may be short)
  NF4_B64 = 1005,    // NF4 code book, one fp16 absmax per 64 weights
};

// Where a type's scales live. Block types keep them inside each block; the
// others put a header before each row or before the first row, so their byte
// size depends on the shape and not only on the element count.
enum class ScaleScope : uint8_t { kBlock, kRow, kTensor };

// src holds n / block_size whole blocks; n must be a multiple of block_size.
// For kRow types src is one whole row including its header and n its length;
// for kTensor types the output is at unit scale (times tensor_scale() later)
// and quantize_row is nullptr: use quantize_tensor().
using DequantizeRowFn = void (*)(const void* src, float* dst, int64_t n);
using QuantizeRowFn = void (*)(const float* src, void* dst, int64_t n);

struct DTypeTraits {
  DType type;
  const char* name;        // as llama.cpp and gguf-py spell it: "Q4_K", "F16"
  int64_t block_size;      // weights per block (1 for plain floats)
  size_t bytes_per_block;  // storage of one block
  bool is_quantized;
  DequantizeRowFn dequantize_row;  // reference, scalar, exact (bit-equal to gguf-py)
  QuantizeRowFn quantize_row;      // reference; nullptr where llama.cpp defines none
  ScaleScope scope = ScaleScope::kBlock;
  size_t row_header = 0;     // bytes before each row (kRow: its fp32 scale)
  size_t tensor_header = 0;  // bytes before the first row (kTensor: fp32 scale + padding)
  bool is_private = false;   // barata's own type: other readers cannot load it
  // kRow types with group scales: the row header holds one fp16 scale per
  // started group of row_group weights (the last group may be shorter).
  int64_t row_group = 0;

  // Nominal: per-row and per-tensor headers excluded, group scales included.
  double bits_per_weight() const {
    return 8.0 * bytes_per_block / block_size + (row_group ? 16.0 / row_group : 0.0);
  }
};

// The row for a type id read from a file; nullptr when barata does not know it.
const DTypeTraits* find_dtype(uint32_t gguf_id);
const DTypeTraits& dtype_traits(DType t);
std::span<const DTypeTraits> all_dtypes();
std::optional<DType> dtype_from_name(std::string_view name);  // case-insensitive
inline const char* dtype_name(DType t) {
  return dtype_traits(t).name;
}

// Bytes of n_elements of type t; n_elements must be a multiple of the block
// size (throws barata::Error otherwise). Block-scoped types only: for the
// others use tensor_bytes().
size_t dtype_bytes(DType t, int64_t n_elements);

// Bytes of one row of k elements, its header included (throws when k is not
// a whole number of blocks).
size_t row_bytes(DType t, int64_t k);
// Bytes of a tensor: shape in ggml order (shape[0] is the row length).
size_t tensor_bytes(DType t, std::span<const int64_t> shape);
size_t tensor_bytes(DType t, int64_t k, int64_t n_rows);
// The same formula, for untrusted shapes: nullopt when a dimension is not
// negative, the row is not whole blocks, or the size overflows 64 bits.
std::optional<uint64_t> checked_tensor_bytes(DType t, std::span<const int64_t> shape);
// Where the rows start inside a tensor's data, and its one scale (1 unless kTensor).
const uint8_t* tensor_rows(DType t, const uint8_t* tensor);
float tensor_scale(DType t, const uint8_t* tensor);

// Whole-matrix conversions valid for every type (the kTensor types need the
// whole matrix to pick their scale). dst of quantize_tensor has
// tensor_bytes(t, k, n_rows) bytes.
void quantize_tensor(DType t, const float* src, int64_t k, int64_t n_rows, uint8_t* dst);
void dequantize_tensor(DType t, const uint8_t* src, int64_t k, int64_t n_rows, float* dst);
// Row r only (embedding lookups).
void dequantize_tensor_row(DType t, const uint8_t* tensor, int64_t k, int64_t r, float* dst);

// The pieces of quantize_tensor, for callers that spread rows over threads:
// the header (scale) of the whole matrix first, then any range of rows.
void quantize_tensor_header(DType t, const float* src, int64_t k, int64_t n_rows, uint8_t* dst);
void quantize_tensor_rows(DType t, const float* src, int64_t k, int64_t row0, int64_t n,
                          uint8_t* dst);

}  // namespace barata
