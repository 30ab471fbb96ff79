// Model sources for `barata quantize`: a GGUF of any readable type or a
// Hugging Face checkpoint directory, seen the same way — GGUF metadata plus a
// list of tensors in GGUF naming and ggml shape order, each loaded to fp32 on
// demand (one tensor in memory at a time).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "barata/gguf.h"

namespace barata {

struct SourceTensor {
  std::string name;                          // GGUF name: "blk.3.attn_q.weight"
  std::vector<int64_t> shape;                // ggml order: shape[0] is the row length
  std::string source_type;                   // as stored in the source: "Q4_1", "BF16", "F32"
  std::function<std::vector<float>()> load;  // the values, row-major, fp32

  int64_t n_elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct SourceModel {
  std::string description;  // "GGUF file X" / "Hugging Face checkpoint X"
  std::vector<std::pair<std::string, GgufValue>> metadata;  // GGUF keys, in order
  std::vector<SourceTensor> tensors;
  std::vector<std::filesystem::path> inputs;  // files read (never overwritten)
  std::shared_ptr<void> keep_alive;           // mappings the loaders read from
};

// A GGUF file: metadata as it is (minus keys a re-quantized file must not
// carry over: general.file_type and barata.quant.*), tensors dequantized.
SourceModel load_gguf_source(const std::filesystem::path& path);

// A Hugging Face checkpoint directory: config.json, *.safetensors (one file or
// an index with shards), tokenizer.json (+ tokenizer_config.json when present).
// Architectures: LlamaForCausalLM -> llama (q/k rows permuted to llama.cpp's
// rotary layout), Qwen2ForCausalLM -> qwen2. Errors name the file and the key.
SourceModel load_hf_checkpoint(const std::filesystem::path& dir);

// Refuses (barata::Error) a source that would convert to a file barata
// cannot load: the hyperparameters out of range, a tensor missing or of the
// wrong shape (load_hf_checkpoint calls it before returning).
void check_source_layout(const SourceModel& m);

// Either of the above, chosen by whether `path` is a directory.
SourceModel load_source(const std::filesystem::path& path);

}  // namespace barata
