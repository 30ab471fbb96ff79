// The malformed-file corpus: every file is rejected with one clear line that
// names the problem, both by the library and by `barata inspect` (exit 1, one
// "error:" line on stderr). Under ASan/UBSan this also proves no bad read.
#include <random>

#include <gtest/gtest.h>

#include "barata/error.h"
#include "barata/gguf.h"
#include "gguf_corpus.h"
#include "test_util.h"

namespace barata {
namespace {

using test::Bytes;
using test::RawGguf;

struct Case {
  std::string name;
  std::vector<uint8_t> bytes;
  std::string expect;  // a substring of the error
};

std::vector<Case> corpus() {
  std::vector<Case> c;
  auto add = [&](std::string name, const RawGguf& g, std::string expect) {
    c.push_back({std::move(name), g.build(), std::move(expect)});
  };
  RawGguf g;
  g = RawGguf::valid();
  g.magic = 0x46554746;
  add("bad_magic", g, "not a GGUF file");
  for (uint32_t v : {0u, 1u, 4u}) {
    g = RawGguf::valid();
    g.version = v;
    add("version_" + std::to_string(v), g, "unsupported GGUF version");
  }
  g = RawGguf::valid();
  g.version = 0x03000000;
  add("big_endian", g, "big-endian");
  g = RawGguf::valid();
  g.n_tensors_override = int64_t{1} << 40;
  add("huge_tensor_count", g, "tensor count");
  g = RawGguf::valid();
  g.n_kv_override = int64_t{1} << 40;
  add("huge_kv_count", g, "metadata count");
  g = RawGguf::valid();
  g.n_kv_override = 6;
  add("kv_count_too_big", g, "runs past the end");
  g = RawGguf::valid();
  g.kvs[0] = Bytes().str("general.architecture").put<uint32_t>(8).str("llama", 1u << 30).b;
  add("string_len_past_end", g, "runs past the end of the file");
  g = RawGguf::valid();
  g.kvs[0] = Bytes().str("k", uint64_t{1} << 62).b;
  add("key_len_past_end", g, "runs past the end");
  g = RawGguf::valid();
  g.kvs[1] = Bytes().str("x").put<uint32_t>(13).put<uint32_t>(0).b;
  add("invalid_value_type", g, "invalid value type 13");
  g = RawGguf::valid();
  g.kvs[1] = Bytes().str("x").put<uint32_t>(0xffffffff).b;
  add("invalid_value_type_max", g, "invalid value type");
  g = RawGguf::valid();
  g.kvs[3] = Bytes().str("a").put<uint32_t>(9).put<uint32_t>(77).put<uint64_t>(1).b;
  add("invalid_array_type", g, "invalid array element type 77");
  g = RawGguf::valid();
  g.kvs[3] = Bytes().str("a").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(uint64_t{1} << 61).b;
  add("huge_array", g, "cannot fit");
  {
    Bytes deep;
    deep.str("deep").put<uint32_t>(9);
    for (int i = 0; i < 20; ++i) deep.put<uint32_t>(9).put<uint64_t>(1);
    deep.put<uint32_t>(0).put<uint64_t>(0);
    g = RawGguf::valid();
    g.kvs[3] = deep.b;
    add("nested_too_deep", g, "nested deeper");
  }
  g = RawGguf::valid();
  g.kvs[2] = Bytes().str("flag").put<uint32_t>(7).put<uint8_t>(2).b;
  add("bool_2", g, "bool value 2");
  g = RawGguf::valid();
  g.kvs[2] = RawGguf::kv_string("general.architecture", "qwen2");
  add("duplicate_key", g, "duplicate metadata key");
  g = RawGguf::valid();
  g.kvs.push_back(Bytes().str("general.alignment").put<uint32_t>(4).put<uint32_t>(48).b);
  add("alignment_not_pow2", g, "not a power of two");
  g = RawGguf::valid();
  g.kvs.push_back(Bytes().str("general.alignment").put<uint32_t>(4).put<uint32_t>(0).b);
  add("alignment_zero", g, "not a power of two");
  g = RawGguf::valid();
  g.kvs.push_back(RawGguf::kv_string("general.alignment", "32"));
  add("alignment_type", g, "general.alignment must be uint32");
  g = RawGguf::valid();
  g.tensors[0].n_dims_override = 0;
  g.tensors[0].dims = {};
  add("n_dims_0", g, "tensor #0 'tok' (info at byte 189): n_dims at byte 200 is 0");
  g = RawGguf::valid();
  g.tensors[0].dims = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  add("n_dims_9", g, "n_dims at byte 200 is 9");
  g = RawGguf::valid();
  g.tensors[0].dims = {uint64_t{1} << 32, uint64_t{1} << 32};
  add("dim_overflow", g, "overflows");
  g = RawGguf::valid();
  g.tensors[0].dims = {uint64_t{1} << 63};
  add("dim_negative", g, "dimension 0 is");
  g = RawGguf::valid();
  g.tensors[0].dims = {8, 0};
  add("dim_zero", g, "dimension 1 is 0");
  g = RawGguf::valid();
  g.tensors[0].type = 99;
  add("unknown_type", g, "unknown tensor type id 99");
  g = RawGguf::valid();
  g.tensors[0].type = 8;
  g.tensors[0].dims = {8, 2};
  add("partial_block", g, "not a multiple of the Q8_0 block size");
  g = RawGguf::valid();
  g.tensors[1].offset = 4096;
  add("offset_past_end", g, "run past the end of the file");
  g = RawGguf::valid();
  g.tensors[1].offset = 36;
  add("offset_misaligned", g, "not a multiple of the alignment");
  g = RawGguf::valid();
  g.tensors[1].offset = ~uint64_t{0} - 31;
  add("offset_wraps", g, "past the end");
  g = RawGguf::valid();
  g.tensors[1].dims = {uint64_t{1} << 60};
  add("size_past_end", g, "past the end");
  g = RawGguf::valid();
  g.tensors[1].name = "tok";
  add("duplicate_tensor", g, "tensor #1 'tok' (info at byte 232): duplicate tensor name");
  g = RawGguf::valid();
  g.data_bytes = 64 + 16;
  add("data_truncated", g, "tensor #1 'out': 32 bytes of data at offset 64");
  // No writer lays two tensors over the same bytes: refused, naming both.
  g = RawGguf::valid();
  g.tensors[1].offset = 32;
  add("tensors_overlap", g,
      "tensor #1 'out' (data [32, 64)) overlaps tensor #0 'tok' (data [0, 64))");
  g = RawGguf::valid();
  g.tensors[1].offset = 0;
  g.tensors[1].dims = {8, 2};
  add("tensors_coincide", g, "tensor #1 'out' (data [0, 64)) overlaps tensor #0 'tok'");
  // A huge offset is printed as it is, not as a wrapped-around sum.
  g = RawGguf::valid();
  g.tensors[1].offset = ~uint64_t{0} - 31;
  add("offset_huge_printed_whole", g, "at offset 18446744073709551584 of the data section");
  // Untrusted bytes cannot cut the message (NUL) or forge a line (newline, ESC).
  g = RawGguf::valid();
  g.tensors[1].name = std::string("o\x1b[2J\nerror: forged\0x", 21);
  g.tensors[1].offset = 4096;
  add("name_escaped", g, "tensor #1 'o\\x1b[2J\\nerror: forged\\x00x'");
  g = RawGguf::valid();
  g.kvs.push_back(RawGguf::kv_string(std::string("k\0\n", 3), "a"));
  g.kvs.push_back(RawGguf::kv_string(std::string("k\0\n", 3), "b"));
  add("key_escaped", g, "duplicate metadata key 'k\\x00\\n'");
  return c;
}

// Every truncation before the end of the last tensor's data must fail.
std::vector<Case> truncations() {
  const auto full = RawGguf::valid().build();
  const GgufFile f = GgufFile::from_memory(full);
  uint64_t end = 0;
  for (const auto& t : f.tensors()) end = std::max(end, f.data_offset() + t.offset + t.n_bytes);
  std::vector<Case> c;
  for (uint64_t n = 0; n < end; ++n)
    c.push_back({"truncated_at_" + std::to_string(n),
                 std::vector<uint8_t>(full.begin(), full.begin() + static_cast<long>(n)), ""});
  return c;
}

TEST(GgufMalformed, TheBaseFileIsValid) {
  const auto bytes = RawGguf::valid().build();
  const GgufFile f = GgufFile::from_memory(bytes);
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.get_array<std::string>("tokens"), (std::vector<std::string>{"ab", "c"}));
}

TEST(GgufMalformed, EveryCaseIsRejectedWithItsReason) {
  for (const auto& c : corpus()) {
    SCOPED_TRACE(c.name);
    try {
      GgufFile::from_memory(c.bytes, c.name + ".gguf");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
      EXPECT_EQ(msg.rfind(c.name + ".gguf: ", 0), 0u)
          << "does not start with the file name: " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "more than one line: " << msg;
    }
  }
}

TEST(GgufMalformed, EveryTruncationIsRejected) {
  const auto cases = truncations();
  EXPECT_GT(cases.size(), 200u);
  for (const auto& c : cases) {
    try {
      GgufFile::from_memory(c.bytes, c.name);
      ADD_FAILURE() << c.name << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}

// Random byte flips anywhere: either a valid file or a clean Error, never a
// crash or an out-of-bounds read (which ASan would report).
TEST(GgufMalformed, RandomByteFlipsNeverCrash) {
  const auto base = RawGguf::valid().build();
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int i = 0; i < 5000; ++i) {
    auto b = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % 200] ^= static_cast<uint8_t>(1u << (rng() % 8));
    try {
      const GgufFile f = GgufFile::from_memory(b);
      for (const auto& t : f.tensors()) ASSERT_LE(t.data + t.n_bytes, b.data() + b.size());
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);
}

// The CLI turns each rejection into exactly one "error:" line and exit 1.
TEST(GgufMalformed, InspectPrintsOneErrorLineAndExitsOne) {
  test::TempDir dir;
  auto cases = corpus();
  const auto full = RawGguf::valid().build();
  cases.push_back(
      {"truncated_header", std::vector<uint8_t>(full.begin(), full.begin() + 30), "truncated"});
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto path = dir / (c.name + ".gguf");
    test::write_bytes(path, c.bytes);
    const auto out = dir / "stderr.txt";
    const std::string cmd = std::string(BARATA_CLI_PATH) + " inspect " + path.string() +
                            " >/dev/null 2>" + out.string();
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 1);
    const auto err = test::read_bytes(out);
    const std::string text(err.begin(), err.end());
    EXPECT_EQ(text.rfind("error: " + path.string() + ": ", 0), 0u) << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
    EXPECT_NE(text.find(c.expect), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace barata
