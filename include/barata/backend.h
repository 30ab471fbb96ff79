// The seam between the one forward pass (Engine::forward) and the hardware
// that runs it. A backend is chosen once, when the engine is made
// (--device cpu|cuda); prepare() uploads the weights in their stored type,
// binds one kernel per weight and allocates the KV pool, once. The engine
// records its step once (step.h) and hands it over whole: run_step runs its
// ops through the op calls below, in order, on buffers the backend owns.
//
// Activations are fp32 row-major (batch rows x width). Every op works on the
// batch of the last begin(): its rows, positions and cache slots.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "barata/batch.h"
#include "barata/kv_cache.h"
#include "barata/model.h"
#include "barata/step.h"

namespace barata {

enum class DeviceKind { kCpu, kCuda };
const char* device_name(DeviceKind d);                          // "cpu", "cuda"
std::optional<DeviceKind> parse_device(std::string_view name);  // "cpu", "cuda"

struct BackendOptions {
  DeviceKind device = DeviceKind::kCpu;
  int n_threads = 0;  // CPU: 0 = one per hardware thread; CUDA: host threads (unused)
  // CUDA: the widest batch the skinny matmul kernels take for quantized
  // weights, 0..64 (0: always dequant + cuBLAS); -1: BARATA_CUDA_QMM_MAX or
  // the default (docs/cuda.md, "Kernel choice").
  int cuda_skinny_max = -1;
  // CUDA: the skinny kernels quantize the activations to 8 bits (as the CPU's
  // kernels do) for every weight type whose arithmetic allows it: 1 yes, 0 no
  // (fp32 activations), -1 BARATA_CUDA_Q8_ACT (default yes).
  int cuda_q8_activations = -1;
  // A mixture of experts' expert tensors stay in host memory and run on the
  // CPU (n_threads threads) while the rest runs on the device: the
  // activations cross once each way per MoE layer (--experts-on cpu). CUDA
  // only; the CPU backend runs everything on the CPU anyway.
  bool experts_on_cpu = false;
};

// The kernel one matmul ran for a weight type at a batch width (rows).
struct KernelChoice {
  std::string weight_type;  // "Q4_K"
  int64_t width = 0;        // activation rows of the matmul
  std::string kernel;       // "qmm<Q4_K, 4 rows x 8 tokens>", "gemv<Q8_0>", ...
};

// What a backend tells bench: its device, memory and peaks.
struct DeviceReport {
  std::string name;                   // "cpu: 2 threads, avx2" or the GPU's name
  double peak_gb_per_s = 0;           // memory bandwidth from the spec sheet (0: unknown)
  double peak_fp16_tflops = 0;        // dense fp16 tensor peak (0: unknown)
  int64_t weight_bytes = 0;           // what prepare() holds for the weights
  int64_t kv_pool_bytes = 0;          // the pool allocated for the KV cache
  int64_t peak_bytes = 0;             // device memory in use at its peak (0: not measured)
  int64_t graphs_captured = 0;        // CUDA: decode steps captured as graphs (one per width)
  int64_t graph_replays = 0;          // CUDA: steps run by replaying one
  std::vector<std::string> notes;     // e.g. weight types that took a slower path
  std::vector<KernelChoice> kernels;  // by (type, width); empty where there is one path
};

// A streaming read over a buffer in the backend's memory (bench's roofline).
class BandwidthProbe {
 public:
  virtual ~BandwidthProbe() = default;
  virtual double run_gb_per_s() = 0;  // one timed pass
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual int n_threads() const { return 1; }

  // Binds and uploads the weights and allocates the pool of n_blocks KV
  // blocks and scratch for n_ctx positions. Throws barata::Error (what is
  // needed, what is free) before allocating anything when it cannot fit.
  virtual void prepare(const Model& model, const KvLayout& kv, int64_t n_blocks, int64_t n_ctx) = 0;

  // The calibrated per-channel key scales of a scaled K type (kv_types.h,
  // kv_calibrate.h): n_layer x kv_dim powers of two. Set before prepare.
  void set_key_scales(std::vector<float> s) { key_scale_ = std::move(s); }

  // Called at the end of every rope_kv with the rows x q_dim queries and
  // rows x kv_dim keys as it leaves them, on the host: after RoPE, and after
  // what the K type does to them (none for f16, the cache kv_calibrate.cpp
  // measures with). The CPU backend has it; the others throw.
  using QkObserver =
      std::function<void(int64_t layer, const float* q, const float* k, int64_t rows)>;
  virtual void set_qk_observer(QkObserver f);

  // The step the engine will run (recorded once, include/barata/step.h; it
  // outlives the backend's use of it). A backend may plan over it: which
  // matmuls read an activation, which layer an op is of. Ops called outside
  // run_step (the op tests) run without it.
  virtual void set_program(const StepProgram* program) { program_ = program; }

  // The batch every following op works on (metadata uploaded here), and the
  // activation buffers sized for it.
  virtual void begin(const Batch& batch) = 0;

  // Runs the program on the batch of the last begin(): step_begin, each op
  // in order through the op calls below (op_ pointing at it), step_end;
  // on_layer_end gets each layer's index after its last op (may be empty).
  void run_step(const StepProgram& program, const Batch& batch, const ModelConfig& c,
                float* host_logits, const std::function<void(int64_t)>& on_layer_end);
  virtual float* act(Act a) = 0;

  // x = rows of the embedding table for the batch's tokens, times the
  // config's embed_scale.
  virtual void embed(float* x) = 0;
  // y = rmsnorm(x) * w, row by row (width d), for every batch row.
  virtual void rms_norm(const float* x, const std::vector<float>& w, float* y, int64_t d) = 0;
  // y = x W^T for every batch row (the backend picks GEMV or GEMM from the width).
  virtual void matmul(const WeightDesc& w, const float* x, float* y) = 0;
  // In place: an RMSNorm of each of the n_heads heads of every batch row of
  // x (head_dim values each), times the gains w (head_dim), the model's eps.
  virtual void head_norm(float* x, const std::vector<float>& w, int64_t n_heads) = 0;
  virtual void add_bias(float* y, const std::vector<float>& b) = 0;  // per row
  // RoPE on q and k, then k and v stored into the batch's cache slots of
  // `layer` in the cache's types; with a rotated K type (kv_types.h) each
  // head of k is rotated by H and each head of q by H / head_dim first.
  virtual void rope_kv(int64_t layer, float* q, float* k, const float* v) = 0;
  // Causal attention of every row against its sequence's cache of `layer`
  // (within the last n_swa positions when the layer is windowed), scores
  // scaled by the config's attn_scale.
  virtual void attention(int64_t layer, const float* q, float* out) = 0;
  virtual void swiglu(float* gate, const float* up, int64_t n) = 0;  // gate = silu(gate) * up
  // gate = gelu(gate) * up, GELU's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void geglu(float* gate, const float* up, int64_t n) = 0;
  virtual void add(float* x, const float* y, int64_t n) = 0;  // x += y
  // The two above after a matmul, which a backend may fuse into its matmul's
  // output (the CUDA backend does: two launches a layer fewer, and three for
  // q/k/v biases), with the same additions. y = x W^T + b (b may be empty):
  virtual void matmul_bias(const WeightDesc& w, const float* x, float* y,
                           const std::vector<float>& b) {
    matmul(w, x, y);
    if (!b.empty()) add_bias(y, b);
  }
  // acc += x W^T, n = the batch's rows x w.n_rows; scratch takes x W^T where
  // the backend does not fuse (its contents are undefined after).
  virtual void matmul_add(const WeightDesc& w, const float* x, float* acc, float* scratch,
                          int64_t n) {
    matmul(w, x, scratch);
    add(acc, scratch, n);
  }
  // acc += the layer's mixture of experts of xn, every batch row: the router
  // (L.router), each row's experts chosen and weighed by route_experts
  // (moe.h), each chosen expert's SwiGLU FFN, their outputs summed in the
  // order chosen, then added to acc. A backend without it says so.
  virtual void moe(const LayerWeights& L, const float* xn, float* acc);
  // Final norm of the rows that want logits, the output matmul, and the
  // logits (batch.logit_rows.size() x n_vocab) copied to the host.
  virtual void logits(const float* x, float* host_logits) = 0;

  // Activation transfers (tests and debugging): n floats.
  virtual void to_device(float* dst, const float* host, int64_t n) = 0;
  virtual void to_host(float* host, const float* src, int64_t n) = 0;
  // K or V (kv = 0 / 1) of `layer` at a physical cache slot to the host:
  // KvLayout::row_bytes(kv) bytes, the row as stored in the cache's type.
  virtual void kv_to_host(int64_t layer, int kv, int32_t slot, uint8_t* host) = 0;

  virtual void copy_kv_blocks(const std::vector<KvBlockManager::Copy>& copies) = 0;
  virtual void synchronize() = 0;

  virtual DeviceReport report() const = 0;
  virtual std::unique_ptr<BandwidthProbe> bandwidth_probe(int64_t bytes) = 0;

 protected:
  // Around the ops of run_step. step_begin returns true when the backend has
  // run the whole step itself (the CUDA backend replaying the graph it
  // captured of this step), so that no op is called; `capturable`: no host
  // code runs between the ops (there is no on_layer_end). step_end follows
  // the last op (or the replay); the logits then reach the host buffer given
  // to the logits op. A step that throws skips step_end.
  virtual bool step_begin(bool capturable) { return false; }
  virtual void step_end(float* host_logits) {}

  const StepProgram* program_ = nullptr;
  std::vector<float> key_scale_;  // set_key_scales
  // The op of run_step's program being run and its index (null and -1
  // outside run_step: the op tests call ops one by one, and a backend then
  // reuses and fuses nothing).
  const StepOp* op_ = nullptr;
  int64_t op_index_ = -1;
};

// RoPE tables of positions [p0, p1), row p - p0 holding rope_dims / 2 values:
// theta_i = pos * base^(-2i / rope_dims) / factor_i (rope_freqs.weight, Llama
// 3.1+), then the file's scaling (linear: times 1 / factor; YaRN: a ramp
// between the two and cos, sin times its magnitude factor), in double,
// rounded to fp32 once. Every backend's tables come from here, so their
// angles are the same.
// n_ctx: the context the engine runs with (it picks Phi-3's long or short
// factors); swa: the tables of the sliding-window layers (their own base, no
// scaling).
void rope_tables(const ModelConfig& c, int64_t p0, int64_t p1, float* cos, float* sin,
                 int64_t n_ctx, bool swa = false);

// The keys' constant part, per layer (n_layer x kv_dim floats, zero for a
// layer without a k_proj bias): each head's bias after RoPE, averaged over
// the positions [0, n_ctx) the engine runs (RoPE's tables above), so the
// offset of a low-frequency pair, which hardly turns over the context, is
// the bias itself. Subtracting any constant vector from every key of a head
// leaves attention unchanged (q.(k - c) = q.k - q.c shifts every score of a
// query by the same amount, and softmax ignores that); subtracting this one
// takes Qwen2's huge bias channels (|b| up to 145 in layer 0 of the 0.5B,
// all in its slowest pairs) out of the values a K cache quantizes.
std::vector<float> key_offsets(const Model& model, int64_t n_ctx);

// The backend for opts.device. CUDA in a build without it, or on a machine
// without a usable GPU, is one barata::Error saying why.
std::unique_ptr<Backend> make_backend(const BackendOptions& opts);

}  // namespace barata
