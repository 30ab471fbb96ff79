// How fuzz_hf_checkpoint cuts one input into the files of a checkpoint
// directory (shared with the seed writer): parts separated by kSeparator, in
// the order of kHfFiles; absent parts are absent files.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace barata::fuzz {

inline constexpr std::string_view kSeparator = "\n#barata-fuzz-file#\n";

inline constexpr std::array<const char*, 5> kHfFiles = {
    "config.json", "tokenizer.json", "model.safetensors", "tokenizer_config.json",
    "model.safetensors.index.json"};
// With an index present, the safetensors part is also written under this name.
inline constexpr const char* kHfShard = "model-00001-of-00001.safetensors";

inline std::vector<std::string_view> split(const uint8_t* data, size_t size) {
  std::vector<std::string_view> parts;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (true) {
    const size_t at = rest.find(kSeparator);
    if (at == std::string_view::npos) {
      parts.push_back(rest);
      return parts;
    }
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kSeparator.size());
  }
}

inline std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += kSeparator;
    out += parts[i];
  }
  return out;
}

}  // namespace barata::fuzz
