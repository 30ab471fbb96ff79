// GgufFile: validates every count, length, type and offset against the file
// before trusting it, so a truncated or hostile file is one clear error.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/gguf.h"
#include "mapped_file.h"

namespace barata {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian uint32
constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;  // nested arrays deeper than this are hostile

// Smallest encoding of one value of each type: bounds counts before allocating.
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::UINT8:
    case GgufType::INT8:
    case GgufType::BOOL:
      return 1;
    case GgufType::UINT16:
    case GgufType::INT16:
      return 2;
    case GgufType::UINT32:
    case GgufType::INT32:
    case GgufType::FLOAT32:
      return 4;
    case GgufType::UINT64:
    case GgufType::INT64:
    case GgufType::FLOAT64:
    case GgufType::STRING:
      return 8;
    case GgufType::ARRAY:
      return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::FLOAT64);
}

// Reads little-endian fields with a bounds check on every read; errors carry
// the file name, what was being read and the byte position.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> b, const std::string& name) : b_(b), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return b_.size() - pos_; }

  template <typename T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const std::string& what) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>(what + " length");
    if (len > remaining())
      fail("{}: {}: string length {} at byte {} runs past the end of the file ({} bytes)", name_,
           what, len, at, b_.size());
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  void need(uint64_t n, const std::string& what) const {
    if (n > remaining())
      fail("{}: {}: needs {} bytes at byte {} but the file ends at {} (truncated?)", name_, what, n,
           pos_, b_.size());
  }

 private:
  std::span<const uint8_t> b_;
  const std::string& name_;
  uint64_t pos_ = 0;
};

GgufValue read_value(Cursor& c, GgufType t, const std::string& what, const std::string& file,
                     int depth);

GgufValue read_array(Cursor& c, const std::string& what, const std::string& file, int depth) {
  if (depth >= kMaxArrayDepth)
    fail("{}: {}: arrays nested deeper than {}", file, what, kMaxArrayDepth);
  const uint64_t at = c.pos();
  const auto et = c.read<uint32_t>(what + " array element type");
  if (!valid_type(et)) fail("{}: {}: invalid array element type {} at byte {}", file, what, et, at);
  const auto elem = static_cast<GgufType>(et);
  const auto n = c.read<uint64_t>(what + " array length");
  if (n > c.remaining() / min_value_bytes(elem))
    fail("{}: {}: array of {} {} at byte {} cannot fit in the {} bytes left", file, what, n,
         gguf_type_name(elem), at, c.remaining());
  GgufArray a;
  a.elem_type = elem;
  a.items.reserve(n);
  for (uint64_t i = 0; i < n; ++i) a.items.push_back(read_value(c, elem, what, file, depth + 1));
  return GgufValue(std::move(a));
}

GgufValue read_value(Cursor& c, GgufType t, const std::string& what, const std::string& file,
                     int depth) {
  switch (t) {
    case GgufType::UINT8:
      return c.read<uint8_t>(what);
    case GgufType::INT8:
      return c.read<int8_t>(what);
    case GgufType::UINT16:
      return c.read<uint16_t>(what);
    case GgufType::INT16:
      return c.read<int16_t>(what);
    case GgufType::UINT32:
      return c.read<uint32_t>(what);
    case GgufType::INT32:
      return c.read<int32_t>(what);
    case GgufType::FLOAT32:
      return c.read<float>(what);
    case GgufType::UINT64:
      return c.read<uint64_t>(what);
    case GgufType::INT64:
      return c.read<int64_t>(what);
    case GgufType::FLOAT64:
      return c.read<double>(what);
    case GgufType::BOOL: {
      const uint64_t at = c.pos();
      const auto b = c.read<uint8_t>(what);
      if (b > 1) fail("{}: {}: bool value {} at byte {} is neither 0 nor 1", file, what, b, at);
      return b == 1;
    }
    case GgufType::STRING:
      return c.read_string(what);
    case GgufType::ARRAY:
      return read_array(c, what, file, depth);
  }
  fail("{}: {}: invalid value type {}", file, what, static_cast<uint32_t>(t));
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8:
      return "uint8";
    case GgufType::INT8:
      return "int8";
    case GgufType::UINT16:
      return "uint16";
    case GgufType::INT16:
      return "int16";
    case GgufType::UINT32:
      return "uint32";
    case GgufType::INT32:
      return "int32";
    case GgufType::FLOAT32:
      return "float32";
    case GgufType::BOOL:
      return "bool";
    case GgufType::STRING:
      return "string";
    case GgufType::ARRAY:
      return "array";
    case GgufType::UINT64:
      return "uint64";
    case GgufType::INT64:
      return "int64";
    case GgufType::FLOAT64:
      return "float64";
  }
  return "invalid";
}

GgufValue GgufValue::array(GgufType elem_type, std::vector<GgufValue> items) {
  GgufArray a;
  a.elem_type = elem_type;
  a.items = std::move(items);
  return GgufValue(std::move(a));
}

std::string GgufValue::type_name() const {
  if (const auto* a = std::get_if<GgufArray>(&v)) {
    std::string inner = a->items.empty() ? gguf_type_name(a->elem_type) : a->items[0].type_name();
    return "array[" + inner + "]";
  }
  return gguf_type_name(type());
}

std::optional<int64_t> GgufValue::as_int() const {
  return std::visit(
      [](const auto& x) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return static_cast<int64_t>(x);
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<int64_t>(x);
        } else {
          return std::nullopt;
        }
      },
      v);
}

std::optional<double> GgufValue::as_double() const {
  if (const auto* f = std::get_if<float>(&v)) return *f;
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (auto i = as_int()) return static_cast<double>(*i);
  return std::nullopt;
}

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile f;
  f.name_ = path.string();
  f.map_ = std::make_unique<MappedFile>(path);
  f.bytes_ = f.map_->bytes();
  f.parse();
  return f;
}

GgufFile GgufFile::from_memory(std::span<const uint8_t> bytes, std::string name) {
  GgufFile f;
  f.name_ = std::move(name);
  f.bytes_ = bytes;
  f.parse();
  return f;
}

GgufFile GgufFile::from_parts(std::string name,
                              std::vector<std::pair<std::string, GgufValue>> metadata,
                              std::vector<GgufTensorInfo> tensors) {
  GgufFile f;
  f.name_ = std::move(name);
  for (auto& [key, value] : metadata) {
    if (f.kv_index_.count(key)) fail("{}: duplicate metadata key '{}'", f.name_, printable(key));
    f.kv_index_.emplace(key, f.kv_.size());
    f.kv_.emplace_back(std::move(key), std::move(value));
  }
  for (auto& t : tensors) {
    if (f.tensor_index_.count(t.name))
      fail("{}: duplicate tensor name '{}'", f.name_, printable(t.name));
    t.data = nullptr;
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }
  return f;
}

void GgufFile::parse() {
  const std::string& file = name_;
  if (bytes_.size() < 24)
    fail("{}: {} bytes is too small to be a GGUF file (the header alone is 24)", file,
         bytes_.size());
  Cursor c(bytes_, name_);
  const auto magic = c.read<uint32_t>("magic");
  if (magic != kMagic) {
    const auto* m = bytes_.data();
    fail(
        "{}: not a GGUF file: magic is {:02x} {:02x} {:02x} {:02x}, expected 47 47 55 46 "
        "(\"GGUF\")",
        file, m[0], m[1], m[2], m[3]);
  }
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    if (version_ != 0 && (version_ & 0xffff) == 0)
      fail("{}: version {} looks byte-swapped: big-endian GGUF files are not supported", file,
           __builtin_bswap32(version_));
    fail("{}: unsupported GGUF version {} (barata reads versions 2 and 3)", file, version_);
  }
  const auto n_tensors = c.read<uint64_t>("tensor count");
  const auto n_kv = c.read<uint64_t>("metadata count");
  // Each tensor info takes at least 8 (name length) + 4 (n_dims) + 8 (one dim)
  // + 4 (type) + 8 (offset) bytes; each key-value at least 8 + 4 + 1.
  if (n_tensors > c.remaining() / 32)
    fail("{}: tensor count {} cannot fit in a file of {} bytes (truncated or corrupt)", file,
         n_tensors, bytes_.size());
  if (n_kv > c.remaining() / 13)
    fail("{}: metadata count {} cannot fit in a file of {} bytes (truncated or corrupt)", file,
         n_kv, bytes_.size());

  kv_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string where = fmt::format("metadata entry #{}", i);
    std::string key = c.read_string(where + " key");
    const std::string what = fmt::format("metadata key '{}'", printable(key));
    const uint64_t at = c.pos();
    const auto t = c.read<uint32_t>(what + " value type");
    if (!valid_type(t)) fail("{}: {}: invalid value type {} at byte {}", file, what, t, at);
    GgufValue v = read_value(c, static_cast<GgufType>(t), what, file, 0);
    if (kv_index_.count(key)) fail("{}: duplicate metadata key '{}'", file, printable(key));
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    const auto* u = std::get_if<uint32_t>(&a->v);
    if (u == nullptr) fail("{}: general.alignment must be uint32, found {}", file, a->type_name());
    if (*u == 0 || (*u & (*u - 1)) != 0)
      fail("{}: general.alignment {} is not a power of two", file, *u);
    alignment_ = *u;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo ti;
    const uint64_t info_at = c.pos();
    ti.name = c.read_string(fmt::format("tensor info #{} name", i));
    const std::string what =
        fmt::format("tensor #{} '{}' (info at byte {})", i, printable(ti.name), info_at);
    const uint64_t dims_at = c.pos();
    const auto n_dims = c.read<uint32_t>(what + " n_dims");
    if (n_dims == 0 || n_dims > kMaxDims)
      fail("{}: {}: n_dims at byte {} is {}, expected 1 to {}", file, what, dims_at, n_dims,
           kMaxDims);
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto dim = c.read<uint64_t>(what + " dimension");
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("{}: {}: dimension {} is {}, expected 1 to 2^63-1", file, what, d, dim);
      if (mul_overflows(n_elements, dim, n_elements) ||
          n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail("{}: {}: the product of the dimensions overflows 64 bits", file, what);
      ti.shape.push_back(static_cast<int64_t>(dim));
    }
    ti.n_elements = static_cast<int64_t>(n_elements);
    const uint64_t at = c.pos();
    const auto type_id = c.read<uint32_t>(what + " type");
    const DTypeTraits* tr = find_dtype(type_id);
    if (tr == nullptr)
      fail("{}: {}: unknown tensor type id {} at byte {}", file, what, type_id, at);
    ti.type = tr->type;
    if (ti.shape[0] % tr->block_size != 0)
      fail("{}: {}: row length {} is not a multiple of the {} block size {}", file, what,
           ti.shape[0], tr->name, tr->block_size);
    const auto n_bytes = checked_tensor_bytes(ti.type, ti.shape);
    if (!n_bytes) fail("{}: {}: byte size overflows 64 bits", file, what);
    ti.n_bytes = *n_bytes;
    ti.offset = c.read<uint64_t>(what + " offset");
    if (ti.offset % alignment_ != 0)
      fail("{}: {}: data offset {} is not a multiple of the alignment {}", file, what, ti.offset,
           alignment_);
    if (tensor_index_.count(ti.name)) fail("{}: {}: duplicate tensor name", file, what);
    tensor_index_.emplace(ti.name, tensors_.size());
    tensors_.push_back(std::move(ti));
  }

  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t size = bytes_.size();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensorInfo& ti = tensors_[i];
    // Compared without forming begin + n_bytes, which may wrap around.
    const uint64_t room = size > data_offset_ ? size - data_offset_ : 0;
    if (ti.offset > room || ti.n_bytes > room - ti.offset)
      fail(
          "{}: tensor #{} '{}': {} bytes of data at offset {} of the data section (which starts "
          "at byte {}) run past the end of the file ({} bytes)",
          file, i, printable(ti.name), ti.n_bytes, ti.offset, data_offset_, size);
    ti.data = bytes_.data() + data_offset_ + ti.offset;
  }
  // No writer lays two tensors over the same bytes; a file that does is
  // corrupt or crafted (a write through one would change the other), so it
  // is refused, naming both.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors_[a].offset != tensors_[b].offset ? tensors_[a].offset < tensors_[b].offset
                                                    : a < b;
  });
  for (size_t j = 1; j < order.size(); ++j) {
    const GgufTensorInfo& prev = tensors_[order[j - 1]];
    const GgufTensorInfo& cur = tensors_[order[j]];
    if (cur.offset < prev.offset + prev.n_bytes)  // no overflow: both end inside the file
      fail(
          "{}: tensor #{} '{}' (data [{}, {})) overlaps tensor #{} '{}' (data [{}, {})) in the "
          "data section",
          file, order[j], printable(cur.name), cur.offset, cur.offset + cur.n_bytes, order[j - 1],
          printable(prev.name), prev.offset, prev.offset + prev.n_bytes);
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(std::string(key));
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::type_error(std::string_view key, const char* expected, const GgufValue& v) const {
  if (find(key) == nullptr)
    fail("{}: metadata key '{}' is missing (expected {})", name_, key, expected);
  fail("{}: metadata key '{}': expected {}, found {}", name_, key, expected, v.type_name());
}

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) fail("{}: metadata key '{}' is missing (expected an integer)", name_, key);
  auto i = v->as_int();
  if (!i) fail("{}: metadata key '{}': expected an integer, found {}", name_, key, v->type_name());
  return *i;
}

std::optional<int64_t> GgufFile::get_int_opt(std::string_view key) const {
  return has(key) ? std::optional<int64_t>(get_int(key)) : std::nullopt;
}

std::optional<double> GgufFile::get_number_opt(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  auto d = v->as_double();
  if (!d) fail("{}: metadata key '{}': expected a number, found {}", name_, key, v->type_name());
  return d;
}

}  // namespace barata
