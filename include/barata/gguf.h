// GGUF container: a validating, memory-mapping reader and an atomic writer.
// Format facts (little-endian, versions 2 and 3): llama.cpp docs/gguf.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <variant>
#include <vector>

#include "barata/dtype.h"

namespace barata {

enum class GgufType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
const char* gguf_type_name(GgufType t);  // "uint32", "string", ...

struct GgufValue;
struct GgufArray {
  GgufType elem_type = GgufType::UINT8;
  std::vector<GgufValue> items;
};

// One metadata value. The variant index equals the GgufType id.
struct GgufValue {
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, GgufArray, uint64_t, int64_t, double>;
  Storage v;

  GgufValue() = default;
  template <typename T>
  requires(!std::is_same_v<std::decay_t<T>, GgufValue> && std::is_constructible_v<Storage, T>)
      GgufValue(T x)
      : v(std::move(x)) {}  // NOLINT: implicit by design
  GgufValue(const char* s) : v(std::string(s)) {}
  static GgufValue array(GgufType elem_type, std::vector<GgufValue> items);

  GgufType type() const { return static_cast<GgufType>(v.index()); }
  std::string type_name() const;  // "uint32", "array[string]"
  template <typename T>
  bool holds() const {
    return std::holds_alternative<T>(v);
  }
  // Any integer type widened to int64 (uint64 above INT64_MAX is nullopt).
  std::optional<int64_t> as_int() const;
  // Any numeric type as double.
  std::optional<double> as_double() const;
};

// A tensor as described by the file. Shape in ggml order: shape[0] is the
// row length (contiguous), shape[1] the number of rows, and so on.
struct GgufTensorInfo {
  std::string name;
  DType type;
  std::vector<int64_t> shape;  // 1..4 dims, each >= 1
  int64_t n_elements;
  uint64_t offset;  // from the start of the data section
  uint64_t n_bytes;
  const uint8_t* data;  // inside the mapping; valid while the GgufFile lives

  int64_t n_rows() const { return n_elements / shape[0]; }
};

class MappedFile;

class GgufFile {
 public:
  // Maps and validates; throws barata::Error naming the file and the problem.
  static GgufFile open(const std::filesystem::path& path);
  // Validates a buffer the caller keeps alive (fuzzing, tests).
  static GgufFile from_memory(std::span<const uint8_t> bytes, std::string name = "<memory>");
  // Metadata and tensor infos with no data (every data pointer null): the
  // layout of a file about to be written, to validate before writing it.
  static GgufFile from_parts(std::string name,
                             std::vector<std::pair<std::string, GgufValue>> metadata,
                             std::vector<GgufTensorInfo> tensors);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& name() const { return name_; }  // the path as given
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return bytes_.size(); }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed access: the stored type must be exactly T, else an error naming the
  // key, the expected and the actual type. A missing key is an error too.
  template <typename T>
  const T& get(std::string_view key) const;
  template <typename T>
  T get_or(std::string_view key, T fallback) const {
    return has(key) ? get<T>(key) : fallback;
  }
  // Any integer type, for keys whose writers disagree on width or sign.
  int64_t get_int(std::string_view key) const;
  std::optional<int64_t> get_int_opt(std::string_view key) const;
  std::optional<double> get_number_opt(std::string_view key) const;
  // An array whose elements are all T (e.g. std::string, float, int32_t).
  template <typename T>
  std::vector<T> get_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  void parse();
  [[noreturn]] void type_error(std::string_view key, const char* expected,
                               const GgufValue& v) const;

  std::string name_;
  std::unique_ptr<MappedFile> map_;
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

template <typename T>
const T& GgufFile::get(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr || !v->holds<T>())
    type_error(key, gguf_type_name(static_cast<GgufType>(GgufValue::Storage(T{}).index())),
               v ? *v : GgufValue{});
  return std::get<T>(v->v);
}

template <typename T>
std::vector<T> GgufFile::get_array(std::string_view key) const {
  const auto& a = get<GgufArray>(key);
  std::vector<T> out;
  out.reserve(a.items.size());
  for (const auto& item : a.items) {
    if (!item.holds<T>()) type_error(key, "array of the requested element type", item);
    out.push_back(std::get<T>(item.v));
  }
  return out;
}

// Writes a GGUF (version 3 unless told otherwise) atomically: a temporary file
// in the destination's folder, flushed and fsync'd, then renamed over the
// destination (barata/atomic_file.h: what a kill leaves, BARATA_NO_O_TMPFILE).
// Refuses to write over any of its protected inputs.
class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32);

  // Starts from a file's metadata; the file becomes a protected input.
  static GgufWriter from(const GgufFile& src);

  void set(const std::string& key, GgufValue value);  // replaces, keeps first position
  void remove(const std::string& key);
  // `data` must stay valid until write() returns; its size must match.
  void add_tensor(const std::string& name, DType type, std::vector<int64_t> shape,
                  const void* data);
  void add_tensor(const std::string& name, DType type, std::vector<int64_t> shape,
                  std::vector<uint8_t> owned);
  // Data made while the file is written, one tensor at a time (so a whole
  // model never sits in memory); it must return exactly the tensor's bytes.
  using Producer = std::function<std::vector<uint8_t>()>;
  void add_tensor(const std::string& name, DType type, std::vector<int64_t> shape,
                  Producer produce);
  void protect(const std::filesystem::path& input) { protected_.push_back(input); }
  void set_version(uint32_t v) { version_ = v; }  // 2 or 3

  void write(const std::filesystem::path& out) const;
  std::vector<uint8_t> to_bytes() const;  // the same bytes, in memory
  uint64_t size() const;                  // the file's size in bytes (data may be null)

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    const uint8_t* data;
    size_t n_bytes;
    std::shared_ptr<std::vector<uint8_t>> owned;
    std::shared_ptr<Producer> produce;
  };
  template <typename Sink>
  void emit(Sink& sink) const;

  uint32_t alignment_;
  uint32_t version_ = 3;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
  std::vector<std::filesystem::path> protected_;
};

}  // namespace barata
