// A small random-weight model in any shape and weight type (llama and qwen2:
// GQA, q/k/v biases, tied and untied embeddings, odd sizes; llama with
// experts, Mixtral's layout), written as GGUF bytes, with the dequantized
// values kept as doubles for a reference.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "barata/dtype.h"
#include "barata/gguf.h"

namespace barata::test {

struct Shape {
  std::string arch;
  int64_t n_layer, d_model, n_head, n_head_kv, head_dim, d_ff, n_vocab;
  bool tied, bias;
  DType wtype;
  // Experts (arch llama: Mixtral's layout): d_ff is then each expert's width.
  int64_t n_expert = 0, n_expert_used = 0;
};

using Mat = std::vector<double>;  // row-major (rows, k)

struct RefLayer {
  std::vector<double> attn_norm, ffn_norm, bq, bk, bv;
  Mat wq, wk, wv, wo, wg, wu, wd;
  Mat router;                   // (n_expert, d_model), F32
  std::vector<Mat> eg, eu, ed;  // per expert: gate, up (d_ff, d_model), down (d_model, d_ff)
};

struct Synthetic {
  std::vector<uint8_t> gguf;
  std::vector<RefLayer> layers;
  Mat embd, out;
  std::vector<double> out_norm;
};

// Writes the tensors in `type` and keeps the dequantized values for the reference.
inline Synthetic make_model(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  GgufWriter w;
  Synthetic m;
  const std::string a = s.arch + ".";
  w.set("general.architecture", s.arch);
  w.set(a + "block_count", GgufValue(uint32_t(s.n_layer)));
  w.set(a + "embedding_length", GgufValue(uint32_t(s.d_model)));
  w.set(a + "attention.head_count", GgufValue(uint32_t(s.n_head)));
  w.set(a + "attention.head_count_kv", GgufValue(uint32_t(s.n_head_kv)));
  w.set(a + "feed_forward_length", GgufValue(uint32_t(s.d_ff)));
  w.set(a + "context_length", GgufValue(uint32_t(64)));
  w.set(a + "rope.freq_base", GgufValue(10000.0f));
  w.set(a + "attention.layer_norm_rms_epsilon", GgufValue(1e-5f));
  if (s.n_expert > 0) {
    w.set(a + "expert_count", GgufValue(uint32_t(s.n_expert)));
    w.set(a + "expert_used_count", GgufValue(uint32_t(s.n_expert_used)));
  }
  if (s.head_dim != s.d_model / s.n_head)
    w.set(a + "attention.key_length", GgufValue(uint32_t(s.head_dim)));

  // n_mats > 1: a 3-D tensor of n_mats matrices (experts), quantized whole.
  auto tensor = [&](const std::string& name, int64_t k, int64_t rows, float scale, DType type,
                    float offset = 0.0f, int64_t n_mats = 1) {
    const int64_t all = rows * n_mats;
    std::vector<float> v(static_cast<size_t>(k * all));
    for (auto& x : v) x = offset + nd(rng) * scale;
    // Whole-matrix: barata's per-row and per-tensor types keep headers.
    std::vector<uint8_t> bytes(tensor_bytes(type, k, all));
    quantize_tensor(type, v.data(), k, all, bytes.data());
    dequantize_tensor(type, bytes.data(), k, all, v.data());
    std::vector<int64_t> shape = rows == 1     ? std::vector<int64_t>{k}
                                 : n_mats == 1 ? std::vector<int64_t>{k, rows}
                                               : std::vector<int64_t>{k, rows, n_mats};
    w.add_tensor(name, type, shape, std::move(bytes));
    return std::vector<double>(v.begin(), v.end());
  };
  const int64_t qd = s.n_head * s.head_dim, kvd = s.n_head_kv * s.head_dim;
  const DType wt = s.wtype;
  m.embd = tensor("token_embd.weight", s.d_model, s.n_vocab, 1.0f, wt);
  // Norm gains near 1, as trained models have them.
  m.out_norm = tensor("output_norm.weight", s.d_model, 1, 0.2f, DType::F32, 1.0f);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    RefLayer L;
    L.attn_norm = tensor(p + "attn_norm.weight", s.d_model, 1, 0.2f, DType::F32, 1.0f);
    L.wq = tensor(p + "attn_q.weight", s.d_model, qd, 0.3f, wt);
    L.wk = tensor(p + "attn_k.weight", s.d_model, kvd, 0.3f, wt);
    L.wv = tensor(p + "attn_v.weight", s.d_model, kvd, 0.3f, wt);
    L.wo = tensor(p + "attn_output.weight", qd, s.d_model, 0.3f, wt);
    if (s.bias) {
      L.bq = tensor(p + "attn_q.bias", qd, 1, 0.5f, DType::F32);
      L.bk = tensor(p + "attn_k.bias", kvd, 1, 0.5f, DType::F32);
      L.bv = tensor(p + "attn_v.bias", kvd, 1, 0.5f, DType::F32);
    }
    L.ffn_norm = tensor(p + "ffn_norm.weight", s.d_model, 1, 0.2f, DType::F32, 1.0f);
    if (s.n_expert > 0) {
      const int64_t E = s.n_expert;
      L.router = tensor(p + "ffn_gate_inp.weight", s.d_model, E, 0.3f, DType::F32);
      auto split = [&](const Mat& all, int64_t per) {
        std::vector<Mat> out;
        for (int64_t e = 0; e < E; ++e)
          out.emplace_back(all.begin() + e * per, all.begin() + (e + 1) * per);
        return out;
      };
      const int64_t per = s.d_model * s.d_ff;
      L.eg = split(tensor(p + "ffn_gate_exps.weight", s.d_model, s.d_ff, 0.3f, wt, 0.0f, E), per);
      L.eu = split(tensor(p + "ffn_up_exps.weight", s.d_model, s.d_ff, 0.3f, wt, 0.0f, E), per);
      L.ed = split(tensor(p + "ffn_down_exps.weight", s.d_ff, s.d_model, 0.3f, wt, 0.0f, E), per);
    } else {
      L.wg = tensor(p + "ffn_gate.weight", s.d_model, s.d_ff, 0.3f, wt);
      L.wu = tensor(p + "ffn_up.weight", s.d_model, s.d_ff, 0.3f, wt);
      L.wd = tensor(p + "ffn_down.weight", s.d_ff, s.d_model, 0.3f, wt);
    }
    m.layers.push_back(std::move(L));
  }
  if (!s.tied)
    m.out = tensor("output.weight", s.d_model, s.n_vocab, 0.5f, wt);
  else
    m.out = m.embd;
  m.gguf = w.to_bytes();
  return m;
}

}  // namespace barata::test
