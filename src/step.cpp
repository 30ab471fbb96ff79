#include "barata/step.h"

#include <fmt/core.h>

#include "barata/error.h"

namespace barata {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kEmbed:
      return "embed";
    case OpKind::kRmsNorm:
      return "rms_norm";
    case OpKind::kMatmul:
      return "matmul";
    case OpKind::kMatmulBias:
      return "matmul_bias";
    case OpKind::kMatmulAdd:
      return "matmul_add";
    case OpKind::kHeadNorm:
      return "head_norm";
    case OpKind::kRopeKv:
      return "rope_kv";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kSwiGlu:
      return "swiglu";
    case OpKind::kGeGlu:
      return "geglu";
    case OpKind::kAdd:
      return "add";
    case OpKind::kMoe:
      return "moe";
    case OpKind::kLayerEnd:
      return "layer_end";
    case OpKind::kLogits:
      return "logits";
  }
  return "?";
}

namespace {

const char* act_name(Act a) {
  static const char* names[] = {"x", "xn", "q", "k", "v", "att", "gate", "up", "out"};
  const auto i = static_cast<size_t>(a);
  return i < std::size(names) ? names[i] : "?";
}

// (kMoe reads x through its router and experts: a matmul to the analysis.)
bool is_matmul(OpKind k) {
  return k == OpKind::kMatmul || k == OpKind::kMatmulBias || k == OpKind::kMatmulAdd ||
         k == OpKind::kMoe;
}

// Whether op writes activation a (kMatmulAdd writes its y and the scratch kOut).
bool writes(const StepOp& op, Act a) {
  switch (op.kind) {
    case OpKind::kLayerEnd:
      return false;
    case OpKind::kRopeKv:
      return a == op.x || a == op.y;  // q and k rotated in place
    case OpKind::kHeadNorm:
      return a == op.x;
    case OpKind::kMatmulAdd:
      return a == op.y || a == Act::kOut;
    case OpKind::kLogits:
      return a == Act::kXn;
    default:
      return a == op.y;
  }
}

// Each op's readers: the matmuls (and the logits' output matrix) that read
// its output before it is written again; each matmul's x_from: the op that
// last wrote its input.
void analyse(StepProgram& p) {
  for (size_t i = 0; i < p.ops.size(); ++i) {
    StepOp& op = p.ops[i];
    if (is_matmul(op.kind))
      for (size_t j = i; j-- > 0;)
        if (writes(p.ops[j], op.x)) {
          op.x_from = static_cast<int32_t>(j);
          break;
        }
    if (op.kind != OpKind::kRmsNorm && op.kind != OpKind::kSwiGlu && op.kind != OpKind::kGeGlu)
      continue;
    for (size_t j = i + 1; j < p.ops.size(); ++j) {
      const StepOp& r = p.ops[j];
      if (is_matmul(r.kind) && r.x == op.y) op.readers.push_back(r.w->id);
      if (writes(r, op.y)) break;
    }
  }
}

struct Recorder {
  StepProgram& p;
  StepOp& add(OpKind kind, int32_t layer, Act x, Act y, std::string name = {}) {
    StepOp op;
    op.kind = kind;
    op.layer = layer;
    op.x = x;
    op.y = y;
    op.name = std::move(name);
    p.ops.push_back(std::move(op));
    return p.ops.back();
  }
  void vec(StepOp& op, const std::vector<float>& v) {
    op.vec = &v;
    op.vec_id = p.n_vecs++;
  }
  void matmul(OpKind kind, int32_t l, const char* name, const WeightDesc& w, Act x, Act y,
              const std::vector<float>* bias = nullptr, const char* bias_name = nullptr) {
    StepOp& op = add(kind, l, x, y, name);
    op.w = &w;
    if (bias) {
      vec(op, *bias);
      op.name += std::string(" +") + bias_name;
    }
  }
  void norm(int32_t l, const char* name, const std::vector<float>& g, Act x, Act y) {
    StepOp& op = add(OpKind::kRmsNorm, l, x, y, name);
    vec(op, g);
  }
};

}  // namespace

StepProgram StepProgram::record(const Model& model) {
  const ModelConfig& c = model.config();
  StepProgram p;
  Recorder r{p};
  r.add(OpKind::kEmbed, -1, Act::kX, Act::kX, "token_embd");
  for (int64_t li = 0; li < c.n_layer; ++li) {
    const auto l = static_cast<int32_t>(li);
    const LayerWeights& L = model.layers()[static_cast<size_t>(li)];
    r.norm(l, "attn_norm", L.attn_norm, Act::kX, Act::kXn);
    r.matmul(OpKind::kMatmulBias, l, "wq", L.wq, Act::kXn, Act::kQ, &L.bq, "bq");
    r.matmul(OpKind::kMatmulBias, l, "wk", L.wk, Act::kXn, Act::kK, &L.bk, "bk");
    r.matmul(OpKind::kMatmulBias, l, "wv", L.wv, Act::kXn, Act::kV, &L.bv, "bv");
    if (c.qk_norm) {
      StepOp& q = r.add(OpKind::kHeadNorm, l, Act::kQ, Act::kQ, "q_norm");
      q.n_heads = c.n_head;
      r.vec(q, L.q_norm);
      StepOp& k = r.add(OpKind::kHeadNorm, l, Act::kK, Act::kK, "k_norm");
      k.n_heads = c.n_head_kv;
      r.vec(k, L.k_norm);
    }
    r.add(OpKind::kRopeKv, l, Act::kQ, Act::kK, "rope_kv");
    r.add(OpKind::kAttention, l, Act::kQ, Act::kAtt, "attention");
    if (c.post_norms) {  // x += rmsnorm(att W_o^T)
      r.matmul(OpKind::kMatmul, l, "wo", L.wo, Act::kAtt, Act::kOut);
      r.norm(l, "attn_post_norm", L.attn_post_norm, Act::kOut, Act::kOut);
      r.add(OpKind::kAdd, l, Act::kOut, Act::kX, "residual");
    } else {
      r.matmul(OpKind::kMatmulAdd, l, "wo", L.wo, Act::kAtt, Act::kX);
    }
    r.norm(l, "ffn_norm", L.ffn_norm, Act::kX, Act::kXn);
    if (c.moe()) {  // x += the experts' weighted sum (no architecture has post-norms and experts)
      if (c.post_norms) fail("internal: {} has post-norms and experts", c.arch);
      StepOp& op = r.add(OpKind::kMoe, l, Act::kXn, Act::kX, "moe");
      op.w = &L.router;
      op.experts = &L;
      r.add(OpKind::kLayerEnd, l, Act::kX, Act::kX, "layer_end");
      continue;
    }
    r.matmul(OpKind::kMatmul, l, "w_gate", L.w_gate, Act::kXn, Act::kGate);
    r.matmul(OpKind::kMatmul, l, "w_up", L.w_up, Act::kXn, Act::kUp);
    r.add(c.glu == Glu::kGeGLU ? OpKind::kGeGlu : OpKind::kSwiGlu, l, Act::kUp, Act::kGate,
          c.glu == Glu::kGeGLU ? "geglu" : "swiglu");
    if (c.post_norms) {
      r.matmul(OpKind::kMatmul, l, "w_down", L.w_down, Act::kGate, Act::kOut);
      r.norm(l, "ffn_post_norm", L.ffn_post_norm, Act::kOut, Act::kOut);
      r.add(OpKind::kAdd, l, Act::kOut, Act::kX, "residual");
    } else {
      r.matmul(OpKind::kMatmulAdd, l, "w_down", L.w_down, Act::kGate, Act::kX);
    }
    r.add(OpKind::kLayerEnd, l, Act::kX, Act::kX, "layer_end");
  }
  StepOp& out = r.add(OpKind::kLogits, -1, Act::kX, Act::kXn, "output_norm");
  out.w = &model.output();
  r.vec(out, model.output_norm());
  analyse(p);
  // The logits' output matrix reads the final norm's output.
  p.ops.back().readers = {model.output().id};
  return p;
}

std::string StepProgram::describe() const {
  std::string s;
  for (size_t i = 0; i < ops.size(); ++i) {
    const StepOp& op = ops[i];
    s += fmt::format("{:>4} {:<4} {:<12} {}({} -> {})", i,
                     op.layer >= 0 ? fmt::format("L{}", op.layer) : std::string("-"),
                     op_name(op.kind), op.name, act_name(op.x), act_name(op.y));
    if (op.x_from >= 0) s += fmt::format(" x from {}", op.x_from);
    if (op.vec_id >= 0) s += fmt::format(" vec#{}", op.vec_id);
    if (!op.readers.empty()) {
      s += " read by w#";
      for (size_t j = 0; j < op.readers.size(); ++j)
        s += fmt::format("{}{}", j ? "," : "", op.readers[j]);
    }
    s += "\n";
  }
  return s;
}

}  // namespace barata
