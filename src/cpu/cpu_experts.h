// A mixture of experts' experts on the CPU: the grouped computation the CPU
// backend's moe() runs, and the same behind a small interface for another
// backend that keeps the experts in host memory (--experts-on cpu: the CUDA
// backend runs attention and the dense parts, these run the experts).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "barata/model.h"
#include "barata/moe.h"
#include "cpu/matmul.h"

namespace barata {

class ThreadPool;
struct CpuVectorOps;

// What the experts' computation reuses from step to step (grown, never shrunk).
struct ExpertScratch {
  PreparedActs in[2], down_in;
  std::vector<float> gate, up, y;
};

// acc[t * d + i] += sum_j weights[t][j] * expert_(ids[t][j])(x[t])[i], for
// the n_tokens rows routed in g: each active expert's gate and up on the
// rows that chose it (gathered from x_gate / x_up: the rows converted for
// the gate's and the up's kernels), SwiGLU, its down, then per token the
// chosen experts' outputs summed in the order chosen and added. views: by
// WeightDesc::id (the experts' at least).
void cpu_run_experts(ThreadPool& pool, const CpuVectorOps& vec,
                     const std::vector<WeightView>& views, const LayerWeights& L,
                     const ExpertGroups& g, const PreparedActs& x_gate, const PreparedActs& x_up,
                     float* acc, int64_t d, int64_t f, ExpertScratch& s);

// Every expert matrix of a model bound to this CPU's kernels (repacked where
// they want), with a pool of its own.
class HostExperts {
 public:
  virtual ~HostExperts() = default;
  // acc (n_tokens x d_model, host) += the experts of xn (host) as g routed them.
  virtual void run(const LayerWeights& L, const ExpertGroups& g, const float* xn, float* acc) = 0;
  virtual int64_t repacked_bytes() const = 0;
};
std::unique_ptr<HostExperts> make_host_experts(const Model& model, int n_threads);

}  // namespace barata
