#include "cpu/cpu_experts.h"

#include <cstring>

#include <spdlog/spdlog.h>

#include "cpu/isa.h"
#include "cpu/thread_pool.h"

namespace barata {
namespace {

// A view of rows [r0, r0 + n) of prepared activations (no copy).
PreparedActs act_rows(const PreparedActs& a, int64_t r0, int64_t n) {
  PreparedActs v;
  v.format = a.format;
  v.k = a.k;
  v.n_tokens = n;
  v.stride = a.stride;
  v.data = a.data + static_cast<size_t>(r0) * a.stride;
  return v;
}

// out's row g = in's row token[g], for the n grouped rows.
void gather_act_rows(const PreparedActs& in, const int32_t* token, int64_t n, PreparedActs& out) {
  out.format = in.format;
  out.k = in.k;
  out.n_tokens = n;
  out.stride = in.stride;
  out.bytes.resize(in.stride * static_cast<size_t>(n));
  for (int64_t g = 0; g < n; ++g)
    std::memcpy(out.bytes.data() + static_cast<size_t>(g) * in.stride,
                in.data + static_cast<size_t>(token[g]) * in.stride, in.stride);
  out.data = out.bytes.data();
}

// Element-wise work on the pool when it is big enough to pay for the fork.
template <typename F>
void split(ThreadPool& pool, int64_t n, int64_t min_parallel, F&& fn) {
  if (n < min_parallel || pool.size() == 1) return fn(int64_t{0}, n);
  pool.parallel_for(n, [&](int64_t a, int64_t b, int) { fn(a, b); });
}

}  // namespace

// The rows that chose each expert are multiplied by its weights together
// (each expert read once per step), its gate and up from one grouped copy
// of the input; the outputs are summed per token in the order chosen, as
// llama.cpp sums them, and added.
void cpu_run_experts(ThreadPool& pool, const CpuVectorOps& vec,
                     const std::vector<WeightView>& views, const LayerWeights& L,
                     const ExpertGroups& g, const PreparedActs& x_gate, const PreparedActs& x_up,
                     float* acc, int64_t d, int64_t f, ExpertScratch& s) {
  const int64_t T = g.n_tokens, K = g.n_used, P = T * K;
  auto view = [&](const WeightDesc& w) -> const WeightView& {
    return views[static_cast<size_t>(w.id)];
  };
  gather_act_rows(x_gate, g.token.data(), P, s.in[0]);
  const bool same = x_up.data == x_gate.data;
  if (!same) gather_act_rows(x_up, g.token.data(), P, s.in[1]);
  const PreparedActs& in_up = same ? s.in[0] : s.in[1];
  s.gate.resize(static_cast<size_t>(P * f));
  s.up.resize(static_cast<size_t>(P * f));
  s.y.resize(static_cast<size_t>(P * d));
  for (const int32_t e : g.active) {
    const auto ex = static_cast<size_t>(e);
    const int64_t r0 = g.start[ex], n = g.start[ex + 1] - r0;
    matmul(pool, view(L.gate_exps[ex]), act_rows(s.in[0], r0, n), s.gate.data() + r0 * f, f);
    matmul(pool, view(L.up_exps[ex]), act_rows(in_up, r0, n), s.up.data() + r0 * f, f);
  }
  split(pool, P * f, int64_t{1} << 15, [&](int64_t i0, int64_t i1) {
    // Whole elements: a range of the flat P x f array.
    vec.swiglu(s.gate.data() + i0, s.up.data() + i0, i1 - i0);
  });
  const WeightView& down0 = view(L.down_exps[0]);
  prepare_acts(pool, down0.kernel->act, s.gate.data(), P, f, s.down_in);
  for (const int32_t e : g.active) {
    const auto ex = static_cast<size_t>(e);
    const int64_t r0 = g.start[ex], n = g.start[ex + 1] - r0;
    matmul(pool, view(L.down_exps[ex]), act_rows(s.down_in, r0, n), s.y.data() + r0 * d, d);
  }
  split(pool, T, std::max<int64_t>(1, (int64_t{1} << 15) / (d * K)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* out = acc + t * d;
      const float* y0 =
          s.y.data() + static_cast<int64_t>(g.slot_at[static_cast<size_t>(t * K)]) * d;
      const float w0 = g.weights[static_cast<size_t>(t * K)];
      for (int64_t i = 0; i < d; ++i) {
        float sum = y0[i] * w0;
        for (int64_t j = 1; j < K; ++j)
          sum += s.y[static_cast<size_t>(g.slot_at[static_cast<size_t>(t * K + j)]) * d + i] *
                 g.weights[static_cast<size_t>(t * K + j)];
        out[i] += sum;
      }
    }
  });
}

namespace {

class HostExpertsImpl final : public HostExperts {
 public:
  HostExpertsImpl(const Model& model, int n_threads)
      : model_(model),
        pool_(n_threads > 0 ? n_threads : ThreadPool::default_threads()),
        vec_(cpu_vector_ops(cpu_isa())) {
    const CpuIsa isa = cpu_isa();
    const bool repack = cpu_repack_enabled();
    views_.assign(static_cast<size_t>(model.n_matrices()), WeightView{});
    std::vector<std::pair<size_t, size_t>> copies;
    for (const LayerWeights& L : model.layers())
      for (const auto* v : {&L.gate_exps, &L.up_exps, &L.down_exps})
        for (const WeightDesc& w : *v) {
          const auto id = static_cast<size_t>(w.id);
          views_[id] = WeightView{w.type, w.k,         w.n_rows,
                                  w.data, w.row_bytes, &cpu_matmul_kernel(w.type, w.k, isa, repack),
                                  w.scale};
          if (wants_repack(views_[id]))
            copies.emplace_back(id, arena_.reserve(barata::repacked_bytes(views_[id])));
        }
    if (!copies.empty()) {
      arena_.allocate();
      for (const auto& [id, offset] : copies) repack_weight(pool_, views_[id], arena_.at(offset));
    }
    spdlog::info("experts on the cpu: {} threads, {} matrices, {:.1f} MiB repacked", pool_.size(),
                 copies.size(), static_cast<double>(arena_.size()) / (1 << 20));
  }

  void run(const LayerWeights& L, const ExpertGroups& g, const float* xn, float* acc) override {
    const ModelConfig& c = model_.config();
    const WeightView& gate0 = views_[static_cast<size_t>(L.gate_exps[0].id)];
    const WeightView& up0 = views_[static_cast<size_t>(L.up_exps[0].id)];
    prepare_acts(pool_, gate0.kernel->act, xn, g.n_tokens, c.d_model, x_[0]);
    const bool same = up0.kernel->act == gate0.kernel->act;
    if (!same) prepare_acts(pool_, up0.kernel->act, xn, g.n_tokens, c.d_model, x_[1]);
    cpu_run_experts(pool_, vec_, views_, L, g, x_[0], same ? x_[0] : x_[1], acc, c.d_model,
                    c.d_ff_exp, scratch_);
  }

  int64_t repacked_bytes() const override { return static_cast<int64_t>(arena_.size()); }

 private:
  const Model& model_;
  ThreadPool pool_;
  CpuVectorOps vec_;
  std::vector<WeightView> views_;
  RepackArena arena_;
  PreparedActs x_[2];
  ExpertScratch scratch_;
};

}  // namespace

std::unique_ptr<HostExperts> make_host_experts(const Model& model, int n_threads) {
  return std::make_unique<HostExpertsImpl>(model, n_threads);
}

}  // namespace barata
