#include "barata/model.h"

#include <unordered_set>

#include "barata/error.h"
#include "barata/file_io.h"

namespace barata {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? " x " : "") + std::to_string(s[i]);
  return out;
}

// The names of the tensors bound so far, so that a tensor the architecture
// does not use is found (refuse_unused).
using Used = std::unordered_set<std::string>;

const GgufTensorInfo& require(const GgufFile& f, const std::string& name,
                              const std::vector<int64_t>& shape, Used* used = nullptr) {
  if (used != nullptr) used->insert(name);
  const GgufTensorInfo* t = f.find_tensor(name);
  if (t == nullptr)
    fail("{}: tensor {} is missing (expected shape {})", f.name(), name, shape_str(shape));
  if (t->shape != shape)
    fail("{}: tensor {}: expected shape {}, found {} ({})", f.name(), name, shape_str(shape),
         shape_str(t->shape), dtype_name(t->type));
  return *t;
}

WeightDesc bind_matrix(const GgufFile& f, const std::string& name, int64_t k, int64_t n_rows,
                       Used* used) {
  const GgufTensorInfo& t = require(f, name, {k, n_rows}, used);
  WeightDesc w;
  w.type = t.type;
  w.k = k;
  w.n_rows = n_rows;
  w.row_bytes = row_bytes(t.type, k);
  if (t.data != nullptr) {  // null: a layout being checked (Model::check_layout)
    w.data = tensor_rows(t.type, t.data);
    w.scale = tensor_scale(t.type, t.data);
  }
  return w;
}

// Rows [r0, r0 + n) of a matrix, as a matrix of its own (the parts of a
// fused q/k/v or gate/up tensor): the same type, row length and scale.
WeightDesc row_range(const WeightDesc& w, int64_t r0, int64_t n) {
  WeightDesc v = w;
  v.n_rows = n;
  if (v.data != nullptr) v.data += static_cast<size_t>(r0) * w.row_bytes;
  return v;
}

// A 3-D tensor of n_expert matrices (ggml: k, n_rows, n_expert), each
// expert's rows a matrix of its own. A count that disagrees with the config
// names both.
std::vector<WeightDesc> bind_experts(const GgufFile& f, const ModelConfig& c,
                                     const std::string& name, int64_t k, int64_t n_rows,
                                     const std::string& rows_key, Used* used) {
  used->insert(name);
  const GgufTensorInfo* t = f.find_tensor(name);
  if (t != nullptr && t->shape.size() == 3 && t->shape[2] != c.n_expert)
    fail("{}: tensor {} holds {} experts but {}.expert_count = {}", f.name(), name, t->shape[2],
         c.arch, c.n_expert);
  if (t != nullptr && t->shape.size() == 3 && t->shape[0] == k && t->shape[1] != n_rows)
    fail("{}: tensor {} has experts of {} rows but {} = {}", f.name(), name, t->shape[1], rows_key,
         n_rows);
  const GgufTensorInfo& ti = require(f, name, {k, n_rows, c.n_expert});
  std::vector<WeightDesc> out(static_cast<size_t>(c.n_expert));
  const size_t rb = row_bytes(ti.type, k);
  for (int64_t e = 0; e < c.n_expert; ++e) {
    WeightDesc& w = out[static_cast<size_t>(e)];
    w.type = ti.type;
    w.k = k;
    w.n_rows = n_rows;
    w.row_bytes = rb;
    if (ti.data != nullptr) {
      w.data = tensor_rows(ti.type, ti.data) + static_cast<size_t>(e * n_rows) * rb;
      w.scale = tensor_scale(ti.type, ti.data);
    }
  }
  return out;
}

// 1-D tensors (norms, biases) are small: convert to float once, whatever the type.
std::vector<float> bind_vector(const GgufFile& f, const std::string& name, int64_t n, Used* used) {
  const GgufTensorInfo& t = require(f, name, {n}, used);
  std::vector<float> out(static_cast<size_t>(n));
  if (t.data != nullptr) dequantize_tensor_row(t.type, t.data, n, 0, out.data());
  return out;
}

void check_block_count(const GgufFile& f, const ModelConfig& c) {
  // Each layer needs at least its weight tensors (9, fewer where q/k/v or
  // gate/up are fused): a block count the file cannot back is refused before
  // the layers are allocated.
  const int64_t per_layer =
      9 - (c.fused_qkv ? 2 : 0) - (c.fused_gate_up ? 1 : 0) + (c.moe() ? 1 : 0);
  if (static_cast<uint64_t>(c.n_layer * per_layer) > f.tensors().size())
    fail("{}: {}.block_count = {} needs at least {} tensors but the file has {}", f.name(), c.arch,
         c.n_layer, c.n_layer * per_layer, f.tensors().size());
}

// Every tensor of the file was bound, or is one barata reads elsewhere
// (rope_freqs.weight, into the config): anything else is named, never
// silently left out of the forward pass.
void refuse_unused(const GgufFile& f, const ModelConfig& c, const Used& used) {
  std::vector<std::string> unused;
  for (const GgufTensorInfo& t : f.tensors())
    if (!used.count(t.name) && !(t.name == "rope_freqs.weight" && !c.rope_freq_factors.empty()) &&
        !((t.name == "rope_factors_long.weight" || t.name == "rope_factors_short.weight") &&
          !c.rope_factors_long.empty()))
      unused.push_back(t.name);
  if (unused.empty()) return;
  std::string list;
  for (size_t i = 0; i < std::min<size_t>(unused.size(), 4); ++i)
    list += (i ? ", " : "") + printable(unused[i]);
  if (unused.size() > 4) list += fmt::format(" and {} more", unused.size() - 4);
  fail(
      "{}: {} tensor{} that barata's {} architecture does not use: {} (it would run without "
      "them, and wrongly)",
      f.name(), unused.size(), unused.size() == 1 ? "" : "s", c.arch, list);
}

}  // namespace

void Model::check_layout(GgufFile layout) {
  from_gguf(std::move(layout));  // with no data, binding reads nothing
}

Model Model::load(const std::filesystem::path& path) {
  return from_gguf(GgufFile::open(path));
}

Model Model::from_gguf(GgufFile file) {
  Model m(std::move(file));
  const GgufFile& f = m.file_;
  m.cfg_ = ModelConfig::from_gguf(f);
  const ModelConfig& c = m.cfg_;
  Used used;
  const auto matrix = [&](const std::string& name, int64_t k, int64_t n_rows) {
    return bind_matrix(f, name, k, n_rows, &used);
  };
  const auto vector_f32 = [&](const std::string& name, int64_t n) {
    return bind_vector(f, name, n, &used);
  };
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  m.token_embd_ = matrix("token_embd.weight", c.d_model, c.n_vocab);
  m.output_ = c.tied_embeddings ? m.token_embd_ : matrix("output.weight", c.d_model, c.n_vocab);
  m.output_norm_ = vector_f32("output_norm.weight", c.d_model);
  check_block_count(f, c);
  m.layers_.resize(static_cast<size_t>(c.n_layer));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& L = m.layers_[static_cast<size_t>(i)];
    L.attn_norm = vector_f32(p + "attn_norm.weight", c.d_model);
    if (c.fused_qkv) {
      const WeightDesc qkv = matrix(p + "attn_qkv.weight", c.d_model, q_dim + 2 * kv_dim);
      L.wq = row_range(qkv, 0, q_dim);
      L.wk = row_range(qkv, q_dim, kv_dim);
      L.wv = row_range(qkv, q_dim + kv_dim, kv_dim);
    } else {
      L.wq = matrix(p + "attn_q.weight", c.d_model, q_dim);
      L.wk = matrix(p + "attn_k.weight", c.d_model, kv_dim);
      L.wv = matrix(p + "attn_v.weight", c.d_model, kv_dim);
    }
    L.wo = matrix(p + "attn_output.weight", q_dim, c.d_model);
    if (c.qkv_bias) {
      L.bq = vector_f32(p + "attn_q.bias", q_dim);
      L.bk = vector_f32(p + "attn_k.bias", kv_dim);
      L.bv = vector_f32(p + "attn_v.bias", kv_dim);
    }
    if (c.qk_norm) {
      L.q_norm = vector_f32(p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = vector_f32(p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.post_norms) L.attn_post_norm = vector_f32(p + "post_attention_norm.weight", c.d_model);
    L.ffn_norm = vector_f32(p + "ffn_norm.weight", c.d_model);
    if (c.moe()) {
      const std::string router = p + "ffn_gate_inp.weight";
      if (const GgufTensorInfo* t = f.find_tensor(router); t != nullptr && t->shape.size() == 2 &&
                                                           t->shape[0] == c.d_model &&
                                                           t->shape[1] != c.n_expert)
        fail("{}: tensor {} routes to {} experts but {}.expert_count = {}", f.name(), router,
             t->shape[1], c.arch, c.n_expert);
      L.router = matrix(router, c.d_model, c.n_expert);
      const std::string width_key =
          c.arch + (f.has(c.arch + ".expert_feed_forward_length") ? ".expert_feed_forward_length"
                                                                  : ".feed_forward_length");
      const std::string d_key = c.arch + ".embedding_length";
      L.gate_exps =
          bind_experts(f, c, p + "ffn_gate_exps.weight", c.d_model, c.d_ff_exp, width_key, &used);
      L.up_exps =
          bind_experts(f, c, p + "ffn_up_exps.weight", c.d_model, c.d_ff_exp, width_key, &used);
      L.down_exps =
          bind_experts(f, c, p + "ffn_down_exps.weight", c.d_ff_exp, c.d_model, d_key, &used);
    } else if (c.fused_gate_up) {
      const WeightDesc gate_up = matrix(p + "ffn_up.weight", c.d_model, 2 * c.d_ff);
      L.w_gate = row_range(gate_up, 0, c.d_ff);
      L.w_up = row_range(gate_up, c.d_ff, c.d_ff);
    } else {
      L.w_gate = matrix(p + "ffn_gate.weight", c.d_model, c.d_ff);
      L.w_up = matrix(p + "ffn_up.weight", c.d_model, c.d_ff);
    }
    if (!c.moe()) L.w_down = matrix(p + "ffn_down.weight", c.d_ff, c.d_model);
    if (c.post_norms) L.ffn_post_norm = vector_f32(p + "post_ffw_norm.weight", c.d_model);
  }
  refuse_unused(f, c, used);
  m.number_matrices();
  return m;
}

namespace {

// A layer's matrices, in id order: attention, then the dense FFN or the
// router and every expert's gate, up and down.
template <typename L, typename F>
void each_layer_matrix(L& layer, bool moe, F&& fn) {
  for (auto* w : {&layer.wq, &layer.wk, &layer.wv, &layer.wo}) fn(*w);
  if (!moe) {
    for (auto* w : {&layer.w_gate, &layer.w_up, &layer.w_down}) fn(*w);
    return;
  }
  fn(layer.router);
  for (size_t e = 0; e < layer.gate_exps.size(); ++e) {
    fn(layer.gate_exps[e]);
    fn(layer.up_exps[e]);
    fn(layer.down_exps[e]);
  }
}

}  // namespace

void Model::number_matrices() {
  n_matrices_ = 0;
  token_embd_.id = n_matrices_++;
  output_.id = cfg_.tied_embeddings ? token_embd_.id : n_matrices_++;
  for (LayerWeights& L : layers_)
    each_layer_matrix(L, cfg_.moe(), [&](WeightDesc& w) { w.id = n_matrices_++; });
}

std::vector<const WeightDesc*> Model::matrices() const {
  std::vector<const WeightDesc*> v{&token_embd_};
  if (!cfg_.tied_embeddings) v.push_back(&output_);
  for (const LayerWeights& L : layers_)
    each_layer_matrix(L, cfg_.moe(), [&](const WeightDesc& w) { v.push_back(&w); });
  return v;
}

void Model::embed(int32_t token, float* out) const {
  if (token < 0 || token >= cfg_.n_vocab)
    fail("token id {} is outside the vocabulary (0..{})", token, cfg_.n_vocab - 1);
  const WeightDesc& e = token_embd_;
  dtype_traits(e.type).dequantize_row(e.data + static_cast<size_t>(token) * e.row_bytes, out, e.k);
  if (e.scale != 1.0f)
    for (int64_t j = 0; j < e.k; ++j) out[j] *= e.scale;
}

int64_t Model::weight_bytes() const {
  if (!cfg_.moe()) return total_weight_bytes();
  // Every expert of a tensor has the same bytes: a token reads n_used of n.
  int64_t b = output_.bytes();
  for (const auto& L : layers_) {
    for (const WeightDesc* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.router}) b += w->bytes();
    b += cfg_.n_expert_used *
         (L.gate_exps[0].bytes() + L.up_exps[0].bytes() + L.down_exps[0].bytes());
  }
  return b;
}

int64_t Model::total_weight_bytes() const {
  int64_t b = output_.bytes();
  for (const auto& L : layers_)
    each_layer_matrix(L, cfg_.moe(), [&](const WeightDesc& w) { b += w.bytes(); });
  return b;
}

}  // namespace barata
