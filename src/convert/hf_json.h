// Shared pieces of the Hugging Face checkpoint reader (hf_checkpoint.cpp,
// hf_tokenizer.cpp).
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "barata/gguf.h"

namespace barata::hf {

using Metadata = std::vector<std::pair<std::string, GgufValue>>;

// Parses a JSON file; a missing, special (FIFO), oversized or malformed file
// is an error naming it.
nlohmann::json read_json(const std::filesystem::path& path);

[[noreturn]] void throw_json_error(const std::filesystem::path& file,
                                   const nlohmann::json::exception& e);

// Runs f, turning any nlohmann::json exception (a value of the wrong type
// deep in a file) into a barata::Error that names the file.
template <typename F>
auto with_json_errors(const std::filesystem::path& file, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const nlohmann::json::exception& e) {
    throw_json_error(file, e);
  }
}

// The tokenizer keys (tokenizer.ggml.*, tokenizer.chat_template) from
// tokenizer.json, tokenizer_config.json (when present) and config.json, the
// files read appended to `inputs`.
void add_tokenizer_metadata(const std::filesystem::path& dir, const nlohmann::json& config,
                            Metadata& md, std::vector<std::filesystem::path>& inputs);

}  // namespace barata::hf
