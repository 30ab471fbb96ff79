#include "cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <spdlog/spdlog.h>

#include "barata/error.h"
#include "barata/half.h"
#include "barata/kv_calibrate.h"
#include "barata/moe.h"
#include "cpu/cpu_experts.h"
#include "cpu/dot.h"
#include "cpu/isa.h"
#include "cpu/matmul.h"
#include "cpu/thread_pool.h"

namespace barata {
namespace {

// y = x / sqrt(mean(x^2) + eps) * w; the sum in double, as llama.cpp does.
// Eight partial sums (element i into sum i % 8), added pairwise at the end: a
// fixed order, so every build gives the same bits, and the compiler holds the
// eight in vector lanes instead of one add after another.
void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  double part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += static_cast<double>(x[i + j]) * x[i + j];
  for (int j = 0; i < n; ++i, ++j) part[j] += static_cast<double>(x[i]) * x[i];
  const double ss =
      ((part[0] + part[4]) + (part[2] + part[6])) + ((part[1] + part[5]) + (part[3] + part[7]));
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

class CpuBandwidthProbe final : public BandwidthProbe {
 public:
  CpuBandwidthProbe(ThreadPool& pool, int64_t bytes)
      : pool_(pool), n_(std::max<int64_t>(bytes / 8, 1 << 16)) {
    buf_ = std::make_unique<uint64_t[]>(static_cast<size_t>(n_));
    pool_.parallel_for(n_, [&](int64_t b, int64_t end, int) {
      for (int64_t i = b; i < end; ++i) buf_[i] = static_cast<uint64_t>(i);
    });
    partial_.assign(static_cast<size_t>(pool_.size()), 0);
  }
  ~CpuBandwidthProbe() override {
    volatile uint64_t sink = 0;
    for (uint64_t p : partial_) sink = sink + p;
  }
  // Every thread sums its contiguous share; four independent accumulators
  // keep the adds off the critical path so that the loads are the limit.
  double run_gb_per_s() override {
    const auto t0 = std::chrono::steady_clock::now();
    pool_.parallel_for(
        n_,
        [&](int64_t b, int64_t end, int t) {
          uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
          int64_t i = b;
          for (; i + 4 <= end; i += 4) {
            a0 += buf_[i];
            a1 += buf_[i + 1];
            a2 += buf_[i + 2];
            a3 += buf_[i + 3];
          }
          for (; i < end; ++i) a0 += buf_[i];
          partial_[static_cast<size_t>(t)] += a0 + a1 + a2 + a3;
        },
        1 << 12);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(n_ * 8) / (ms * 1e6);
  }

 private:
  ThreadPool& pool_;
  int64_t n_;
  std::unique_ptr<uint64_t[]> buf_;
  std::vector<uint64_t> partial_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads)
      : pool_(std::make_unique<ThreadPool>(n_threads > 0 ? n_threads
                                                         : ThreadPool::default_threads())) {
    spdlog::info("cpu: {} threads, {}", pool_->size(), cpu_isa_report());
  }

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  int n_threads() const override { return pool_->size(); }

  void prepare(const Model& model, const KvLayout& kv, int64_t n_blocks, int64_t n_ctx) override {
    n_ctx_ = n_ctx;
    rope_cos_.clear();  // their angles depend on n_ctx (Phi-3's factors, YaRN)
    rope_sin_.clear();
    swa_cos_.clear();
    swa_sin_.clear();
    // Prepared again for the same model (after the key scales' calibration,
    // kv_calibrate.h): the weights stay bound and repacked; the cache is new.
    if (model_ != &model || views_.empty()) bind_weights(model);
    pool_kv_ = std::make_unique<HostKvPool>(kv, n_blocks);
    key_off_.clear();
    if (kv_type_info(kv.k_type).offset) key_off_ = key_offsets(model, n_ctx);
    check_key_scales(model.config(), kv, key_scale_);
  }

  void bind_weights(const Model& model) {
    model_ = &model;
    vec_ = cpu_vector_ops(cpu_isa());
    views_.assign(static_cast<size_t>(model.n_matrices()), WeightView{});
    embed_row_ = dtype_traits(model.token_embd().type).dequantize_row;
    const CpuIsa isa = cpu_isa();
    const bool repack = cpu_repack_enabled();
    std::vector<std::pair<size_t, size_t>> copies;  // (matrix id, offset in the arena)
    arena_ = RepackArena{};
    for (const WeightDesc* w : model.matrices()) {
      const size_t id = static_cast<size_t>(w->id);
      views_[id] = WeightView{w->type, w->k,         w->n_rows,
                              w->data, w->row_bytes, &cpu_matmul_kernel(w->type, w->k, isa, repack),
                              w->scale};
      if (wants_repack(views_[id]))
        copies.emplace_back(id, arena_.reserve(repacked_bytes(views_[id])));
    }
    // The file stays as it is; kernels that want their rows interleaved get a
    // copy (the mapped pages are read once and left to the page cache).
    if (!copies.empty()) {
      arena_.allocate();
      for (const auto& [id, offset] : copies) repack_weight(*pool_, views_[id], arena_.at(offset));
      spdlog::info("cpu: {} matrices ({:.1f} MiB) repacked at load for the {} kernels",
                   copies.size(), static_cast<double>(arena_.size()) / (1 << 20),
                   cpu_isa_name(isa));
    }
  }

  void set_qk_observer(QkObserver f) override { qk_observer_ = std::move(f); }

  void begin(const Batch& batch) override {
    batch_ = &batch;
    ensure_scratch(batch.size());
    ensure_rope(batch.max_pos + 1);
    acts_f32_.from = acts_q8_.from = -1;
  }

  float* act(Act a) override { return bufs_[static_cast<size_t>(a)].data(); }

  void embed(float* x) override {
    // As Model::embed, with the row decoder looked up once at prepare.
    const WeightDesc& e = model_->token_embd();
    const int64_t d = model_->config().d_model, n_vocab = model_->config().n_vocab;
    for (int64_t t = 0; t < batch_->size(); ++t) {
      const int32_t token = batch_->tokens[t];
      if (token < 0 || token >= n_vocab)
        fail("token id {} is outside the vocabulary (0..{})", token, n_vocab - 1);
      embed_row_(e.data + static_cast<size_t>(token) * e.row_bytes, x + t * d, e.k);
      if (e.scale != 1.0f)
        for (int64_t j = 0; j < e.k; ++j) x[t * d + j] *= e.scale;
      if (const float s = model_->config().embed_scale; s != 1.0f)
        for (int64_t j = 0; j < e.k; ++j) x[t * d + j] *= s;
    }
  }

  void rms_norm(const float* x, const std::vector<float>& w, float* y, int64_t d) override {
    const float eps = model_->config().norm_eps;
    rows(batch_->size(), d, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) rms_norm_row(x + t * d, w.data(), y + t * d, d, eps);
    });
  }

  void matmul(const WeightDesc& desc, const float* x, float* y) override {
    const WeightView& w = views_[static_cast<size_t>(desc.id)];
    barata::matmul(*pool_, w, acts_for(w, x), y, w.n_rows);
  }

  void head_norm(float* x, const std::vector<float>& w, int64_t n_heads) override {
    const float eps = model_->config().norm_eps;
    const int64_t hd = static_cast<int64_t>(w.size());
    rows(batch_->size() * n_heads, hd, [&](int64_t h0, int64_t h1) {
      for (int64_t h = h0; h < h1; ++h) rms_norm_row(x + h * hd, w.data(), x + h * hd, hd, eps);
    });
  }

  void add_bias(float* y, const std::vector<float>& b) override {
    const int64_t n = static_cast<int64_t>(b.size());
    rows(batch_->size(), n, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t i = 0; i < n; ++i) y[t * n + i] += b[i];
    });
  }

  void rope_kv(int64_t layer, float* q, float* k, const float* v) override;
  void attention(int64_t layer, const float* q, float* out) override;

  void swiglu(float* gate, const float* up, int64_t n) override {
    elements(n, [&](int64_t i0, int64_t i1) { vec_.swiglu(gate + i0, up + i0, i1 - i0); });
  }

  void geglu(float* gate, const float* up, int64_t n) override {
    elements(n, [&](int64_t i0, int64_t i1) { vec_.geglu(gate + i0, up + i0, i1 - i0); });
  }

  void add(float* x, const float* y, int64_t n) override {
    elements(n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
    });
  }

  void moe(const LayerWeights& L, const float* xn, float* acc) override;

  void logits(const float* x, float* host_logits) override {
    const ModelConfig& c = model_->config();
    const int64_t d = c.d_model;
    const int64_t n_out = static_cast<int64_t>(batch_->logit_rows.size());
    float* xn = act(Act::kXn);
    for (int64_t i = 0; i < n_out; ++i)
      rms_norm_row(x + batch_->logit_rows[i] * d, model_->output_norm().data(), xn + i * d, d,
                   c.norm_eps);
    const WeightView& out = views_[static_cast<size_t>(model_->output().id)];
    PreparedActs& a = out.kernel->act == ActFormat::kQ8 ? acts_q8_ : acts_f32_;
    prepare_acts(*pool_, out.kernel->act, xn, n_out, d, a);  // reuses a's buffer
    a.from = -1;
    barata::matmul(*pool_, out, a, host_logits, out.n_rows);
  }

  void to_device(float* dst, const float* host, int64_t n) override {
    std::memcpy(dst, host, static_cast<size_t>(n) * sizeof(float));
  }
  void to_host(float* host, const float* src, int64_t n) override {
    std::memcpy(host, src, static_cast<size_t>(n) * sizeof(float));
  }
  void kv_to_host(int64_t layer, int kv, int32_t slot, uint8_t* host) override {
    const KvLayout& L = pool_kv_->layout();
    const uint8_t* p = pool_kv_->block(slot / static_cast<int32_t>(kKvBlockTokens)) +
                       L.offset(layer, kv, slot % kKvBlockTokens);
    std::memcpy(host, p, static_cast<size_t>(L.row_bytes(kv)));
  }

  void copy_kv_blocks(const std::vector<KvBlockManager::Copy>& copies) override {
    for (const auto& c : copies) pool_kv_->copy(c.from, c.to);
  }
  void synchronize() override {}

  DeviceReport report() const override {
    DeviceReport r;
    r.name = "cpu: " + std::to_string(pool_->size()) + " threads, " + cpu_isa_name(cpu_isa()) +
             " kernels";
    r.weight_bytes = model_ ? model_->weight_bytes() : 0;
    r.kv_pool_bytes = pool_kv_ ? pool_kv_->bytes() : 0;
    return r;
  }

  std::unique_ptr<BandwidthProbe> bandwidth_probe(int64_t bytes) override {
    return std::make_unique<CpuBandwidthProbe>(*pool_, bytes);
  }

 private:
  // Converts the activations once per format that the next weights want:
  // q, k and v (gate and up) share one conversion, keyed by the op of the
  // step that wrote their input (StepOp::x_from); outside a step (the op
  // tests) every matmul converts afresh.
  const PreparedActs& acts_for(const WeightView& w, const float* x) {
    PreparedActs& a = w.kernel->act == ActFormat::kQ8 ? acts_q8_ : acts_f32_;
    const int64_t from = op_ ? op_->x_from : -1;
    if (from < 0 || a.from != from || a.data == nullptr)
      prepare_acts(*pool_, w.kernel->act, x, batch_->size(), w.k, a);
    a.from = from;
    return a;
  }
  bool step_begin(bool) override {
    acts_f32_.from = acts_q8_.from = -1;
    return false;
  }

  void ensure_scratch(int64_t n);
  void ensure_rope(int64_t n_pos);

  // Element-wise work on the pool when it is big enough to pay for the fork
  // (a prefill); a decode step's few thousand elements stay on this thread.
  static constexpr int64_t kParallelElements = 1 << 15;
  template <typename F>
  void elements(int64_t n, F&& fn) {
    if (n < kParallelElements || pool_->size() == 1) return fn(int64_t{0}, n);
    pool_->parallel_for(
        n, [&](int64_t a, int64_t b, int) { fn(a, b); }, 4096);
  }
  template <typename F>
  void rows(int64_t n_rows, int64_t width, F&& fn) {
    if (n_rows * width < kParallelElements || pool_->size() == 1) return fn(int64_t{0}, n_rows);
    pool_->parallel_for(n_rows, [&](int64_t a, int64_t b, int) { fn(a, b); });
  }

  std::unique_ptr<ThreadPool> pool_;
  const Model* model_ = nullptr;
  int64_t n_ctx_ = 0;
  CpuVectorOps vec_{};
  std::vector<WeightView> views_;  // by WeightDesc::id
  RepackArena arena_;              // the repacked copies of the matrices whose kernels want them
  std::unique_ptr<HostKvPool> pool_kv_;
  std::vector<float> key_off_;  // key_offsets(), for the cache types that subtract it
  QkObserver qk_observer_;
  DequantizeRowFn embed_row_ = nullptr;
  const Batch* batch_ = nullptr;
  int64_t scratch_rows_ = 0;
  std::vector<float> bufs_[static_cast<size_t>(Act::kCount)];
  std::vector<float> rope_cos_, rope_sin_;  // (positions made so far, rope_dims / 2)
  std::vector<float> swa_cos_, swa_sin_;    // the same for the sliding-window layers (if any)
  PreparedActs acts_f32_, acts_q8_;
  struct AttnItem {
    int64_t cost;
    int32_t t0, t1, kvh, table;
  };
  std::vector<AttnItem> attn_items_;  // one attention call's work, kept between calls
  // moe(): the router's logits, the routing and the experts' scratch.
  std::vector<float> moe_logits_;
  ExpertGroups moe_groups_;
  ExpertScratch moe_scratch_;
};

// The router's logits, the routing (moe.h), then the experts
// (cpu_experts.h) on the input rows converted once per format.
void CpuBackend::moe(const LayerWeights& L, const float* xn, float* acc) {
  const ModelConfig& c = model_->config();
  const int64_t T = batch_->size();
  moe_logits_.resize(static_cast<size_t>(T * c.n_expert));
  const WeightView& router = views_[static_cast<size_t>(L.router.id)];
  barata::matmul(*pool_, router, acts_for(router, xn), moe_logits_.data(), c.n_expert);
  moe_groups_.route(c, moe_logits_.data(), T);
  const WeightView& gate0 = views_[static_cast<size_t>(L.gate_exps[0].id)];
  const WeightView& up0 = views_[static_cast<size_t>(L.up_exps[0].id)];
  const PreparedActs& x_gate = acts_for(gate0, xn);
  const PreparedActs& x_up = acts_for(up0, xn);  // the same object when the formats agree
  cpu_run_experts(*pool_, vec_, views_, L, moe_groups_, x_gate, x_up, acc, c.d_model, c.d_ff_exp,
                  moe_scratch_);
}

void CpuBackend::ensure_scratch(int64_t n) {
  if (n <= scratch_rows_) return;
  const ModelConfig& c = model_->config();
  const auto sz = [n](int64_t w) { return static_cast<size_t>(n * w); };
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  auto set = [&](Act a, int64_t w) { bufs_[static_cast<size_t>(a)].resize(sz(w)); };
  set(Act::kX, c.d_model);
  set(Act::kXn, std::max(c.d_model, c.d_ff));
  set(Act::kQ, q_dim);
  set(Act::kK, kv_dim);
  set(Act::kV, kv_dim);
  set(Act::kAtt, q_dim);
  set(Act::kGate, c.d_ff);
  set(Act::kUp, c.d_ff);
  set(Act::kOut, c.d_model);
  scratch_rows_ = n;
  acts_f32_.from = acts_q8_.from = -1;  // buffers may have moved
}

// RoPE angles: theta_i = pos * base^(-2i / rope_dims), in double then rounded.
// Grown as positions are reached (doubling, at most n_ctx): a large -c costs
// nothing up front, and each position's values are the same whenever made.
void CpuBackend::ensure_rope(int64_t n_pos) {
  const ModelConfig& c = model_->config();
  const int64_t half = c.rope_dims / 2;
  const int64_t have = static_cast<int64_t>(rope_cos_.size()) / half;
  if (n_pos <= have) return;
  const int64_t want = std::min(n_ctx_, std::max({n_pos, 2 * have, int64_t{256}}));
  rope_cos_.resize(static_cast<size_t>(want * half));
  rope_sin_.resize(rope_cos_.size());
  rope_tables(c, have, want, rope_cos_.data() + have * half, rope_sin_.data() + have * half,
              n_ctx_);
  if (c.n_swa > 0) {
    swa_cos_.resize(rope_cos_.size());
    swa_sin_.resize(rope_cos_.size());
    rope_tables(c, have, want, swa_cos_.data() + have * half, swa_sin_.data() + have * half, n_ctx_,
                true);
  }
}

void CpuBackend::rope_kv(int64_t layer, float* q, float* k, const float* v) {
  const ModelConfig& c = model_->config();
  const int64_t T = batch_->size();
  const int64_t hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  const int64_t half = c.rope_dims / 2;
  const bool neox = c.rope_style == RopeStyle::kNeox;
  const KvLayout& L = pool_kv_->layout();
  const bool rotate_k = kv_type_info(L.k_type).rotated;

  // RoPE on q and k, in place. Normal style rotates pairs (2i, 2i+1); NeoX
  // rotates (i, i + rope_dims/2). The style is a template argument: the inner
  // loop has no branch on it.
  const bool swa = c.is_swa(layer);
  const float* cos_table = swa ? swa_cos_.data() : rope_cos_.data();
  const float* sin_table = swa ? swa_sin_.data() : rope_sin_.data();
  auto run = [&](auto neox_tag) {
    constexpr bool kNeox = decltype(neox_tag)::value;
    auto rope = [&](float* x, int64_t pos) {
      const float* cs = cos_table + pos * half;
      const float* sn = sin_table + pos * half;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = kNeox ? i : 2 * i, b = kNeox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * cs[i] - x1 * sn[i];
        x[b] = x0 * sn[i] + x1 * cs[i];
      }
    };
    rows(T, q_dim + 2 * kv_dim, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const BatchRowMeta& r = batch_->rows[static_cast<size_t>(t)];
        for (int64_t h = 0; h < c.n_head; ++h) rope(q + t * q_dim + h * hd, r.pos);
        for (int64_t h = 0; h < c.n_head_kv; ++h) rope(k + t * kv_dim + h * hd, r.pos);
        if (!key_off_.empty()) {  // the outlier-aware K types (kv_types.h)
          const float* off = key_off_.data() + layer * kv_dim;
          float* kr = k + t * kv_dim;
          for (int64_t i = 0; i < kv_dim; ++i) kr[i] -= off[i];
        }
        if (!key_scale_.empty()) {  // k / s and q s (kv_calibrate.h)
          const float* sc = key_scale_.data() + layer * kv_dim;
          float* kr = k + t * kv_dim;
          for (int64_t i = 0; i < kv_dim; ++i) kr[i] /= sc[i];
          const int64_t group = c.n_head / c.n_head_kv;
          for (int64_t h = 0; h < c.n_head; ++h) {
            float* x = q + t * q_dim + h * hd;
            const float* sh = sc + (h / group) * hd;
            for (int64_t i = 0; i < hd; ++i) x[i] *= sh[i];
          }
        }
        if (rotate_k) {  // kv_types.h: k <- H k, q <- H q / head_dim
          const float inv = 1.0f / static_cast<float>(hd);
          for (int64_t h = 0; h < c.n_head; ++h) {
            float* x = q + t * q_dim + h * hd;
            hadamard_transform(x, hd);
            for (int64_t i = 0; i < hd; ++i) x[i] *= inv;
          }
          for (int64_t h = 0; h < c.n_head_kv; ++h) hadamard_transform(k + t * kv_dim + h * hd, hd);
        }
        const int32_t* table =
            batch_->block_tables.data() + L.group(layer) * batch_->group_stride + r.table;
        uint8_t* block = pool_kv_->block(table[r.pos / kKvBlockTokens]);
        kv_quantize_row(L.k_type, k + t * kv_dim,
                        block + L.offset(layer, 0, r.pos % kKvBlockTokens), kv_dim);
        kv_quantize_row(L.v_type, v + t * kv_dim,
                        block + L.offset(layer, 1, r.pos % kKvBlockTokens), kv_dim);
      }
    });
  };
  if (neox) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
  if (qk_observer_) qk_observer_(layer, q, k, T);
}

// Tiled attention (src/cpu/attention.cpp): a work item is a run of at most
// kAttnMaxQueries / group consecutive tokens of one sequence and one KV head,
// so that the item's queries share each cache block's conversion. Items go
// to the pool longest first (a prefill's late tokens see the most keys).
void CpuBackend::attention(int64_t layer, const float* q_all, float* att) {
  const ModelConfig& c = model_->config();
  const int64_t T = batch_->size();
  const int64_t hd = c.head_dim, group = c.n_head / c.n_head_kv;
  const KvLayout& L = pool_kv_->layout();
  const Batch& batch = *batch_;
  const AttnArgs args{q_all,
                      att,
                      batch.rows.data(),
                      pool_kv_->block(0),
                      L.bytes_per_block(),
                      L.offset(layer, 0, 0),
                      L.offset(layer, 1, 0),
                      L.row_bytes(0),
                      L.row_bytes(1),
                      kv_storage_type(L.k_type),
                      kv_storage_type(L.v_type),
                      hd,
                      c.n_head * hd,
                      c.n_head_kv * hd,
                      group,
                      c.attn_scale,
                      c.is_swa(layer) ? c.n_swa : 0};
  const CpuAttendFn attend = cpu_attend(cpu_isa(), hd);
  const int64_t per_item = std::max<int64_t>(1, kAttnMaxQueries / group);
  attn_items_.clear();
  for (int64_t t = 0; t < T;) {
    const BatchRowMeta& r = batch.rows[static_cast<size_t>(t)];
    int64_t e = t + 1;
    while (e < T && e - t < per_item && batch.rows[static_cast<size_t>(e)].table == r.table &&
           batch.rows[static_cast<size_t>(e)].seq == r.seq)
      ++e;
    const int64_t cost = batch.rows[static_cast<size_t>(e - 1)].pos + 1;  // keys of its last token
    for (int64_t h = 0; h < c.n_head_kv; ++h)
      attn_items_.push_back(AttnItem{cost, static_cast<int32_t>(t), static_cast<int32_t>(e),
                                     static_cast<int32_t>(h), r.table});
    t = e;
  }
  std::sort(attn_items_.begin(), attn_items_.end(),
            [](const AttnItem& a, const AttnItem& b) { return a.cost > b.cost; });
  const int32_t* tables = batch.block_tables.data() + L.group(layer) * batch.group_stride;
  const auto run = [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const AttnItem& it = attn_items_[static_cast<size_t>(i)];
      attend(args, tables + it.table, it.t0, it.t1, it.kvh);
    }
  };
  const int64_t n = static_cast<int64_t>(attn_items_.size());
  if (n == 1 || pool_->size() == 1) {
    run(0, n, 0);
  } else {
    pool_->parallel_for(n, run);
  }
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) {
  return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace barata
