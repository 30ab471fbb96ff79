// A validating, memory-mapping reader of safetensors files.
//
// Format facts (huggingface/safetensors README): an 8-byte little-endian u64
// header length N, then N bytes of JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (plus an optional
// "__metadata__" object of strings), then the data; offsets count from the end
// of the header. Tensors are stored row-major, C order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace barata {

class MappedFile;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // "F32", "F16" or "BF16" (others are rejected)
  std::vector<int64_t> shape;  // as stored: shape[0] is the outermost dimension
  int64_t n_elements = 0;
  const uint8_t* data = nullptr;  // inside the mapping
  uint64_t n_bytes = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates; throws barata::Error naming the file and the tensor/key.
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  // Validates a buffer the caller keeps alive (tests).
  static std::shared_ptr<SafetensorsFile> from_memory(std::span<const uint8_t> bytes,
                                                      std::string name);
  ~SafetensorsFile();

  const std::string& name() const { return name_; }
  // In order of their data offsets.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  void parse();

  std::string name_;
  std::unique_ptr<MappedFile> map_;
  std::span<const uint8_t> bytes_;
  std::vector<SafetensorsTensor> tensors_;
};

// Bytes per element of a supported dtype, 0 for anything else.
size_t safetensors_dtype_size(std::string_view dtype);

// The values as fp32 (exact for F16 and BF16), row-major.
std::vector<float> safetensors_to_f32(const SafetensorsTensor& t);

}  // namespace barata
