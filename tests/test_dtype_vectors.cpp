// Bit-exact agreement of barata's reference rows with gguf-py (see
// scripts/gen_dtype_vectors.py and tests/data/dtype_vectors/manifest.json).
#include <cstring>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/dtype.h"
#include "barata/error.h"
#include "test_util.h"

namespace barata {
namespace {

std::filesystem::path vectors_dir() {
  return test::source_dir() / "tests/data/dtype_vectors";
}

nlohmann::json manifest() {
  std::ifstream f(vectors_dir() / "manifest.json");
  return nlohmann::json::parse(f);
}

std::vector<float> as_floats(const std::vector<uint8_t>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}

// Bitwise float comparison that reports the first few mismatches.
::testing::AssertionResult bit_equal(const std::vector<float>& got,
                                     const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  int bad = 0;
  auto fail = ::testing::AssertionFailure();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      if (bad++ < 5) fail << "[" << i << "] got " << got[i] << " want " << want[i] << "; ";
    }
  }
  if (bad) return fail << bad << " of " << got.size() << " differ";
  return ::testing::AssertionSuccess();
}

TEST(DTypeVectors, EveryTypeInTheTableHasVectors) {
  const auto m = manifest();
  for (const auto& t : all_dtypes()) {
    if (t.is_private) continue;  // barata's own types: gguf-py has none (test_quant_types)
    bool found = false;
    for (const auto& e : m["types"]) found |= e["type"] == t.name;
    EXPECT_TRUE(found) << t.name << " has no gguf-py vectors";
  }
}

TEST(DTypeVectors, DequantizeMatchesGgufPyBitExactly) {
  const auto m = manifest();
  for (const auto& e : m["types"]) {
    const std::string name = e["type"];
    SCOPED_TRACE(name);
    const auto type = dtype_from_name(name);
    ASSERT_TRUE(type.has_value());
    const auto& tr = dtype_traits(*type);
    const int64_t n = e["n"];
    const auto blocks = test::read_bytes(vectors_dir() / e["blocks"].get<std::string>());
    ASSERT_EQ(blocks.size(), dtype_bytes(*type, n));
    std::vector<float> got(static_cast<size_t>(n));
    tr.dequantize_row(blocks.data(), got.data(), n);
    EXPECT_TRUE(bit_equal(
        got, as_floats(test::read_bytes(vectors_dir() / e["dequant"].get<std::string>()))));
  }
}

TEST(DTypeVectors, QuantizeMatchesGgufPyByteForByte) {
  int checked = 0;
  const auto m = manifest();
  for (const auto& e : m["types"]) {
    if (!e.contains("quant_in")) continue;
    const std::string name = e["type"];
    SCOPED_TRACE(name);
    const auto& tr = dtype_traits(*dtype_from_name(name));
    ASSERT_NE(tr.quantize_row, nullptr);
    const int64_t n = e["n"];
    const auto in = as_floats(test::read_bytes(vectors_dir() / e["quant_in"].get<std::string>()));
    const auto want = test::read_bytes(vectors_dir() / e["quant_out"].get<std::string>());
    std::vector<uint8_t> got(dtype_bytes(tr.type, n));
    tr.quantize_row(in.data(), got.data(), n);
    ASSERT_EQ(got.size(), want.size());
    size_t first_bad = got.size();
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i]) {
        first_bad = i;
        break;
      }
    EXPECT_EQ(first_bad, got.size())
        << "first differing byte (block " << first_bad / tr.bytes_per_block << ")";
    ++checked;
  }
  EXPECT_EQ(checked, 7);  // F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
}

TEST(DTypeTable, RowsAreConsistent) {
  for (const auto& t : all_dtypes()) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(find_dtype(static_cast<uint32_t>(t.type)), &t);
    EXPECT_EQ(dtype_from_name(t.name), t.type);
    EXPECT_NE(t.dequantize_row, nullptr);
    EXPECT_EQ(t.is_quantized, t.block_size > 1 || t.scope != ScaleScope::kBlock);
    EXPECT_EQ(t.is_private, static_cast<uint32_t>(t.type) >= 1000);
  }
  EXPECT_EQ(find_dtype(9999), nullptr);
  EXPECT_DOUBLE_EQ(dtype_traits(DType::Q4_0).bits_per_weight(), 4.5);
  EXPECT_DOUBLE_EQ(dtype_traits(DType::Q4_K).bits_per_weight(), 4.5);
  EXPECT_DOUBLE_EQ(dtype_traits(DType::Q6_K).bits_per_weight(), 6.5625);
  EXPECT_THROW(dtype_bytes(DType::Q8_0, 33), Error);
  EXPECT_EQ(dtype_bytes(DType::Q8_0, 64), 68u);
}

}  // namespace
}  // namespace barata
