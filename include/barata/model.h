// A loaded model: its config and a device-neutral description of every
// weight (type, shape, row bytes, scale, host bytes). Kernels are bound by a
// backend (include/barata/backend.h), never here.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "barata/gguf.h"
#include "barata/dtype.h"
#include "barata/model_config.h"

namespace barata {

// A weight matrix: n_rows rows of k elements, ggml layout (rows contiguous),
// still in the file's mapping. id numbers the model's matrices 0..n-1, so a
// backend can keep its own per-weight state in a vector.
struct WeightDesc {
  int id = -1;
  DType type = DType::F32;
  int64_t k = 0;       // row length (input features)
  int64_t n_rows = 0;  // output features
  size_t row_bytes = 0;
  float scale = 1.0f;  // the matrix's one scale (per-tensor types), applied after the dot
  const uint8_t* data = nullptr;  // the first row (after any tensor header); null in check_layout
  int64_t bytes() const { return static_cast<int64_t>(row_bytes) * n_rows; }
};

struct LayerWeights {
  std::vector<float> attn_norm;       // (d_model)
  WeightDesc wq;                      // (n_head * head_dim rows, d_model)
  WeightDesc wk;                      // (n_head_kv * head_dim rows, d_model)
  WeightDesc wv;                      // (n_head_kv * head_dim rows, d_model)
  WeightDesc wo;                      // (d_model rows, n_head * head_dim)
  std::vector<float> bq, bk, bv;      // (rows of wq / wk / wv) when the file has them; else empty
  std::vector<float> q_norm, k_norm;  // (head_dim) per-head RMSNorm gains (qwen3); else empty
  std::vector<float> attn_post_norm, ffn_post_norm;  // (d_model) gemma3; else empty
  std::vector<float> ffn_norm;                       // (d_model)
  WeightDesc w_gate;                                 // (d_ff rows, d_model)
  WeightDesc w_up;                                   // (d_ff rows, d_model)
  WeightDesc w_down;                                 // (d_model rows, d_ff)
  // A mixture-of-experts layer (ModelConfig::moe(); w_gate, w_up and w_down
  // are then unset): the router and each expert's matrices, expert e's rows
  // of the 3-D ffn_{gate,up,down}_exps tensors as a matrix of its own.
  WeightDesc router;                                      // ffn_gate_inp (n_expert rows, d_model)
  std::vector<WeightDesc> gate_exps, up_exps, down_exps;  // [n_expert]: (d_ff_exp, d_model) ...
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
  const WeightDesc& token_embd() const { return token_embd_; }  // (n_vocab rows, d_model)
  const WeightDesc& output() const {
    return output_;
  }  // (n_vocab rows, d_model); token_embd when tied
  const std::vector<float>& output_norm() const { return output_norm_; }  // (d_model)

  // Row `token` of the embedding table as floats (any dtype).
  void embed(int32_t token, float* out) const;
  // Bytes of the matrices one decode token reads: every matrix of a dense
  // model; a mixture of experts' router and expert_used_count of its
  // experts per layer (the active bytes).
  int64_t weight_bytes() const;
  int64_t total_weight_bytes() const;  // every matrix (what memory holds)
  // Every distinct matrix, indexed by WeightDesc::id (a tied output is the embedding).
  std::vector<const WeightDesc*> matrices() const;
  int n_matrices() const { return n_matrices_; }

 private:
  explicit Model(GgufFile f) : file_(std::move(f)) {}
  void number_matrices();
  GgufFile file_;
  ModelConfig cfg_;
  std::vector<LayerWeights> layers_;
  WeightDesc token_embd_{}, output_{};
  std::vector<float> output_norm_;
  int n_matrices_ = 0;
};

}  // namespace barata
