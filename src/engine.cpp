#include "barata/engine.h"

#include <algorithm>
#include <limits>

#include "barata/error.h"
#include "barata/kv_calibrate.h"

namespace barata {

Engine::Engine(const Model& model, EngineOptions opts)
    : Engine(model, opts,
             make_backend({.device = opts.device,
                           .n_threads = opts.n_threads,
                           .experts_on_cpu = opts.experts_on_cpu})) {}

Engine::Engine(const Model& model, EngineOptions opts, std::unique_ptr<Backend> backend)
    : model_(model),
      n_ctx_(opts.n_ctx > 0 ? opts.n_ctx : model.config().n_ctx_train),
      kv_layout_(kv_layout_for(model.config(), opts.swa_full, opts.cache_k, opts.cache_v)),
      // The pool holds cache_tokens tokens of every layer, in blocks of a
      // group's layers.
      blocks_(((opts.cache_tokens > 0 ? opts.cache_tokens : n_ctx_) + kKvBlockTokens - 1) /
                  kKvBlockTokens * kv_layout_.n_groups(),
              kv_layout_.group_window.empty() ? std::vector<int64_t>{0} : kv_layout_.group_window) {
  if (n_ctx_ > std::numeric_limits<int32_t>::max())
    fail("a context of {} positions is more than {} (positions are 32-bit)", n_ctx_,
         std::numeric_limits<int32_t>::max());
  blocks_.reserve_bookkeeping(n_ctx_);
  backend_ = std::move(backend);
  if (kv_type_info(kv_layout_.k_type).scaled) {  // kv_calibrate.h
    std::vector<float> scales = calibrate_key_scales(model_, n_ctx_, opts.n_threads, &backend_);
    backend_->set_key_scales(std::move(scales));
  }
  backend_->prepare(model_, kv_layout_, blocks_.max_blocks(), n_ctx_);
  program_ = StepProgram::record(model_);
  backend_->set_program(&program_);
}

Engine::~Engine() = default;

int64_t Engine::kv_sequence_bytes(int64_t len) const {
  return barata::kv_sequence_bytes(model_.config(), len, !blocks_.has_sliding_groups(),
                                   kv_layout_.k_type, kv_layout_.v_type);
}

int Engine::n_threads() const {
  return backend_->n_threads();
}

void Engine::prefill(int seq, std::span<const int32_t> tokens, float* logits, bool all_logits) {
  if (tokens.empty()) fail("prefill of an empty prompt");
  const int64_t start = blocks_.length(seq);
  if (start + static_cast<int64_t>(tokens.size()) > n_ctx_)
    fail("{} tokens after {} already in the sequence exceed the context of {} tokens",
         tokens.size(), start, n_ctx_);
  Batch& b = scratch_batch_;
  b.clear();
  for (size_t i = 0; i < tokens.size(); ++i)
    b.add(tokens[i], start + static_cast<int64_t>(i), seq, all_logits || i + 1 == tokens.size());
  forward(b, logits);
}

void Engine::decode(std::span<const int> seqs, std::span<const int32_t> tokens, float* logits) {
  if (seqs.size() != tokens.size())
    fail("internal: decode of {} sequences with {} tokens", seqs.size(), tokens.size());
  Batch& b = scratch_batch_;
  b.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t pos = blocks_.length(seqs[i]);
    if (pos + 1 > n_ctx_) fail("sequence {} is full: the context holds {} tokens", seqs[i], n_ctx_);
    b.add(tokens[i], pos, seqs[i], true);
  }
  forward(b, logits);
}

void Engine::forward(Batch& batch, float* logits) {
  copies_.clear();
  plan_batch(batch, blocks_, n_ctx_, model_.config().n_vocab, &copies_);
  if (!copies_.empty()) backend_->copy_kv_blocks(copies_);
  run(batch, logits);
}

void plan_batch(Batch& b, KvBlockManager& blocks, int64_t n_ctx, int64_t n_vocab,
                std::vector<KvBlockManager::Copy>* copies) {
  const int64_t T = b.size();
  if (T == 0) fail("a batch with no rows");
  if (static_cast<int64_t>(b.positions.size()) != T ||
      static_cast<int64_t>(b.seq_ids.size()) != T ||
      static_cast<int64_t>(b.want_logits.size()) != T)
    fail("internal: a batch of {} tokens with {} positions, {} sequence ids, {} logit flags", T,
         b.positions.size(), b.seq_ids.size(), b.want_logits.size());
  // Every check first: nothing changes unless the whole batch can run.
  // The distinct sequences, ascending (the order the tables are laid out in).
  std::vector<int32_t>& seqs = b.plan_seqs;
  seqs.assign(b.seq_ids.begin(), b.seq_ids.end());
  std::sort(seqs.begin(), seqs.end());
  seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
  const auto index_of = [&seqs](int32_t s) {
    return static_cast<size_t>(std::lower_bound(seqs.begin(), seqs.end(), s) - seqs.begin());
  };
  std::vector<int64_t>& next = b.plan_next;  // the position each sequence's next row must have
  next.assign(seqs.size(), 0);
  for (size_t i = 0; i < seqs.size(); ++i)
    if (blocks.exists(seqs[i])) next[i] = blocks.length(seqs[i]);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t s = b.seq_ids[t];
    if (!blocks.exists(s))
      fail("batch row {}: sequence {} does not exist (never made, or freed)", t, s);
    if (b.tokens[t] < 0 || b.tokens[t] >= n_vocab)
      fail("batch row {}: token id {} is outside the vocabulary (0..{})", t, b.tokens[t],
           n_vocab - 1);
    int64_t& at = next[index_of(s)];
    if (b.positions[t] != at)
      fail("batch row {}: position {} of sequence {}, which continues at {}", t, b.positions[t], s,
           at);
    if (b.positions[t] >= n_ctx)
      fail("batch row {}: position {} of sequence {} is past the context of {} tokens", t,
           b.positions[t], s, n_ctx);
    ++at;
  }
  int64_t need = 0;
  for (size_t i = 0; i < seqs.size(); ++i)
    need += blocks.blocks_needed(seqs[i], next[i] - blocks.length(seqs[i]));
  if (need > blocks.free_blocks())
    fail(
        "KV cache full: the batch needs {} more blocks of {} tokens, {} of {} are free (raise "
        "the context size -c)",
        need, kKvBlockTokens, blocks.free_blocks(), blocks.max_blocks());

  // Accepted: the cache grows, copies on write are made, rows get slots.
  std::vector<int32_t>& table_at = b.plan_table_at;  // offset in each group's tables
  table_at.resize(seqs.size());
  b.block_tables.clear();
  // Room for every table at its longest, so that a growing batch allocates
  // only when it gets more sequences.
  b.block_tables.reserve(seqs.size() * static_cast<size_t>(blocks.n_groups()) *
                         static_cast<size_t>(blocks.reserved_table_blocks()));
  for (size_t i = 0; i < seqs.size(); ++i) {
    blocks.append(seqs[i], next[i] - blocks.length(seqs[i]), copies);
    const std::vector<int32_t>& table = blocks.table(seqs[i]);
    table_at[i] = static_cast<int32_t>(b.block_tables.size());
    b.block_tables.insert(b.block_tables.end(), table.begin(), table.end());
  }
  b.group_stride = static_cast<int32_t>(b.block_tables.size());
  for (int g = 1; g < blocks.n_groups(); ++g)
    for (const int32_t s : seqs) {
      const std::vector<int32_t>& table = blocks.table(s, g);
      b.block_tables.insert(b.block_tables.end(), table.begin(), table.end());
    }
  b.rows.resize(static_cast<size_t>(T));
  b.logit_rows.clear();
  b.max_pos = 0;
  for (int64_t t = 0; t < T; ++t) {
    BatchRowMeta& r = b.rows[static_cast<size_t>(t)];
    r.seq = b.seq_ids[t];
    r.pos = static_cast<int32_t>(b.positions[t]);
    r.table = table_at[index_of(r.seq)];
    r.slot = b.block_tables[static_cast<size_t>(r.table + r.pos / kKvBlockTokens)] *
                 static_cast<int32_t>(kKvBlockTokens) +
             r.pos % static_cast<int32_t>(kKvBlockTokens);
    b.max_pos = std::max<int64_t>(b.max_pos, r.pos);
    if (b.want_logits[t]) b.logit_rows.push_back(static_cast<int32_t>(t));
  }
}

void Engine::run(const Batch& b, float* logits) {
  const ModelConfig& c = model_.config();
  const int64_t T = b.size();
  const int64_t d = c.d_model;
  Backend& be = *backend_;
  counts_ = {};
  be.begin(b);
  std::function<void(int64_t)> on_layer_end;
  if (residual_hook_) {
    on_layer_end = [&](int64_t l) {
      const float* h = be.act(Act::kX);
      if (be.kind() != DeviceKind::kCpu) {
        residual_host_.resize(static_cast<size_t>(T * d));
        be.to_host(residual_host_.data(), h, T * d);
        h = residual_host_.data();
      }
      residual_hook_(l, h, T, d);
    };
  }
  be.run_step(program_, b, c, logits, on_layer_end);
  for (const StepOp& op : program_.ops)
    if (op.kind == OpKind::kMatmul || op.kind == OpKind::kMatmulBias ||
        op.kind == OpKind::kMatmulAdd)
      counts_.proj_macs += T * op.w->k * op.w->n_rows;
  int64_t attn = 0;  // over every layer (a windowed one reads at most its window)
  for (const BatchRowMeta& r : b.rows) attn += 2 * c.attended_positions(r.pos) * c.head_dim;
  counts_.attn_macs = attn * c.n_head;
  const WeightDesc& o = model_.output();
  counts_.proj_macs += static_cast<int64_t>(b.logit_rows.size()) * o.k * o.n_rows;
}

}  // namespace barata
