#include "cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#ifdef BARATA_CUDA_EMU
// Under the host emulation (tests/emu_backend/): the same host code, every
// kernel emulated, cuBLAS a plain loop, graphs recorded and replayed.
#include "emu/host_runtime.h"
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

#include "argmax.cuh"
#include "attention.cuh"
#include "barata/error.h"
#include "barata/half.h"
#include "barata/kv_calibrate.h"
#include "barata/moe.h"
#include "cpu/cpu_experts.h"
#include "dequant.cuh"
#ifndef BARATA_CUDA_EMU
#include "device.cuh"
#endif
#include "elementwise.cuh"
#include "embed.cuh"
#include "gemv.cuh"
#include "moe.cuh"
#include "qmm.cuh"
#include "rmsnorm.cuh"
#include "rope_kv.cuh"

namespace barata {
namespace {

using namespace barata::cuda;

// Host-side runtime calls: a failure is one barata::Error naming the call.
#define BARATA_CUDA_CHECK(expr)                                               \
  do {                                                                        \
    const cudaError_t barata_err_ = (expr);                                   \
    if (barata_err_ != cudaSuccess)                                           \
      fail("CUDA: {} ({}) from {} at {}:{}", cudaGetErrorString(barata_err_), \
           cudaGetErrorName(barata_err_), #expr, __FILE__, __LINE__);         \
  } while (0)

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}

#define BARATA_CUBLAS_CHECK(expr, what)                                                     \
  do {                                                                                      \
    const cublasStatus_t barata_st_ = (expr);                                               \
    if (barata_st_ != CUBLAS_STATUS_SUCCESS)                                                \
      fail("CUDA: cuBLAS {} failed: {} ({})", what, cublas_status_name(barata_st_), #expr); \
  } while (0)

std::string mib(int64_t bytes) {
  return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB";
}

bool env_on(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return dflt;
  return std::strcmp(v, "0") != 0;
}

// BARATA_CUDA_QMM_MAX: the widest batch the skinny kernels (gemv, qmm) take
// for a quantized weight; wider ones dequantize to fp16 for cuBLAS. The
// default is the H200's measured crossover (docs/cuda.md, "Kernel choice"):
// dequant + cuBLAS was at least as fast from B = 8 for Q8_0 and NF4, and
// from B = 1 for Q4_K (within 4% up to B = 2).
constexpr int64_t kDefaultQmmMax = 4;
int64_t qmm_max_from_env() {
  const char* v = std::getenv("BARATA_CUDA_QMM_MAX");
  if (v == nullptr || *v == '\0') return kDefaultQmmMax;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > kQmmMaxTokens)
    fail("BARATA_CUDA_QMM_MAX={}: want a width from 0 (always cuBLAS) to {}", v, kQmmMaxTokens);
  return n;
}

// How one matmul of a given weight type and batch width runs.
enum class MatmulPath { kGemv, kQmm, kCublasF16, kDequantCublas };

MatmulPath choose_matmul(DType type, int64_t n, int64_t qmm_max) {
  if (n <= std::min(kGemvMaxTokens, qmm_max) && gemv_supported(type)) return MatmulPath::kGemv;
  const bool is_float = type == DType::F32 || type == DType::F16 || type == DType::BF16;
  if (!is_float && n <= qmm_max && qmm_supported(type)) return MatmulPath::kQmm;
  return type == DType::F16 ? MatmulPath::kCublasF16 : MatmulPath::kDequantCublas;
}

// Dense fp16 tensor-core FLOPs per SM per clock (fp32 accumulate), from the
// vendors' architecture whitepapers; 0 where barata does not know the chip.
double fp16_flops_per_sm_clock(int major, int minor) {
  if (major == 9) return 4096;                 // Hopper (H100/H200)
  if (major == 8 && minor == 0) return 2048;   // A100
  if (major == 8 || major == 12) return 1024;  // Ampere/Ada/Blackwell consumer parts
  if (major == 10) return 8192;                // Blackwell data-centre parts
  return 0;
}

// Device memory the backend owns, counted so that bench can report its peak.
class DeviceArena {
 public:
  void* alloc(int64_t bytes, const std::string& what) {
    if (bytes <= 0) return nullptr;
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail("CUDA: cannot allocate {} for {}: {} ({} of {} free)", mib(bytes), what,
           cudaGetErrorString(err), mib(static_cast<int64_t>(free_b)),
           mib(static_cast<int64_t>(total_b)));
    }
    sizes_[p] = bytes;
    live_ += bytes;
    peak_ = std::max(peak_, live_);
    return p;
  }
  void free(void* p) {
    if (p == nullptr) return;
    auto it = sizes_.find(p);
    if (it != sizes_.end()) {
      live_ -= it->second;
      sizes_.erase(it);
    }
    cudaFree(p);
  }
  ~DeviceArena() {
    for (auto& [p, n] : sizes_) cudaFree(p);
  }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }

 private:
  std::unordered_map<void*, int64_t> sizes_;
  int64_t live_ = 0, peak_ = 0;
};

// A device buffer that grows (never shrinks) and says when it moved.
struct Grow {
  void* p = nullptr;
  int64_t bytes = 0;
  bool ensure(DeviceArena& a, int64_t want, const char* what) {
    if (want <= bytes) return false;
    a.free(p);
    p = a.alloc(want, what);
    bytes = want;
    return true;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

struct DevWeight {
  DType type = DType::F32;  // as stored on the device (F16 when converted at upload)
  const void* data = nullptr;
  size_t row_bytes = 0;
  int64_t k = 0, n_rows = 0;
  float scale = 1.0f;
  bool converted = false;  // dequantized to F16 on the host at upload
};

class CudaBandwidthProbe final : public BandwidthProbe {
 public:
  CudaBandwidthProbe(DeviceArena& a, int64_t bytes, cudaStream_t s) : arena_(a), stream_(s) {
    n_ = std::max<int64_t>(bytes / 4, 1 << 20);
    src_ = static_cast<float*>(arena_.alloc(n_ * 4, "the bandwidth probe"));
    dst_ = static_cast<float*>(arena_.alloc(n_ * 4, "the bandwidth probe"));
    BARATA_CUDA_CHECK(cudaMemsetAsync(src_, 0, static_cast<size_t>(n_ * 4), stream_));
    BARATA_CUDA_CHECK(cudaEventCreate(&e0_));
    BARATA_CUDA_CHECK(cudaEventCreate(&e1_));
  }
  ~CudaBandwidthProbe() override {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    arena_.free(src_);
    arena_.free(dst_);
  }
  // A device-to-device copy reads and writes each byte once: 2n bytes moved.
  double run_gb_per_s() override {
    BARATA_CUDA_CHECK(cudaEventRecord(e0_, stream_));
    BARATA_CUDA_CHECK(cudaMemcpyAsync(dst_, src_, static_cast<size_t>(n_ * 4),
                                      cudaMemcpyDeviceToDevice, stream_));
    BARATA_CUDA_CHECK(cudaEventRecord(e1_, stream_));
    BARATA_CUDA_CHECK(cudaEventSynchronize(e1_));
    float ms = 0;
    BARATA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
    return 2.0 * static_cast<double>(n_ * 4) / (static_cast<double>(ms) * 1e6);
  }

 private:
  DeviceArena& arena_;
  cudaStream_t stream_;
  int64_t n_ = 0;
  float* src_ = nullptr;
  float* dst_ = nullptr;
  cudaEvent_t e0_{}, e1_{};
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opts) {
    std::string why;
    if (!cuda_device_available(&why)) fail("--device cuda: no usable GPU: {}", why);
    BARATA_CUDA_CHECK(cudaGetDevice(&device_));
    BARATA_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
    BARATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    BARATA_CUBLAS_CHECK(cublasCreate(&cublas_), "create");
    BARATA_CUBLAS_CHECK(cublasSetStream(cublas_, stream_), "set stream");
    // A fixed workspace: cuBLAS then allocates nothing inside a captured graph.
    cublas_ws_ = arena_.alloc(kCublasWorkspace, "the cuBLAS workspace");
    BARATA_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, kCublasWorkspace), "workspace");
    graphs_on_ = env_on("BARATA_CUDA_GRAPHS", true);
    sync_each_op_ = env_on("BARATA_CUDA_SYNC", false);
    if (opts.cuda_skinny_max > kQmmMaxTokens)
      fail("CUDA: a skinny-kernel width of {} (0..{})", opts.cuda_skinny_max, kQmmMaxTokens);
    qmm_max_ = opts.cuda_skinny_max >= 0 ? opts.cuda_skinny_max : qmm_max_from_env();
    q8_act_ = opts.cuda_q8_activations >= 0 ? opts.cuda_q8_activations != 0
                                            : env_on("BARATA_CUDA_Q8_ACT", true);
    experts_on_cpu_ = opts.experts_on_cpu;
    host_threads_ = opts.n_threads;
  }

  ~CudaBackend() override {
    abandon_capture();
    drop_graphs();
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
    if (pinned_) cudaFreeHost(pinned_);
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }

  void prepare(const Model& model, const KvLayout& kv, int64_t n_blocks, int64_t n_ctx) override;
  void begin(const Batch& batch) override;
  float* act(Act a) override { return acts_[static_cast<size_t>(a)].as<float>(); }

  void embed(float* x) override {
    const DevWeight& e = weights_[static_cast<size_t>(model_->token_embd().id)];
    launch_embed(e.type, e.data, e.row_bytes, e.scale * model_->config().embed_scale, e.k,
                 d_tokens(), rows_, x, stream_);
    after("embed");
  }

  // A norm whose output a matmul reads on 8-bit activations writes that
  // copy too, in the same launch (so does swiglu, for the down projection).
  void rms_norm(const float* x, const std::vector<float>& w, float* y, int64_t d) override {
    const Q8Out q8 = q8_read(op_readers(OpKind::kRmsNorm), rows_, d) ? q8_out() : Q8Out{};
    launch_rmsnorm(x, vec(w), y, rows_, d, model_->config().norm_eps, nullptr, stream_, q8);
    after("rms_norm");
    if (q8.xq) q8_from_ = op_index_;
  }

  void matmul(const WeightDesc& w, const float* x, float* y) override {
    run_matmul(weights_[static_cast<size_t>(w.id)], x, rows_, y, {}, x_from());
  }
  // The bias and the residual add in the matmul's output (the kernels'
  // Epilogue; through cuBLAS: its beta, and add_bias after).
  void matmul_bias(const WeightDesc& w, const float* x, float* y,
                   const std::vector<float>& b) override {
    run_matmul(weights_[static_cast<size_t>(w.id)], x, rows_, y,
               {.bias = b.empty() ? nullptr : vec(b)}, x_from());
  }
  void matmul_add(const WeightDesc& w, const float* x, float* acc, float*, int64_t n) override {
    if (n != rows_ * w.n_rows)
      fail("internal: CUDA matmul_add of {} values for {} rows x {}", n, rows_, w.n_rows);
    run_matmul(weights_[static_cast<size_t>(w.id)], x, rows_, acc, {.accumulate = true}, x_from());
  }

  void moe(const LayerWeights& L, const float* xn, float* acc) override;

  void head_norm(float* x, const std::vector<float>& w, int64_t n_heads) override {
    launch_rmsnorm(x, vec(w), x, rows_ * n_heads, static_cast<int64_t>(w.size()),
                   model_->config().norm_eps, nullptr, stream_, Q8Out{});
    after("head_norm");
  }

  void add_bias(float* y, const std::vector<float>& b) override {
    launch_add_bias(y, vec(b), rows_, static_cast<int64_t>(b.size()), stream_);
    after("add_bias");
  }

  void rope_kv(int64_t layer, float* q, float* k, const float* v) override {
    launch_rope_kv(q, k, v, d_rows(), rows_, model_->config().is_swa(layer) ? rope_swa_ : rope_,
                   kv_view(layer), stream_);
    after("rope_kv");
  }

  void attention(int64_t layer, const float* q, float* out) override {
    const AttnArgs& attn = model_->config().is_swa(layer) ? attn_swa_ : attn_;
    if (decode_shape_) {
      launch_attention_decode(q, out, d_rows(), rows_, attn, kv_view(layer), split_,
                              workspace_.as<float>(), stream_);
      after("attention_decode");
    } else {
      launch_attention_prefill(q, out, d_rows(), d_tiles(), n_tiles_, attn, kv_view(layer),
                               stream_);
      after("attention_prefill");
    }
  }

  void swiglu(float* gate, const float* up, int64_t n) override { glu(gate, up, n, false); }
  void geglu(float* gate, const float* up, int64_t n) override { glu(gate, up, n, true); }

  void glu(float* gate, const float* up, int64_t n, bool gelu) {
    const int64_t k = model_->config().d_ff;
    if (n == rows_ * k && q8_read(op_readers(gelu ? OpKind::kGeGlu : OpKind::kSwiGlu), rows_, k)) {
      launch_swiglu_q8(gate, up, n, q8_out(), stream_, gelu);
      after("swiglu");
      q8_from_ = op_index_;
      return;
    }
    launch_swiglu(gate, up, n, stream_, gelu);
    after("swiglu");
  }

  void add(float* x, const float* y, int64_t n) override {
    launch_add(x, y, n, stream_);
    after("add");
  }

  void logits(const float* x, float* host_logits) override;

  void to_device(float* dst, const float* host, int64_t n) override {
    abandon_capture();
    BARATA_CUDA_CHECK(
        cudaMemcpyAsync(dst, host, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
    BARATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void to_host(float* host, const float* src, int64_t n) override {
    abandon_capture();
    BARATA_CUDA_CHECK(
        cudaMemcpyAsync(host, src, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, stream_));
    BARATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void kv_to_host(int64_t layer, int kv, int32_t slot, uint8_t* host) override {
    abandon_capture();
    const uint8_t* p = pool_ + (slot / kKvBlockTokens) * layout_.bytes_per_block() +
                       layout_.offset(layer, kv, slot % kKvBlockTokens);
    BARATA_CUDA_CHECK(cudaMemcpyAsync(host, p, static_cast<size_t>(layout_.row_bytes(kv)),
                                      cudaMemcpyDeviceToHost, stream_));
    BARATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void copy_kv_blocks(const std::vector<KvBlockManager::Copy>& copies) override {
    abandon_capture();
    const size_t bytes = static_cast<size_t>(layout_.bytes_per_block());
    for (const auto& c : copies)
      BARATA_CUDA_CHECK(cudaMemcpyAsync(pool_ + c.to * layout_.bytes_per_block(),
                                        pool_ + c.from * layout_.bytes_per_block(), bytes,
                                        cudaMemcpyDeviceToDevice, stream_));
  }

  void synchronize() override {
    abandon_capture();
    BARATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  DeviceReport report() const override {
    DeviceReport r;
    int mem_khz = 0, clk_khz = 0;
    cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, device_);
    cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, device_);
    r.name = std::string(prop_.name) + " (sm_" + std::to_string(prop_.major) +
             std::to_string(prop_.minor) + ", " + std::to_string(prop_.multiProcessorCount) +
             " SMs, " + mib(static_cast<int64_t>(prop_.totalGlobalMem)) + ")";
    // DDR: two transfers per memory clock over the whole bus.
    r.peak_gb_per_s = 2.0 * mem_khz * 1e3 * (prop_.memoryBusWidth / 8.0) / 1e9;
    r.peak_fp16_tflops = fp16_flops_per_sm_clock(prop_.major, prop_.minor) *
                         prop_.multiProcessorCount * clk_khz * 1e3 / 1e12;
    r.weight_bytes = weight_bytes_;
    r.kv_pool_bytes = layout_.bytes_per_block() * n_blocks_;
    r.peak_bytes = arena_.peak();
    r.graphs_captured = graphs_captured_;
    r.graph_replays = graph_replays_;
    r.notes = notes_;
    if (!graphs_on_) r.notes.push_back("CUDA graphs off (BARATA_CUDA_GRAPHS=0)");
    if (!q8_act_) r.notes.push_back("skinny matmuls on fp32 activations (BARATA_CUDA_Q8_ACT=0)");
    for (const auto& [key, kernel] : kernels_)
      r.kernels.push_back({dtype_name(key.first), key.second, kernel});
    return r;
  }

  std::unique_ptr<BandwidthProbe> bandwidth_probe(int64_t bytes) override {
    abandon_capture();
    return std::make_unique<CudaBandwidthProbe>(arena_, bytes, stream_);
  }

 private:
  static constexpr int64_t kCublasWorkspace = 32 << 20;
  static constexpr int64_t kDequantTileBytes = 64 << 20;  // fp16 weight tile for cuBLAS

  // Metadata layout in the one staging upload per batch.
  const int32_t* d_tokens() const { return meta_.as<int32_t>() + off_tokens_; }
  const BatchRowMeta* d_rows() const {
    return reinterpret_cast<const BatchRowMeta*>(meta_.as<int32_t>() + off_rows_);
  }
  const PrefillTile* d_tiles() const {
    return reinterpret_cast<const PrefillTile*>(meta_.as<int32_t>() + off_tiles_);
  }
  const int32_t* d_logit_rows() const { return meta_.as<int32_t>() + off_logit_rows_; }
  const int32_t* d_tables() const { return meta_.as<int32_t>() + off_tables_; }

  KvDeviceView kv_view(int64_t layer) const {
    KvDeviceView v;
    v.pool = pool_;
    v.block_bytes = layout_.bytes_per_block();
    v.layer = static_cast<int32_t>(layout_.index(layer));
    v.kv_dim = static_cast<int32_t>(layout_.kv_dim);
    v.k_row = static_cast<int32_t>(layout_.row_bytes(0));
    v.v_row = static_cast<int32_t>(layout_.row_bytes(1));
    v.k_type = kv_storage_type(layout_.k_type);
    v.v_type = kv_storage_type(layout_.v_type);
    v.rotate_k = kv_type_info(layout_.k_type).rotated;
    v.k_offset = key_off_ ? key_off_ + layer * layout_.kv_dim : nullptr;
    v.k_scale = key_scale_dev_ ? key_scale_dev_ + layer * layout_.kv_dim : nullptr;
    v.block_tokens = static_cast<int32_t>(kKvBlockTokens);
    v.block_tables = d_tables() + static_cast<int64_t>(layout_.group(layer)) * group_stride_;
    return v;
  }

  const float* vec(const std::vector<float>& w) const {
    auto it = vecs_.find(w.data());
    if (it == vecs_.end()) fail("internal: CUDA: a vector the backend was not given at prepare");
    return it->second;
  }

  // Whether a matmul of `ids` on n rows of k takes qmm_q8 (run_matmul's rule).
  bool q8_read(const std::vector<int64_t>& ids, int64_t n, int64_t k) const {
    if (!q8_act_ || k % 32 != 0 || n > kQmmMaxTokens) return false;
    for (int64_t id : ids) {
      const DevWeight& w = weights_[static_cast<size_t>(id)];
      if (w.k == k && qmm_q8_supported(w.type) &&
          choose_matmul(w.type, n, qmm_max_) == MatmulPath::kQmm)
        return true;
    }
    return false;
  }
  Q8Out q8_out() {
    auto* xq = act_q8_.as<signed char>();
    return {xq, reinterpret_cast<float*>(xq + q8_scales_at_)};
  }
  // The op that wrote the current matmul's input in this step (the
  // program's analysis; -1 outside run_step, where nothing is reused).
  int64_t x_from() const { return op_ ? op_->x_from : -1; }

  // A capture that a step which threw left open (run_step skips step_end),
  // closed and dropped before anything else goes on the stream: work put on a
  // capturing stream is recorded instead of run (a copy on write would be
  // lost with the capture) or refused (a read-back). Every entry that puts
  // work on the stream outside the ops calls it first. Inside a step being
  // captured none may run (a step with host code between its ops,
  // on_layer_end, is never captured): one that did would lose the ops
  // recorded so far.
  void abandon_capture() {
    if (!capturing_) return;
    if (op_) fail("internal: CUDA: host work on the stream inside a step being captured");
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    capturing_ = false;
  }
  // Ends the capture in progress and instantiates what it recorded.
  cudaGraphExec_t end_capture() {
    capturing_ = false;
    cudaGraph_t g = nullptr;
    BARATA_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    BARATA_CUDA_CHECK(err);
    return exec;
  }
  void after(const char* op) {
    if (!sync_each_op_ || capturing_) return;
    const cudaError_t err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess)
      fail("CUDA: {} on a batch of {} rows failed: {} ({})", op, rows_, cudaGetErrorString(err),
           cudaGetErrorName(err));
  }

  // x_from: the step's op that wrote x (-1: unknown, x is quantized afresh).
  void run_matmul(const DevWeight& w, const float* x, int64_t n, float* y, const Epilogue& ep,
                  int64_t x_from);
  // Graph capture as a pass over the step: a decode-shaped step (every row its
  // own sequence, each wanting logits, at most kQmmMaxTokens rows) with no
  // host work between its ops is captured whole the first time its width is
  // seen and replayed after; its metadata is uploaded at begin(), at
  // addresses the graph holds.
  bool step_begin(bool capturable) override;
  void step_end(float* host_logits) override;
  // The logits of the batch's rows to the host, then a synchronize that
  // reports a failed step.
  void copy_logits(float* host_logits);
  void set_program(const StepProgram* program) override {
    if (program != program_) drop_graphs();  // captured from another step
    Backend::set_program(program);
  }
  // Rows of a weight dequantized per cuBLAS call: the tile's budget, at most
  // 65535 rows (one grid dimension of the dequantizer).
  static int64_t dequant_tile_rows(const DevWeight& w) {
    return std::max<int64_t>(1,
                             std::min({w.n_rows, kDequantTileBytes / (2 * w.k), int64_t{65535}}));
  }
  void ensure_rows(int64_t n);
  void drop_graphs() {
    for (auto& [w, g] : graphs_) cudaGraphExecDestroy(g);
    graphs_.clear();
  }

  // moe(): the router's logits (device and host), the routing, the grouped
  // inputs, the experts' gate / up / output rows, and the index lists.
  Grow moe_logits_, moe_xg_, moe_gate_, moe_up_, moe_y_, moe_lists_;
  std::vector<float> moe_host_logits_, moe_host_x_, moe_host_y_;
  bool experts_on_cpu_ = false;
  int host_threads_ = 0;
  std::unique_ptr<HostExperts> host_experts_;  // --experts-on cpu
  std::vector<uint8_t> moe_host_lists_;
  ExpertGroups moe_groups_;

  int device_ = 0;
  cudaDeviceProp prop_{};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_ws_ = nullptr;
  DeviceArena arena_;
  bool graphs_on_ = true, sync_each_op_ = false;
  int64_t qmm_max_ = kDefaultQmmMax;
  bool q8_act_ = true;  // the skinny kernels on 8-bit activations where the type allows
  // The kernel each (weight type, batch width) ran, for bench -v and its JSON.
  std::map<std::pair<DType, int64_t>, std::string> kernels_;

  const Model* model_ = nullptr;
  int64_t n_ctx_ = 0;
  std::vector<DevWeight> weights_;  // by WeightDesc::id
  std::unordered_map<const float*, float*> vecs_;
  int64_t weight_bytes_ = 0;
  std::vector<std::string> notes_;
  KvLayout layout_;
  int64_t n_blocks_ = 0;
  uint8_t* pool_ = nullptr;
  float* key_off_ = nullptr;  // key_offsets(), n_layer x kv_dim, for the K types that subtract it
  float* key_scale_dev_ = nullptr;  // key_scale_ (kv_calibrate.h), for the scaled K types
  RopeArgs rope_, rope_swa_;        // the sliding-window layers' tables (the same without any)
  AttnArgs attn_, attn_swa_;        // with the window
  DecodeSplit split_;

  // Per-batch state.
  const Batch* batch_ = nullptr;
  int64_t rows_ = 0, n_tiles_ = 0;
  std::vector<int32_t> seqs_scratch_;       // begin()'s
  std::vector<PrefillTile> tiles_scratch_;  // begin()'s
  bool decode_shape_ = false;
  Grow acts_[static_cast<size_t>(Act::kCount)];
  Grow act_f16_, tile_f16_, workspace_, logits_, meta_, xn_out_;
  // 8-bit activations of up to kQmmMaxTokens rows: the int8 values, then
  // (at q8_scales_at_) one fp32 scale per 32.
  Grow act_q8_;
  int64_t q8_scales_at_ = 0;
  // What act_q8_ holds: the 8-bit copy of the output of op q8_from_ of the
  // step (its x_from, step.h), which every later matmul reading that output
  // reuses (q, k, v; gate, up); -1: none. Keyed by the program's op, not the
  // buffer, so that what a captured graph reuses is fixed by the program.
  int64_t q8_from_ = -1;
  // The weights whose matmuls read the current op's output, when it is an
  // op of that kind (the program's analysis, step.cpp).
  const std::vector<int64_t>& op_readers(OpKind kind) const {
    static const std::vector<int64_t> none;
    return op_ && op_->kind == kind ? op_->readers : none;
  }
  int64_t acts_rows_ = 0;
  int64_t off_tokens_ = 0, off_rows_ = 0, off_tiles_ = 0, off_logit_rows_ = 0, off_tables_ = 0;
  void* pinned_ = nullptr;
  int64_t pinned_bytes_ = 0;
  bool upload_pending_ = false;  // begin()'s upload from pinned_ not yet waited for

  // CUDA graphs of the decode step, by batch width.
  std::unordered_map<int64_t, cudaGraphExec_t> graphs_;
  bool capturing_ = false;
  int64_t graphs_captured_ = 0, graph_replays_ = 0;
  int64_t group_stride_ = 0;  // device words between two layer groups' block tables
};

void CudaBackend::prepare(const Model& model, const KvLayout& kv, int64_t n_blocks, int64_t n_ctx) {
  model_ = &model;
  // A mixture of experts routes on the host between its matmuls: no graph
  // can hold such a step.
  if (model.config().moe()) graphs_on_ = false;
  n_ctx_ = n_ctx;
  layout_ = kv;
  n_blocks_ = n_blocks;
  const ModelConfig& c = model.config();

  // What the device will hold, checked against its free memory before any
  // of it is allocated.
  // Every type of the type table has device kernels (kernels/qdecode.cuh);
  // a type added to the table without them is converted to F16 here.
  auto native = [&](const WeightDesc& w) {
    const bool is_embd = w.id == model.token_embd().id;
    const bool matmul = qmm_supported(w.type) || dequant_f16_supported(w.type);
    return matmul && (!is_embd || embed_supported(w.type));
  };
  // --experts-on cpu: the experts stay in the file's mapping for the host.
  std::vector<uint8_t> on_host(static_cast<size_t>(model.n_matrices()), 0);
  if (experts_on_cpu_ && c.moe())
    for (const LayerWeights& L : model.layers())
      for (const auto* v : {&L.gate_exps, &L.up_exps, &L.down_exps})
        for (const WeightDesc& w : *v) on_host[static_cast<size_t>(w.id)] = 1;
  int64_t weights = 0, converted = 0;
  for (const WeightDesc* w : model.matrices()) {
    if (on_host[static_cast<size_t>(w->id)]) continue;
    if (native(*w)) {
      weights += w->bytes();
    } else {
      weights += 2 * w->k * w->n_rows;
      ++converted;
    }
  }
  int64_t vectors = 0;
  for (const LayerWeights& L : model.layers())
    for (const auto* v : {&L.attn_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm,
                          &L.attn_post_norm, &L.ffn_post_norm})
      vectors += static_cast<int64_t>(v->size()) * 4;
  vectors += c.d_model * 4;
  if (kv_type_info(kv.k_type).offset) vectors += c.n_layer * kv.kv_dim * 4;  // key offsets
  vectors += static_cast<int64_t>(key_scale_.size()) * 4;                    // key scales
  const int64_t kv_bytes = kv.bytes_per_block() * n_blocks;
  // One pair of tables, two with sliding-window layers (their own base).
  const int64_t rope_bytes = (c.n_swa > 0 ? 2 : 1) * 2 * n_ctx * (c.rope_dims / 2) * 4;
  const int64_t need = weights + vectors + kv_bytes + rope_bytes + kCublasWorkspace;
  size_t free_b = 0, total_b = 0;
  BARATA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  // Headroom for activations, the dequant tile and cuBLAS's own state.
  const int64_t headroom = 256 << 20;
  if (need + headroom > static_cast<int64_t>(free_b))
    fail(
        "--device cuda: the model does not fit: weights {} + KV cache {} ({} tokens) + {} of "
        "tables need {}, and {} has {} free of {} (lower -c or --kv-tokens)",
        mib(weights), mib(kv_bytes), n_blocks * kKvBlockTokens,
        mib(vectors + rope_bytes + kCublasWorkspace + headroom), mib(need + headroom), prop_.name,
        mib(static_cast<int64_t>(free_b)), mib(static_cast<int64_t>(total_b)));

  // Weights, once, in their stored type (or F16 where no device kernel reads it).
  weights_.assign(static_cast<size_t>(model.n_matrices()), DevWeight{});
  std::vector<float> row;
  std::vector<uint16_t> half;
  for (const WeightDesc* w : model.matrices()) {
    DevWeight& d = weights_[static_cast<size_t>(w->id)];
    d.k = w->k;
    d.n_rows = w->n_rows;
    if (on_host[static_cast<size_t>(w->id)]) continue;
    if (native(*w)) {
      d.type = w->type;
      d.row_bytes = w->row_bytes;
      d.scale = w->scale;
      void* p = arena_.alloc(w->bytes(), "weights");
      BARATA_CUDA_CHECK(
          cudaMemcpy(p, w->data, static_cast<size_t>(w->bytes()), cudaMemcpyHostToDevice));
      d.data = p;
    } else {
      d.type = DType::F16;
      d.row_bytes = static_cast<size_t>(2 * w->k);
      d.scale = 1.0f;
      d.converted = true;
      void* p = arena_.alloc(2 * w->k * w->n_rows, "weights (converted to F16)");
      // Converted in chunks of about 16 MiB of fp16, one copy per chunk.
      const int64_t chunk = std::max<int64_t>(1, (16 << 20) / (2 * w->k));
      row.resize(static_cast<size_t>(w->k));
      half.resize(static_cast<size_t>(std::min(chunk, w->n_rows) * w->k));
      const DTypeTraits& tr = dtype_traits(w->type);
      for (int64_t r0 = 0; r0 < w->n_rows; r0 += chunk) {
        const int64_t nr = std::min(chunk, w->n_rows - r0);
        for (int64_t r = 0; r < nr; ++r) {
          tr.dequantize_row(w->data + (r0 + r) * w->row_bytes, row.data(), w->k);
          for (int64_t j = 0; j < w->k; ++j)
            half[static_cast<size_t>(r * w->k + j)] = fp32_to_fp16(row[j] * w->scale);
        }
        BARATA_CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(p) + r0 * d.row_bytes, half.data(),
                                     static_cast<size_t>(nr) * d.row_bytes,
                                     cudaMemcpyHostToDevice));
      }
      d.data = p;
    }
    weight_bytes_ += static_cast<int64_t>(d.row_bytes) * d.n_rows;
  }
  host_experts_.reset();
  if (experts_on_cpu_ && c.moe()) {
    host_experts_ = make_host_experts(model, host_threads_);
    int64_t host = 0;
    for (size_t i = 0; i < on_host.size(); ++i)
      if (on_host[i]) host += model.matrices()[i]->bytes();
    notes_.push_back("experts on the cpu: " + mib(host) + " of expert matrices in host memory (" +
                     mib(host_experts_->repacked_bytes()) +
                     " repacked), run by the CPU; the activations cross once each way per layer");
  }
  if (converted > 0)
    notes_.push_back(std::to_string(converted) +
                     " matrices have no CUDA kernel for their type yet and were converted to F16 "
                     "at load (more memory, same results within fp16)");
  // The fp16 tile the widest matmuls dequantize into, allocated now: a
  // captured graph (decode widths up to kQmmMaxTokens may take cuBLAS) must
  // not allocate.
  int64_t tile = 0;
  for (const DevWeight& d : weights_)
    if (d.type != DType::F16) tile = std::max(tile, dequant_tile_rows(d) * d.k * 2);
  if (tile > 0) tile_f16_.ensure(arena_, tile, "the dequant tile");
  // Tied output: the embedding's device copy serves both (same id).

  auto upload_vec = [&](const std::vector<float>& v) {
    if (v.empty() || vecs_.count(v.data())) return;
    float* p = static_cast<float*>(arena_.alloc(static_cast<int64_t>(v.size()) * 4, "norms"));
    BARATA_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    vecs_[v.data()] = p;
  };
  for (const LayerWeights& L : model.layers())
    for (const auto* v : {&L.attn_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm,
                          &L.attn_post_norm, &L.ffn_post_norm})
      upload_vec(*v);
  upload_vec(model.output_norm());

  pool_ = static_cast<uint8_t*>(arena_.alloc(kv_bytes, "the KV cache"));
  key_off_ = nullptr;
  if (kv_type_info(kv.k_type).offset) {  // the outlier-aware K types (kv_types.h)
    const std::vector<float> off = key_offsets(model, n_ctx);
    key_off_ = static_cast<float*>(
        arena_.alloc(static_cast<int64_t>(off.size()) * 4, "the keys' offsets"));
    BARATA_CUDA_CHECK(cudaMemcpy(key_off_, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
  }
  check_key_scales(c, kv, key_scale_);
  key_scale_dev_ = nullptr;
  if (!key_scale_.empty()) {
    key_scale_dev_ = static_cast<float*>(
        arena_.alloc(static_cast<int64_t>(key_scale_.size()) * 4, "the keys' scales"));
    BARATA_CUDA_CHECK(cudaMemcpy(key_scale_dev_, key_scale_.data(), key_scale_.size() * 4,
                                 cudaMemcpyHostToDevice));
  }

  // RoPE tables for every position, as the CPU makes them (double, rounded).
  const int64_t half_dims = c.rope_dims / 2;
  std::vector<float> cs(static_cast<size_t>(n_ctx * half_dims)), sn(cs.size());
  rope_tables(c, 0, n_ctx, cs.data(), sn.data(), n_ctx);
  const int64_t table_bytes = static_cast<int64_t>(cs.size()) * 4;
  float* d_cos = static_cast<float*>(arena_.alloc(table_bytes, "RoPE tables"));
  float* d_sin = static_cast<float*>(arena_.alloc(table_bytes, "RoPE tables"));
  BARATA_CUDA_CHECK(cudaMemcpy(d_cos, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
  BARATA_CUDA_CHECK(cudaMemcpy(d_sin, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
  float* d_cos_swa = d_cos;
  float* d_sin_swa = d_sin;
  if (c.n_swa > 0) {
    rope_tables(c, 0, n_ctx, cs.data(), sn.data(), n_ctx, true);
    d_cos_swa = static_cast<float*>(arena_.alloc(table_bytes, "RoPE tables"));
    d_sin_swa = static_cast<float*>(arena_.alloc(table_bytes, "RoPE tables"));
    BARATA_CUDA_CHECK(cudaMemcpy(d_cos_swa, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    BARATA_CUDA_CHECK(cudaMemcpy(d_sin_swa, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
  }
  rope_.n_head = static_cast<int32_t>(c.n_head);
  rope_.n_head_kv = static_cast<int32_t>(c.n_head_kv);
  rope_.head_dim = static_cast<int32_t>(c.head_dim);
  rope_.rope_dims = static_cast<int32_t>(c.rope_dims);
  rope_.neox = c.rope_style == RopeStyle::kNeox;
  rope_.cos = d_cos;
  rope_.sin = d_sin;
  rope_swa_ = rope_;
  rope_swa_.cos = d_cos_swa;
  rope_swa_.sin = d_sin_swa;
  attn_.n_head = rope_.n_head;
  attn_.n_head_kv = rope_.n_head_kv;
  attn_.head_dim = rope_.head_dim;
  attn_.scale = c.attn_scale;
  attn_swa_ = attn_;
  attn_swa_.window = static_cast<int32_t>(std::min<int64_t>(c.n_swa, n_ctx));
  // Decode splits: fixed by n_ctx, so a graph replays at any length; at most
  // 64 ranges of a multiple of 16 tokens, empty ones exit at once.
  const int64_t want_tokens = 256;
  int64_t n_splits = std::min<int64_t>((n_ctx + want_tokens - 1) / want_tokens, 64);
  n_splits = std::max<int64_t>(n_splits, 1);
  int64_t split_tokens = (n_ctx + n_splits - 1) / n_splits;
  split_tokens = (split_tokens + kKvBlockTokens - 1) / kKvBlockTokens * kKvBlockTokens;
  split_.n_splits = static_cast<int32_t>(n_splits);
  split_.split_tokens = static_cast<int32_t>(split_tokens);
  BARATA_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaBackend::ensure_rows(int64_t n) {
  if (n <= acts_rows_) return;
  const ModelConfig& c = model_->config();
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  // Grown to the next power of two rows: few reallocations, each of which
  // drops the captured graphs (their pointers would be stale).
  int64_t rows = 1;
  while (rows < n) rows *= 2;
  const std::pair<Act, int64_t> widths[] = {
      {Act::kX, c.d_model},  {Act::kXn, std::max(c.d_model, c.d_ff)},
      {Act::kQ, q_dim},      {Act::kK, kv_dim},
      {Act::kV, kv_dim},     {Act::kAtt, q_dim},
      {Act::kGate, c.d_ff},  {Act::kUp, c.d_ff},
      {Act::kOut, c.d_model}};
  for (const auto& [a, w] : widths)
    acts_[static_cast<size_t>(a)].ensure(arena_, rows * w * 4, "activations");
  const int64_t max_k = std::max({c.d_model, c.d_ff, q_dim});
  act_f16_.ensure(arena_, rows * max_k * 2, "fp16 activations");
  const int64_t q8_rows = std::min(rows, kQmmMaxTokens);
  q8_scales_at_ = (q8_rows * max_k + 255) / 256 * 256;
  act_q8_.ensure(arena_, q8_scales_at_ + q8_rows * (max_k / 32 + 1) * 4, "8-bit activations");
  workspace_.ensure(arena_,
                    static_cast<int64_t>(attention_decode_workspace(rows, attn_, split_)) * 4,
                    "the attention workspace");
  // Logits for the rows that want them: a decode graph's (<= 64 rows) always
  // fit; a wider request grows the buffer in logits(), outside any capture.
  logits_.ensure(arena_, std::min<int64_t>(rows, 64) * c.n_vocab * 4, "logits");
  acts_rows_ = rows;
  drop_graphs();
}

// The router's logits come to the host and are routed there (moe.h: the
// same choices as the CPU backend's from the same logits); the rows are
// gathered in expert order on the device, each active expert's gate, up and
// down run as the backend's matmuls on its rows, and one launch sums each
// token's experts into the residual.
void CudaBackend::moe(const LayerWeights& L, const float* xn, float* acc) {
  const ModelConfig& c = model_->config();
  const int64_t T = rows_, d = c.d_model, f = c.d_ff_exp, K = c.n_expert_used, P = T * K;
  moe_logits_.ensure(arena_, T * c.n_expert * 4, "MoE router logits");
  moe_xg_.ensure(arena_, P * d * 4, "MoE grouped inputs");
  moe_gate_.ensure(arena_, P * f * 4, "MoE gate rows");
  moe_up_.ensure(arena_, P * f * 4, "MoE up rows");
  moe_y_.ensure(arena_, P * d * 4, "MoE expert outputs");
  // token, slot_at and weights (P each), then three GEMV group tables.
  const int64_t groups_at = (P * 3 * 4 + 15) / 16 * 16;
  const int64_t table_bytes = c.n_expert * static_cast<int64_t>(sizeof(GemvGroup));
  moe_lists_.ensure(arena_, groups_at + 3 * table_bytes, "MoE index lists");
  run_matmul(weights_[static_cast<size_t>(L.router.id)], xn, T, moe_logits_.as<float>(), {},
             x_from());
  moe_host_logits_.resize(static_cast<size_t>(T * c.n_expert));
  BARATA_CUDA_CHECK(cudaMemcpyAsync(moe_host_logits_.data(), moe_logits_.p,
                                    moe_host_logits_.size() * 4, cudaMemcpyDeviceToHost, stream_));
  if (host_experts_) {  // the input rows cross with the logits, the output once back
    moe_host_x_.resize(static_cast<size_t>(T * d));
    BARATA_CUDA_CHECK(cudaMemcpyAsync(moe_host_x_.data(), xn, moe_host_x_.size() * 4,
                                      cudaMemcpyDeviceToHost, stream_));
  }
  BARATA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  ExpertGroups& g = moe_groups_;
  g.route(c, moe_host_logits_.data(), T);
  if (host_experts_) {
    moe_host_y_.assign(static_cast<size_t>(T * d), 0.0f);
    host_experts_->run(L, g, moe_host_x_.data(), moe_host_y_.data());
    BARATA_CUDA_CHECK(cudaMemcpyAsync(moe_y_.p, moe_host_y_.data(), moe_host_y_.size() * 4,
                                      cudaMemcpyHostToDevice, stream_));
    launch_add(acc, moe_y_.as<float>(), T * d, stream_);
    after("moe (experts on the cpu)");
    return;
  }
  // Decode-sized groups (every active expert's rows within the GEMV's 8)
  // of types the GEMV reads: the gate, the up and the down each run as one
  // launch over every active expert (BARATA_CUDA_MOE_GROUPED=0: one per expert).
  const DevWeight& gate0 = weights_[static_cast<size_t>(L.gate_exps[0].id)];
  const DevWeight& up0 = weights_[static_cast<size_t>(L.up_exps[0].id)];
  const DevWeight& down0 = weights_[static_cast<size_t>(L.down_exps[0].id)];
  int64_t max_rows = 0;
  for (const int32_t e : g.active)
    max_rows = std::max<int64_t>(
        max_rows, g.start[static_cast<size_t>(e) + 1] - g.start[static_cast<size_t>(e)]);
  static const bool grouped_on = env_on("BARATA_CUDA_MOE_GROUPED", true);
  const bool grouped = grouped_on && max_rows <= kGemvMaxTokens && gemv_supported(gate0.type) &&
                       gemv_supported(up0.type) && gemv_supported(down0.type);
  // token (P), slot_at (P), weights (P as float bits), the group tables: one upload.
  moe_host_lists_.resize(static_cast<size_t>(groups_at + 3 * table_bytes));
  uint8_t* h = moe_host_lists_.data();
  std::memcpy(h, g.token.data(), static_cast<size_t>(P) * 4);
  std::memcpy(h + P * 4, g.slot_at.data(), static_cast<size_t>(P) * 4);
  std::memcpy(h + 2 * P * 4, g.weights.data(), static_cast<size_t>(P) * 4);
  const auto n_active = static_cast<int>(g.active.size());
  if (grouped) {
    const std::vector<WeightDesc>* mats[3] = {&L.gate_exps, &L.up_exps, &L.down_exps};
    for (int m = 0; m < 3; ++m)
      for (int i = 0; i < n_active; ++i) {
        const auto e = static_cast<size_t>(g.active[static_cast<size_t>(i)]);
        const auto r0 = static_cast<int32_t>(g.start[e]);
        const GemvGroup gg{weights_[static_cast<size_t>((*mats[m])[e].id)].data, r0,
                           static_cast<int32_t>(g.start[e + 1] - r0), r0};
        std::memcpy(h + groups_at + m * table_bytes + i * static_cast<int64_t>(sizeof(GemvGroup)),
                    &gg, sizeof(GemvGroup));
      }
  }
  const size_t upload = grouped ? moe_host_lists_.size() : static_cast<size_t>(3 * P * 4);
  BARATA_CUDA_CHECK(cudaMemcpyAsync(moe_lists_.p, h, upload, cudaMemcpyHostToDevice, stream_));
  const int32_t* d_token = moe_lists_.as<int32_t>();
  const int32_t* d_slot = d_token + P;
  const float* d_w = reinterpret_cast<const float*>(d_token + 2 * P);
  launch_moe_gather(xn, d, d_token, P, moe_xg_.as<float>(), stream_);
  float* xg = moe_xg_.as<float>();
  float* gate = moe_gate_.as<float>();
  float* up = moe_up_.as<float>();
  float* y = moe_y_.as<float>();
  if (grouped) {
    const auto* tables = reinterpret_cast<const GemvGroup*>(moe_lists_.as<uint8_t>() + groups_at);
    const int64_t per = c.n_expert;  // a table's entries
    launch_gemv_grouped(gate0.type, tables, n_active, max_rows, gate0.row_bytes, d, f, gate0.scale,
                        xg, gate, f, stream_);
    launch_gemv_grouped(up0.type, tables + per, n_active, max_rows, up0.row_bytes, d, f, up0.scale,
                        xg, up, f, stream_);
    launch_swiglu(gate, up, P * f, stream_);
    launch_gemv_grouped(down0.type, tables + 2 * per, n_active, max_rows, down0.row_bytes, f, d,
                        down0.scale, gate, y, d, stream_);
    launch_moe_combine(acc, y, d_slot, d_w, T, K, d, stream_);
    after("moe (grouped)");
    return;
  }
  for (const int32_t e : g.active) {
    const int64_t r0 = g.start[static_cast<size_t>(e)],
                  n = g.start[static_cast<size_t>(e) + 1] - r0;
    const auto ex = static_cast<size_t>(e);
    run_matmul(weights_[static_cast<size_t>(L.gate_exps[ex].id)], xg + r0 * d, n, gate + r0 * f, {},
               -1);
    run_matmul(weights_[static_cast<size_t>(L.up_exps[ex].id)], xg + r0 * d, n, up + r0 * f, {},
               -1);
  }
  launch_swiglu(gate, up, P * f, stream_);
  for (const int32_t e : g.active) {
    const int64_t r0 = g.start[static_cast<size_t>(e)],
                  n = g.start[static_cast<size_t>(e) + 1] - r0;
    run_matmul(weights_[static_cast<size_t>(L.down_exps[static_cast<size_t>(e)].id)], gate + r0 * f,
               n, y + r0 * d, {}, -1);
  }
  launch_moe_combine(acc, y, d_slot, d_w, T, K, d, stream_);
  after("moe");
}

void CudaBackend::begin(const Batch& b) {
  abandon_capture();
  batch_ = &b;
  rows_ = b.size();
  q8_from_ = -1;
  ensure_rows(rows_);

  // Decode shape: every row its own sequence (one query row per sequence).
  std::vector<int32_t>& seqs = seqs_scratch_;  // members: a step allocates nothing once warm
  seqs.assign(b.seq_ids.begin(), b.seq_ids.end());
  std::sort(seqs.begin(), seqs.end());
  decode_shape_ = std::adjacent_find(seqs.begin(), seqs.end()) == seqs.end();
  // Prefill tiles: runs of rows of one sequence, at most kPrefillTileRows each.
  std::vector<PrefillTile>& tiles = tiles_scratch_;
  tiles.clear();
  if (!decode_shape_) {
    for (int64_t t = 0; t < rows_;) {
      int64_t e = t + 1;
      while (e < rows_ && e - t < kPrefillTileRows &&
             b.rows[static_cast<size_t>(e)].seq == b.rows[static_cast<size_t>(t)].seq)
        ++e;
      tiles.push_back({static_cast<int32_t>(t), static_cast<int32_t>(e - t)});
      t = e;
    }
  }
  n_tiles_ = static_cast<int64_t>(tiles.size());

  // One upload of every array the kernels read, through pinned memory.
  auto words = [](size_t bytes) { return static_cast<int64_t>((bytes + 15) / 16 * 4); };
  off_tokens_ = 0;
  off_rows_ = off_tokens_ + words(b.tokens.size() * 4);
  off_tiles_ = off_rows_ + words(b.rows.size() * sizeof(BatchRowMeta));
  off_logit_rows_ = off_tiles_ + words(tiles.size() * sizeof(PrefillTile));
  off_tables_ = off_logit_rows_ + words(b.logit_rows.size() * 4);
  // Block tables are sized for the whole pool, per layer group: their device
  // addresses (which a graph captured) never change with the lengths. A
  // group's tables outgrow that only when sliding-window groups released
  // blocks (tables longer than the blocks held); they then grow once.
  const int64_t n_groups = layout_.n_groups();
  const int64_t stride =
      n_groups == 1 ? static_cast<int64_t>(b.block_tables.size()) : b.group_stride;
  const int64_t grown = std::max<int64_t>(std::max<int64_t>(group_stride_, n_blocks_ + 1), stride);
  if (grown != group_stride_ && n_groups > 1) drop_graphs();  // the groups' tables moved
  group_stride_ = grown;
  const int64_t total =
      (off_tables_ + words(static_cast<size_t>(n_groups * group_stride_) * 4)) * 4;
  // The layout depends on the width only for decode batches, where every
  // array has a fixed size per width: a graph's pointers stay valid.
  if (meta_.ensure(arena_, std::max<int64_t>(total, 1 << 16), "batch metadata")) drop_graphs();
  // The last upload may still be reading pinned_ when no step ended since
  // (one threw before its logits' synchronize): it finishes first. (An error
  // it reports is the failed step's, which has thrown.)
  if (upload_pending_) cudaStreamSynchronize(stream_);
  if (total > pinned_bytes_) {
    if (pinned_) cudaFreeHost(pinned_);
    BARATA_CUDA_CHECK(cudaMallocHost(&pinned_, static_cast<size_t>(total)));
    pinned_bytes_ = total;
  }
  auto* h = static_cast<int32_t*>(pinned_);
  std::memcpy(h + off_tokens_, b.tokens.data(), b.tokens.size() * 4);
  std::memcpy(h + off_rows_, b.rows.data(), b.rows.size() * sizeof(BatchRowMeta));
  if (!tiles.empty()) std::memcpy(h + off_tiles_, tiles.data(), tiles.size() * sizeof(PrefillTile));
  std::memcpy(h + off_logit_rows_, b.logit_rows.data(), b.logit_rows.size() * 4);
  for (int64_t g = 0; g < n_groups; ++g)
    std::memcpy(h + off_tables_ + g * group_stride_, b.block_tables.data() + g * stride,
                static_cast<size_t>(stride) * 4);
  const size_t used = (static_cast<size_t>(off_tables_) +
                       static_cast<size_t>((n_groups - 1) * group_stride_ + stride)) *
                      4;
  BARATA_CUDA_CHECK(cudaMemcpyAsync(meta_.p, pinned_, used, cudaMemcpyHostToDevice, stream_));
  upload_pending_ = true;
}

bool CudaBackend::step_begin(bool capturable) {
  q8_from_ = -1;
  const bool graphable = graphs_on_ && capturable && decode_shape_ && rows_ <= kQmmMaxTokens &&
                         static_cast<int64_t>(batch_->logit_rows.size()) == rows_;
  if (!graphable) return false;
  if (auto it = graphs_.find(rows_); it != graphs_.end()) {
    BARATA_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
    ++graph_replays_;
    return true;
  }
  BARATA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  return false;
}

void CudaBackend::step_end(float* host_logits) {
  if (capturing_) {
    cudaGraphExec_t exec = end_capture();
    graphs_[rows_] = exec;
    ++graphs_captured_;
    BARATA_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  }
  copy_logits(host_logits);
}

void CudaBackend::copy_logits(float* host_logits) {
  const int64_t n_out = static_cast<int64_t>(batch_->logit_rows.size());
  BARATA_CUDA_CHECK(cudaMemcpyAsync(host_logits, logits_.p,
                                    static_cast<size_t>(n_out * model_->config().n_vocab * 4),
                                    cudaMemcpyDeviceToHost, stream_));
  const cudaError_t err = cudaStreamSynchronize(stream_);
  upload_pending_ = false;
  if (err != cudaSuccess)
    fail(
        "CUDA: the forward of a batch of {} rows failed: {} ({}); BARATA_CUDA_SYNC=1 names the "
        "op",
        rows_, cudaGetErrorString(err), cudaGetErrorName(err));
}

void CudaBackend::run_matmul(const DevWeight& w, const float* x, int64_t n, float* y,
                             const Epilogue& ep, int64_t x_from) {
  const int64_t ldy = w.n_rows;
  const MatmulPath path = choose_matmul(w.type, n, qmm_max_);
  auto log_kernel = [&](auto make) {
    auto key = std::make_pair(w.type, n);
    if (!kernels_.count(key)) kernels_[key] = make();
  };
  if (path == MatmulPath::kGemv) {
    log_kernel([&] { return std::string("gemv<") + dtype_name(w.type) + ">"; });
    launch_gemv(w.type, w.data, w.row_bytes, w.k, w.n_rows, w.scale, x, n, y, ldy, stream_, ep);
    after("gemv");
    return;
  }
  if (path == MatmulPath::kQmm && q8_act_ && w.k % 32 == 0 && qmm_q8_supported(w.type)) {
    log_kernel([&] { return qmm_q8_variant(w.type, n); });
    auto* xq = act_q8_.as<unsigned char>();
    auto* xd = reinterpret_cast<float*>(xq + q8_scales_at_);
    if (x_from < 0 || q8_from_ != x_from) {
      launch_quantize_q8(x, n, w.k, xq, xd, stream_);
      after("quantize q8");
      q8_from_ = x_from;
    }
    launch_qmm_q8(w.type, w.data, w.row_bytes, w.k, w.n_rows, w.scale, xq, xd, n, y, ldy, stream_,
                  ep);
    after("qmm q8");
    return;
  }
  if (path == MatmulPath::kQmm) {
    log_kernel([&] { return qmm_variant(w.type, n); });
    launch_qmm(w.type, w.data, w.row_bytes, w.k, w.n_rows, w.scale, x, n, y, ldy, stream_, ep);
    after("qmm");
    return;
  }
  // GEMM: activations to fp16, the weight to fp16 tile by tile (F16 weights
  // are used as they are), then cuBLAS with fp32 accumulation. The six types
  // of dequant.cuh take its flat dequantizer; the rest the row one of qmm.cuh.
  const bool flat = dequant_f16_supported(w.type);
  log_kernel([&] {
    return path == MatmulPath::kCublasF16 ? std::string("cublasGemmEx<f16>")
                                          : std::string(flat ? "dequant" : "dequant_rows") + "<" +
                                                dtype_name(w.type) + "> to f16 + cublasGemmEx";
  });
  // Sized by ensure_rows and prepare, so neither moves; if one did, the
  // graphs holding its old address go.
  if (act_f16_.ensure(arena_, n * w.k * 2, "fp16 activations")) drop_graphs();
  launch_f32_to_f16(x, act_f16_.as<uint16_t>(), n * w.k, stream_);
  const float alpha = w.scale, beta = ep.accumulate ? 1.0f : 0.0f;
  int64_t tile_rows = w.n_rows;
  if (path == MatmulPath::kDequantCublas) {
    tile_rows = dequant_tile_rows(w);
    if (tile_f16_.ensure(arena_, tile_rows * w.k * 2, "the dequant tile")) drop_graphs();
  }
  for (int64_t r0 = 0; r0 < w.n_rows; r0 += tile_rows) {
    const int64_t nr = std::min(tile_rows, w.n_rows - r0);
    const void* a = static_cast<const uint8_t*>(w.data) + r0 * static_cast<int64_t>(w.row_bytes);
    if (path == MatmulPath::kDequantCublas) {
      if (flat)
        cuda_dequantize_to_f16(w.type, a, tile_f16_.p, nr * w.k, stream_);
      else
        launch_dequant_rows_f16(w.type, a, w.row_bytes, w.k, nr, tile_f16_.as<uint16_t>(), stream_);
      a = tile_f16_.p;
    }
    // Row-major Y (n x n_rows) = X (n x k) W^T: in cuBLAS's column-major
    // terms C (nr x n, ldc n_rows) = A^T (A: k x nr) * B (k x n).
    BARATA_CUBLAS_CHECK(
        cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(nr), static_cast<int>(n),
                     static_cast<int>(w.k), &alpha, a, CUDA_R_16F, static_cast<int>(w.k),
                     act_f16_.p, CUDA_R_16F, static_cast<int>(w.k), &beta, y + r0, CUDA_R_32F,
                     static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "GemmEx");
  }
  after("gemm");
  if (ep.bias) {
    launch_add_bias(y, ep.bias, n, w.n_rows, stream_);
    after("add_bias");
  }
}

void CudaBackend::logits(const float* x, float* host_logits) {
  const ModelConfig& c = model_->config();
  const int64_t n_out = static_cast<int64_t>(batch_->logit_rows.size());
  float* xn = act(Act::kXn);
  if (!capturing_ && logits_.ensure(arena_, n_out * c.n_vocab * 4, "logits")) drop_graphs();
  // The final norm writes the 8-bit copy the output matmul reads (in a step
  // only: op_readers is empty outside one).
  const int64_t self = op_index_;
  const Q8Out q8 = q8_read(op_readers(OpKind::kLogits), n_out, c.d_model) ? q8_out() : Q8Out{};
  launch_rmsnorm(x, vec(model_->output_norm()), xn, n_out, c.d_model, c.norm_eps, d_logit_rows(),
                 stream_, q8);
  after("output rms_norm");
  q8_from_ = q8.xq ? self : -1;
  run_matmul(weights_[static_cast<size_t>(model_->output().id)], xn, n_out, logits_.as<float>(), {},
             q8.xq ? self : -1);
  // In a step the copy to the host is step_end's (after a captured graph
  // has run); an op called on its own copies now.
  if (!op_) copy_logits(host_logits);
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opts) {
  return std::make_unique<CudaBackend>(opts);
}

}  // namespace barata

#ifndef BARATA_CUDA_EMU
// The module's entry (src/backend.cpp loads it with dlopen). Errors are
// thrown as barata::Error, whose type the module shares with the executable.
extern "C" __attribute__((visibility("default"))) barata::Backend* barata_cuda_backend_create(
    const barata::BackendOptions* opts) {
  return barata::make_cuda_backend(*opts).release();
}
#endif
