// The forward pass as data: the ops of one step, recorded once when the
// engine is made (from the model's architecture row and config), and handed
// to the backend whole. Engine::run is then "begin the batch, run the step":
// a backend sees which op comes next, what reads each activation and which
// layer an op belongs to from the program, instead of inferring them from the
// order of its calls.
//
// Norm gains and biases have ids like weights (VecId, in the order recorded),
// so a backend can key what it keeps per vector by id.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "barata/model.h"

namespace barata {

// The activation buffers of the forward pass (a backend owns them).
enum class Act { kX, kXn, kQ, kK, kV, kAtt, kGate, kUp, kOut, kCount };

enum class OpKind : uint8_t {
  kEmbed,       // y = the embedding rows of the batch's tokens (x embed_scale)
  kRmsNorm,     // y = rmsnorm(x) * vec, width d_model (in place when x == y)
  kMatmul,      // y = x W^T
  kMatmulBias,  // y = x W^T + vec (vec may be empty: the file has no bias)
  kMatmulAdd,   // y += x W^T (the residual add; kOut is the scratch)
  kHeadNorm,    // x = rmsnorm per head of x (n_heads heads) * vec
  kRopeKv,      // RoPE on q (x) and k (y), then k and v stored in the layer's cache
  kAttention,   // y = attention of q (x) against the layer's cache
  kSwiGlu,      // y(gate) = silu(gate) * x(up)
  kGeGlu,       // y(gate) = gelu_tanh(gate) * x(up)
  kAdd,         // y += x, width d_model
  kMoe,         // y += the layer's mixture of experts of x (w: the router; experts: the layer)
  kLayerEnd,    // the residual stream after a layer (the engine's residual hook)
  kLogits,      // final norm (vec) of the rows that want logits, output matmul, to the host
};
const char* op_name(OpKind k);

struct StepOp {
  OpKind kind{};
  std::string name;                         // the weight's or vector's role: "wq", "attn_norm"
  int32_t layer = -1;                       // -1: outside the layers
  Act x{}, y{};                             // input and output activations (see OpKind)
  const WeightDesc* w = nullptr;            // the matmuls' weight (kLogits: the output matrix)
  const std::vector<float>* vec = nullptr;  // gains or bias
  int32_t vec_id = -1;                      // VecId of vec
  int64_t n_heads = 0;                      // kHeadNorm
  const LayerWeights* experts = nullptr;    // kMoe: the router's and experts' layer
  // Filled by analyse(): the ids of the weights whose matmuls read this op's
  // output y before anything writes y again (rms_norm and GLU outputs feed
  // two or three matmuls: a backend quantizes their input once).
  std::vector<int64_t> readers;
  // Filled by analyse() for the matmuls: the index of the op that last wrote
  // x before this one (-1: none in the step). Matmuls with the same x_from
  // read the same values, so a backend converts them (to 8 bits, say) once
  // and keys the conversion by this index, not by the buffer.
  int32_t x_from = -1;
};

struct StepProgram {
  std::vector<StepOp> ops;
  int32_t n_vecs = 0;

  // The model's step: every layer's ops as its config (the architecture row)
  // turns them on, then the logits.
  static StepProgram record(const Model& model);
  // One line per op: "12 L0 matmul_bias wq(xn -> q) +bq" (tests, -v).
  std::string describe() const;
};

}  // namespace barata
