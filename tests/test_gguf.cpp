// GGUF write -> read identity, typed accessors and their errors, atomic writes.
#include <cstring>

#include <gtest/gtest.h>

#include "barata/error.h"
#include "barata/gguf.h"
#include "test_util.h"

namespace barata {
namespace {

GgufWriter sample_writer() {
  GgufWriter w;
  w.set("general.architecture", "llama");
  w.set("u8", GgufValue(uint8_t{200}));
  w.set("i8", GgufValue(int8_t{-5}));
  w.set("u16", GgufValue(uint16_t{60000}));
  w.set("i16", GgufValue(int16_t{-30000}));
  w.set("u32", GgufValue(uint32_t{4000000000u}));
  w.set("i32", GgufValue(int32_t{-7}));
  w.set("f32", GgufValue(1.5f));
  w.set("flag", GgufValue(true));
  w.set("u64", GgufValue(uint64_t{1} << 60));
  w.set("i64", GgufValue(int64_t{-1} << 60));
  w.set("f64", GgufValue(2.25));
  w.set("strings", GgufValue::array(GgufType::STRING, {"a", "", "héllo"}));
  w.set("floats", GgufValue::array(GgufType::FLOAT32, {1.0f, 2.0f}));
  w.set("nested", GgufValue::array(GgufType::ARRAY,
                                   {GgufValue::array(GgufType::INT32, {int32_t{1}, int32_t{2}}),
                                    GgufValue::array(GgufType::STRING, {"x"})}));
  w.set("empty", GgufValue::array(GgufType::UINT8, {}));
  return w;
}

TEST(Gguf, WriteReadIdentity) {
  test::TempDir dir;
  GgufWriter w = sample_writer();
  std::vector<float> a(64 * 3);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f;
  std::vector<uint8_t> q8(dtype_bytes(DType::Q8_0, 64 * 2), 7);
  w.add_tensor("a", DType::F32, {64, 3}, a.data());
  w.add_tensor("b.q8", DType::Q8_0, {64, 2}, q8);
  w.add_tensor("c", DType::F16, {5}, std::vector<uint8_t>(10, 1));
  w.write(dir / "x.gguf");

  const GgufFile f = GgufFile::open(dir / "x.gguf");
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.metadata().size(), 16u);
  EXPECT_EQ(f.get<std::string>("general.architecture"), "llama");
  EXPECT_EQ(f.get<uint8_t>("u8"), 200);
  EXPECT_EQ(f.get<int8_t>("i8"), -5);
  EXPECT_EQ(f.get<uint16_t>("u16"), 60000);
  EXPECT_EQ(f.get<int16_t>("i16"), -30000);
  EXPECT_EQ(f.get<uint32_t>("u32"), 4000000000u);
  EXPECT_EQ(f.get<int32_t>("i32"), -7);
  EXPECT_EQ(f.get<float>("f32"), 1.5f);
  EXPECT_EQ(f.get<bool>("flag"), true);
  EXPECT_EQ(f.get<uint64_t>("u64"), uint64_t{1} << 60);
  EXPECT_EQ(f.get<int64_t>("i64"), int64_t{-1} << 60);
  EXPECT_EQ(f.get<double>("f64"), 2.25);
  EXPECT_EQ(f.get_array<std::string>("strings"), (std::vector<std::string>{"a", "", "héllo"}));
  EXPECT_EQ(f.get_array<float>("floats"), (std::vector<float>{1.0f, 2.0f}));
  const auto& nested = f.get<GgufArray>("nested");
  ASSERT_EQ(nested.items.size(), 2u);
  EXPECT_EQ(std::get<int32_t>(std::get<GgufArray>(nested.items[0].v).items[1].v), 2);
  EXPECT_EQ(f.find("nested")->type_name(), "array[array[int32]]");
  EXPECT_EQ(f.get_int("u32"), 4000000000);
  EXPECT_EQ(f.get_int("i8"), -5);

  ASSERT_EQ(f.tensors().size(), 3u);
  const GgufTensorInfo* ta = f.find_tensor("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{64, 3}));
  EXPECT_EQ(ta->n_bytes, a.size() * 4);
  EXPECT_EQ(std::memcmp(ta->data, a.data(), ta->n_bytes), 0);
  const GgufTensorInfo* tb = f.find_tensor("b.q8");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->type, DType::Q8_0);
  EXPECT_EQ(tb->n_bytes, 68u * 2);
  EXPECT_EQ((f.data_offset() + tb->offset) % 32, 0u);
  EXPECT_EQ(tb->data[0], 7);
  EXPECT_EQ(f.find_tensor("c")->n_elements, 5);

  // Rewriting what was read gives the same bytes.
  GgufWriter w2 = GgufWriter::from(f);
  for (const auto& t : f.tensors()) w2.add_tensor(t.name, t.type, t.shape, t.data);
  EXPECT_EQ(w2.to_bytes(), test::read_bytes(dir / "x.gguf"));
}

TEST(Gguf, TypedAccessorErrorsNameKeyAndTypes) {
  const auto bytes = sample_writer().to_bytes();
  const GgufFile f = GgufFile::from_memory(bytes, "m.gguf");
  try {
    (void)f.get<uint32_t>("general.architecture");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "m.gguf: metadata key 'general.architecture': expected uint32, found string");
  }
  try {
    (void)f.get<uint32_t>("llama.block_count");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "m.gguf: metadata key 'llama.block_count' is missing (expected uint32)");
  }
  EXPECT_THROW((void)f.get_array<int32_t>("strings"), Error);
  EXPECT_THROW((void)f.get_int("f32"), Error);
  EXPECT_EQ(f.get_or<uint32_t>("nope", 9u), 9u);
}

TEST(Gguf, VersionTwoIsValid) {
  GgufWriter w = sample_writer();
  w.set_version(2);
  w.add_tensor("t", DType::F32, {4}, std::vector<uint8_t>(16, 0));
  const auto bytes = w.to_bytes();
  const GgufFile f = GgufFile::from_memory(bytes);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.tensors().size(), 1u);
}

TEST(Gguf, CustomAlignment) {
  GgufWriter w(64);
  w.add_tensor("t1", DType::F32, {3}, std::vector<uint8_t>(12, 1));
  w.add_tensor("t2", DType::F32, {3}, std::vector<uint8_t>(12, 2));
  const auto bytes = w.to_bytes();
  const GgufFile f = GgufFile::from_memory(bytes);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.find_tensor("t2")->offset, 64u);
  EXPECT_EQ(f.find_tensor("t2")->data[0], 2);
}

TEST(Gguf, WriterRejectsBadTensors) {
  GgufWriter w;
  EXPECT_THROW(w.add_tensor("q", DType::Q4_0, {33}, std::vector<uint8_t>(18, 0)), Error);
  EXPECT_THROW(w.add_tensor("q", DType::F32, {4}, std::vector<uint8_t>(15, 0)), Error);
  w.add_tensor("q", DType::F32, {4}, std::vector<uint8_t>(16, 0));
  EXPECT_THROW(w.add_tensor("q", DType::F32, {4}, std::vector<uint8_t>(16, 0)), Error);
  EXPECT_THROW(GgufWriter(48), Error);
}

TEST(Gguf, WriteIsAtomicAndProtectsItsInput) {
  test::TempDir dir;
  GgufWriter w = sample_writer();
  w.add_tensor("t", DType::F32, {4}, std::vector<uint8_t>(16, 3));
  w.write(dir / "in.gguf");
  const auto before = test::read_bytes(dir / "in.gguf");
  const GgufFile in = GgufFile::open(dir / "in.gguf");
  GgufWriter w2 = GgufWriter::from(in);
  w2.set("extra", GgufValue(uint32_t{1}));
  try {
    w2.write(dir / "in.gguf");
    FAIL() << "overwrote its input";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refusing to overwrite the input"), std::string::npos);
  }
  // Also through another spelling of the same path.
  EXPECT_THROW(w2.write(dir.path() / "." / "in.gguf"), Error);
  EXPECT_EQ(test::read_bytes(dir / "in.gguf"), before);
  // A failing write (no such folder) leaves nothing behind.
  EXPECT_THROW(w2.write(dir / "missing-dir" / "out.gguf"), Error);
  // No temporary files are left in the folder after a successful write either.
  w2.write(dir / "out.gguf");
  int n_files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++n_files;
  }
  EXPECT_EQ(n_files, 2);
  EXPECT_EQ(GgufFile::open(dir / "out.gguf").get<uint32_t>("extra"), 1u);
}

TEST(Gguf, OpenErrors) {
  test::TempDir dir;
  EXPECT_THROW(GgufFile::open(dir / "nope.gguf"), Error);
  EXPECT_THROW(GgufFile::open(dir.path()), Error);  // a folder
  test::write_bytes(dir / "empty.gguf", {});
  try {
    GgufFile::open(dir / "empty.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too small"), std::string::npos) << e.what();
  }
}

TEST(Gguf, ReadsTheSharedModels) {
  const auto dir = test::data_dir() / "models";  // committed: no skip
  const GgufFile f = GgufFile::open(dir / "stories260K.gguf");
  EXPECT_EQ(f.get<std::string>("general.architecture"), "llama");
  EXPECT_EQ(f.get<uint32_t>("llama.block_count"), 5u);
  EXPECT_EQ(f.find_tensor("token_embd.weight")->shape, (std::vector<int64_t>{64, 512}));
  const GgufFile h = GgufFile::open(dir / "stories260K-f16.gguf");
  EXPECT_EQ(h.find_tensor("blk.0.attn_q.weight")->type, DType::F16);
}

}  // namespace
}  // namespace barata
