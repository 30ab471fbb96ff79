#include "convert/safetensors.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/half.h"
#include "mapped_file.h"

namespace barata {

using nlohmann::json;

size_t safetensors_dtype_size(std::string_view dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = path.string();
  f->map_ = std::make_unique<MappedFile>(path);
  f->bytes_ = f->map_->bytes();
  f->parse();
  return f;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::from_memory(std::span<const uint8_t> bytes,
                                                              std::string name) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->name_ = std::move(name);
  f->bytes_ = bytes;
  f->parse();
  return f;
}

SafetensorsFile::~SafetensorsFile() = default;

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

// A non-negative JSON integer, or fails naming the file, tensor and field.
uint64_t json_u64(const json& v, const std::string& file, const std::string& tensor,
                  const char* field) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  fail("{}: tensor '{}': {} holds {}, expected a non-negative integer", file, tensor, field,
       v.dump());
}

}  // namespace

void SafetensorsFile::parse() {
  const std::string& file = name_;
  if (bytes_.size() < 8)
    fail("{}: {} bytes is too short for a safetensors header (8-byte length first)", file,
         bytes_.size());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes_[static_cast<size_t>(i)];
  if (n > bytes_.size() - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", file, n, bytes_.size());
  const auto* begin = reinterpret_cast<const char*>(bytes_.data() + 8);
  json header;
  try {
    header = json::parse(begin, begin + n);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", file, e.what());
  }
  if (!header.is_object()) fail("{}: header is not a JSON object", file);
  const uint64_t data_size = bytes_.size() - 8 - n;
  const uint8_t* data = bytes_.data() + 8 + n;

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("{}: __metadata__ is not a JSON object", file);
      continue;
    }
    if (!entry.is_object()) fail("{}: tensor '{}': entry is not a JSON object", file, name);
    SafetensorsTensor t;
    t.name = name;
    const auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) fail("{}: tensor '{}': no dtype string", file, name);
    t.dtype = dt->get<std::string>();
    const size_t elem = safetensors_dtype_size(t.dtype);
    if (elem == 0)
      fail("{}: tensor '{}': unsupported dtype '{}' (supported: F32, F16, BF16)", file, name,
           t.dtype);
    const auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) fail("{}: tensor '{}': no shape array", file, name);
    uint64_t count = 1;
    for (const auto& d : *sh) {
      const uint64_t v = json_u64(d, file, name, "shape");
      if (v > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(count, v, &count))
        fail("{}: tensor '{}': shape {} overflows", file, name, sh->dump());
      t.shape.push_back(static_cast<int64_t>(v));
    }
    uint64_t want = 0;
    if (count > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(count, elem, &want))
      fail("{}: tensor '{}': shape {} overflows", file, name, sh->dump());
    t.n_elements = static_cast<int64_t>(count);
    const auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2)
      fail("{}: tensor '{}': data_offsets is not a [begin, end] pair", file, name);
    const uint64_t b = json_u64((*off)[0], file, name, "data_offsets");
    const uint64_t e = json_u64((*off)[1], file, name, "data_offsets");
    if (b > e || e > data_size)
      fail("{}: tensor '{}': data_offsets [{}, {}] outside the {}-byte data section", file, name, b,
           e, data_size);
    if (e - b != want)
      fail("{}: tensor '{}': data_offsets [{}, {}] hold {} bytes, but {} {} needs {}", file, name,
           b, e, e - b, sh->dump(), t.dtype, want);
    t.data = data + b;
    t.n_bytes = want;
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsTensor& x, const SafetensorsTensor& y) { return x.data < y.data; });
}

std::vector<float> safetensors_to_f32(const SafetensorsTensor& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements));
  if (t.dtype == "F32") {
    std::memcpy(out.data(), t.data, t.n_bytes);
    return out;
  }
  const bool bf16 = t.dtype == "BF16";
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, t.data + 2 * i, 2);  // the data need not be aligned
    out[i] = bf16 ? bf16_to_fp32(h) : fp16_to_fp32(h);
  }
  return out;
}

}  // namespace barata
