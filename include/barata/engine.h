// The forward pass, one for every backend: prefill (many tokens of one
// sequence), decode (one token for each of B sequences) or any mix of
// sequences in one Batch, against the paged fp16 KV cache. The ops run on the
// backend chosen at construction (include/barata/backend.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "barata/backend.h"
#include "barata/batch.h"
#include "barata/kv_cache.h"
#include "barata/model.h"

namespace barata {

// Checks a batch against the cache (sequences exist, tokens inside the
// vocabulary, each sequence's rows continue it, positions inside n_ctx,
// enough free blocks) and throws barata::Error, changing nothing, when it
// does not fit. Otherwise appends the rows to their sequences, fills the
// batch's row metadata and block tables, and adds the copies on write the
// backend must make to *copies.
void plan_batch(Batch& batch, KvBlockManager& blocks, int64_t n_ctx, int64_t n_vocab,
                std::vector<KvBlockManager::Copy>* copies);

struct EngineOptions {
  int n_threads = 0;         // CPU threads; 0: one per hardware thread
  int64_t n_ctx = 0;         // positions per sequence; 0: the model's training context
  int64_t cache_tokens = 0;  // KV pool size over all sequences; 0: n_ctx
  DeviceKind device = DeviceKind::kCpu;
  // Sliding-window layers keep every position's K/V (one layer group), as
  // llama.cpp's --swa-full; prefix caching needs it. Otherwise their blocks
  // behind the window go back to the pool (kv_cache.h).
  bool swa_full = false;
  // The cache's element types (kv_types.h; llama.cpp's -ctk / -ctv).
  KvType cache_k = KvType::kF16, cache_v = KvType::kF16;
  bool experts_on_cpu = false;  // BackendOptions::experts_on_cpu
};

class Engine {
 public:
  Engine(const Model& model, EngineOptions opts);
  // With a backend made by the caller (opts.device and opts.n_threads unused).
  Engine(const Model& model, EngineOptions opts, std::unique_ptr<Backend> backend);
  ~Engine();

  const Model& model() const { return model_; }
  int64_t n_ctx() const { return n_ctx_; }
  int n_threads() const;
  Backend& backend() { return *backend_; }
  // Hands the backend back (the engine is unusable afterwards): the key
  // scales' calibration lends the engine's CPU backend to a first engine.
  std::unique_ptr<Backend> release_backend() { return std::move(backend_); }
  const KvBlockManager& blocks() const { return blocks_; }
  KvBlockManager& blocks() { return blocks_; }  // prefix caching, the scheduler
  int64_t kv_bytes_per_token() const { return kv_layout_.bytes_per_token(); }
  // K/V bytes one sequence of len tokens holds (less than len x
  // kv_bytes_per_token() once sliding-window layers have released blocks).
  int64_t kv_sequence_bytes(int64_t len) const;
  const KvLayout& kv_layout() const { return kv_layout_; }
  const StepProgram& program() const { return program_; }

  int new_sequence() { return blocks_.new_sequence(); }
  void free_sequence(int seq) { blocks_.free_sequence(seq); }
  void truncate(int seq, int64_t n) { blocks_.truncate(seq, n); }
  int fork(int seq) { return blocks_.fork(seq); }
  int64_t length(int seq) const { return blocks_.length(seq); }

  // Appends `tokens` to `seq`. logits receives n_vocab floats for the last
  // token, or n_tokens x n_vocab when all_logits.
  void prefill(int seq, std::span<const int32_t> tokens, float* logits, bool all_logits = false);
  // Appends tokens[i] to seqs[i]; logits receives seqs.size() x n_vocab.
  void decode(std::span<const int> seqs, std::span<const int32_t> tokens, float* logits);
  // Any batch: each sequence's rows must continue it (positions length,
  // length + 1, ... in batch order). The batch is checked against the cache
  // (sequences, tokens, positions, context, free blocks) before anything
  // changes: a refused batch leaves every sequence as it was. logits
  // receives batch.n_logits() x n_vocab, in row order.
  void forward(Batch& batch, float* logits);

  // Multiply-accumulates of the last forward call (projections, attention).
  struct Counts {
    int64_t proj_macs = 0, attn_macs = 0;
  };
  const Counts& last_counts() const { return counts_; }

  // Called during every forward pass after each layer's FFN residual add
  // with the residual stream x of that layer: rows x d floats on the host
  // (a copy on device backends), row order as in the batch, valid only
  // during the call. Unset (the default, or an empty function): no cost.
  using ResidualHook = std::function<void(int64_t layer, const float* x, int64_t rows, int64_t d)>;
  void set_residual_hook(ResidualHook h) { residual_hook_ = std::move(h); }

 private:
  void run(const Batch& batch, float* logits);

  const Model& model_;
  int64_t n_ctx_;
  KvLayout kv_layout_;
  KvBlockManager blocks_;
  std::unique_ptr<Backend> backend_;
  Counts counts_;
  Batch scratch_batch_;
  std::vector<KvBlockManager::Copy> copies_;  // forward()'s copies on write, kept warm
  ResidualHook residual_hook_;
  std::vector<float> residual_host_;  // the hook's copy of x on device backends
  StepProgram program_;               // the step, recorded once (step.h)
};

}  // namespace barata
