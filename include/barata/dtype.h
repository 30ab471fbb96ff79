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
};

// src holds n / block_size whole blocks; n must be a multiple of block_size.
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

  double bits_per_weight() const { return 8.0 * bytes_per_block / block_size; }
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
// size (throws barata::Error otherwise).
size_t dtype_bytes(DType t, int64_t n_elements);

}  // namespace barata
