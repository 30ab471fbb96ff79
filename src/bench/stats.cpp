// Summary statistics of repeated measurements, and what the report says about
// the model and the machine.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "barata/kv_cache.h"
#include "barata/bench.h"
#include "barata/dtype.h"

namespace barata::bench {

Stats summarize(std::span<const double> samples) {
  Stats s;
  s.n = static_cast<int64_t>(samples.size());
  if (samples.empty()) return s;
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  // The mean of identical doubles can round one ulp outside [min, max].
  s.mean = std::clamp(sum / static_cast<double>(v.size()), v.front(), v.back());
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(ss / static_cast<double>(v.size() - 1)) : 0.0;
  const size_t m = v.size() / 2;
  s.median = v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
  s.min = v.front();
  s.max = v.back();
  return s;
}

ModelInfo model_info(const Model& model, const std::string& path, int64_t n_ctx, KvType k,
                     KvType v) {
  const ModelConfig& c = model.config();
  ModelInfo m;
  m.path = path;
  m.arch = c.arch;
  m.weight_type = model.layers().empty() ? "" : dtype_name(model.layers()[0].wq.type);
  m.n_layer = c.n_layer;
  m.d_model = c.d_model;
  m.n_head = c.n_head;
  m.n_head_kv = c.n_head_kv;
  m.head_dim = c.head_dim;
  m.d_ff = c.d_ff;
  m.n_vocab = c.n_vocab;
  m.n_ctx = n_ctx;
  m.weight_bytes = model.weight_bytes();
  m.kv_bytes_per_token =
      KvLayout::uniform(c.n_layer, c.n_head_kv * c.head_dim, k, v).bytes_per_token();
  m.kv_cache = kv_cache_label(k, v);
  m.kv_bytes_at_ctx = kv_sequence_bytes(c, n_ctx, false, k, v);
  m.total_weight_bytes = model.total_weight_bytes();
  m.n_expert = c.n_expert;
  m.n_expert_used = c.n_expert_used;
  m.d_ff_exp = c.d_ff_exp;
  // An expert's matrices count n_used / n_expert: every expert is the same size.
  int64_t expert_params = 0;
  for (const LayerWeights& L : model.layers())
    for (const auto* v : {&L.gate_exps, &L.up_exps, &L.down_exps})
      for (const WeightDesc& w : *v) expert_params += w.k * w.n_rows;
  const int64_t inactive =
      c.moe() ? expert_params - expert_params / c.n_expert * c.n_expert_used : 0;
  for (const WeightDesc* w : model.matrices())
    if (w->id != model.token_embd().id || c.tied_embeddings) m.matmul_params += w->k * w->n_rows;
  m.matmul_params -= inactive;
  for (const GgufTensorInfo& t : model.file().tensors()) m.total_params += t.n_elements;
  m.active_params = m.total_params - inactive;
  return m;
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t b = line.find_first_not_of(" \t", colon + 1);
        return b == std::string::npos ? "" : line.substr(b);
      }
    }
  }
  return "unknown";
}

int32_t synthetic_token(int64_t i, int64_t n_vocab) {
  // A fixed odd stride walks the vocabulary without repeating soon; ids 0-2
  // (often unk/bos/eos) are skipped.
  if (n_vocab <= 3) return static_cast<int32_t>(i % std::max<int64_t>(n_vocab, 1));
  const int64_t span = n_vocab - 3;
  return static_cast<int32_t>(3 + (i * 7919 + 101) % span);
}

}  // namespace barata::bench
