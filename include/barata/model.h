// A loaded model: its config and typed views of every weight, each bound to a
// matmul kernel at load time.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "barata/gguf.h"
#include "barata/matmul.h"
#include "barata/model_config.h"

namespace barata {

struct LayerWeights {
  std::vector<float> attn_norm;   // (d_model)
  WeightView wq;                  // (n_head * head_dim rows, d_model)
  WeightView wk;                  // (n_head_kv * head_dim rows, d_model)
  WeightView wv;                  // (n_head_kv * head_dim rows, d_model)
  WeightView wo;                  // (d_model rows, n_head * head_dim)
  std::vector<float> bq, bk, bv;  // (rows of wq / wk / wv), qwen2 only; empty otherwise
  std::vector<float> ffn_norm;    // (d_model)
  WeightView w_gate;              // (d_ff rows, d_model)
  WeightView w_up;                // (d_ff rows, d_model)
  WeightView w_down;              // (d_model rows, d_ff)
};

class Model {
 public:
  // Opens, validates and binds. Errors name the tensor, the expected and the
  // actual shape or type.
  static Model load(const std::filesystem::path& path);
  static Model from_gguf(GgufFile file);
  // Every check of from_gguf on a layout with no data (GgufFile::from_parts):
  // the config's ranges and every tensor's presence and shape, for a file
  // about to be written.
  static void check_layout(GgufFile layout);

  const ModelConfig& config() const { return cfg_; }
  const GgufFile& file() const { return file_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const WeightView& token_embd() const { return token_embd_; }  // (n_vocab rows, d_model)
  const WeightView& output() const {
    return output_;
  }  // (n_vocab rows, d_model); token_embd when tied
  const std::vector<float>& output_norm() const { return output_norm_; }  // (d_model)

  // Row `token` of the embedding table as floats (any dtype).
  void embed(int32_t token, float* out) const;
  int64_t weight_bytes() const;  // bytes of every matrix a decode step reads

 private:
  explicit Model(GgufFile f) : file_(std::move(f)) {}
  GgufFile file_;
  ModelConfig cfg_;
  std::vector<LayerWeights> layers_;
  WeightView token_embd_{}, output_{};
  std::vector<float> output_norm_;
};

}  // namespace barata
