// A read-only memory mapping of a whole file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>

namespace barata {

class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);  // throws barata::Error
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace barata
