// The forward pass on the CPU: prefill (many tokens of one sequence,
// matrix-matrix work) and decode (one token for each of B sequences,
// matrix-vector work), both against the paged fp16 KV cache.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "barata/kv_cache.h"
#include "barata/model.h"

namespace barata {

class ThreadPool;

struct EngineOptions {
  int n_threads = 0;         // 0: one per hardware thread
  int64_t n_ctx = 0;         // positions per sequence; 0: the model's training context
  int64_t cache_tokens = 0;  // KV pool size over all sequences; 0: n_ctx
};

class Engine {
 public:
  Engine(const Model& model, EngineOptions opts);
  ~Engine();

  const Model& model() const { return model_; }
  int64_t n_ctx() const { return n_ctx_; }
  int n_threads() const;
  PagedKvCache& cache() { return cache_; }
  ThreadPool& pool() { return *pool_; }

  int new_sequence() { return cache_.new_sequence(); }
  void free_sequence(int seq) { cache_.free_sequence(seq); }
  void truncate(int seq, int64_t n) { cache_.truncate(seq, n); }
  int64_t length(int seq) const { return cache_.length(seq); }

  // Appends `tokens` to `seq`. logits receives n_vocab floats for the last
  // token, or n_tokens x n_vocab when all_logits.
  void prefill(int seq, std::span<const int32_t> tokens, float* logits, bool all_logits = false);
  // Appends tokens[i] to seqs[i]; logits receives seqs.size() x n_vocab.
  void decode(std::span<const int> seqs, std::span<const int32_t> tokens, float* logits);

  // Multiply-accumulates of the last forward call (projections, attention).
  struct Counts {
    int64_t proj_macs = 0, attn_macs = 0;
  };
  const Counts& last_counts() const { return counts_; }

 private:
  struct Row {
    int seq;
    int64_t pos;
    int32_t token;
  };
  void forward(const std::vector<Row>& rows, const std::vector<int>& logit_rows, float* logits);
  void attention(int64_t layer, const std::vector<Row>& rows);
  void ensure_scratch(int64_t n_rows);
  void ensure_rope(int64_t n_pos);  // tables cover positions [0, n_pos)

  const Model& model_;
  int64_t n_ctx_;
  std::unique_ptr<ThreadPool> pool_;
  PagedKvCache cache_;
  std::vector<float> rope_cos_, rope_sin_;  // (positions made so far, rope_dims / 2)
  Counts counts_;

  // Scratch, grown to the widest batch seen: (rows, width) each.
  int64_t scratch_rows_ = 0;
  std::vector<float> x_, xn_, q_, k_, v_, att_, gate_, up_, out_;
  PreparedActs acts_f32_, acts_q8_;
};

}  // namespace barata
