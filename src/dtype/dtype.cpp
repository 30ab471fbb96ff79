#include "barata/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "barata/error.h"
#include "barata/quant_blocks.h"
#include "rows.h"

namespace barata {
namespace {

using namespace rows;

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
  if (n_elements < 0 || n_elements % tr.block_size != 0)
    fail("{} elements is not a whole number of {} blocks of {}", n_elements, tr.name,
         tr.block_size);
  return static_cast<size_t>(n_elements / tr.block_size) * tr.bytes_per_block;
}

}  // namespace barata
