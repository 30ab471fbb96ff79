// Measurements behind `barata bench`: prefill against decode, the KV cache
// against recomputation, KV memory against its formula, a batch sweep and a
// roofline. Every timed value is repeated (after one untimed warm-up) and
// summarised as mean, sample standard deviation, median, min and max.
// Rendering (markdown, CSV, JSON) and SVG charts live here too, so that tests
// can check them without running the CLI.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "barata/engine.h"
#include "barata/model.h"

namespace barata::bench {

// ---- statistics ---------------------------------------------------------------

struct Stats {
  double mean = 0, sd = 0, median = 0, min = 0, max = 0;  // sd: sample (n - 1); 0 when n < 2
  int64_t n = 0;                                          // samples summarised
};
Stats summarize(std::span<const double> samples);

// ---- settings and results -------------------------------------------------------

struct Settings {
  int reps = 5;                                            // timed repetitions after one warm-up
  std::vector<int64_t> prefill_tokens{16, 64, 256, 1024};  // P list
  std::vector<int64_t> cache_tokens{16, 64, 256, 1024};    // C list (decode)
  std::vector<int64_t> batch_sizes{1, 2, 4, 8, 16, 32};    // B list
  int64_t batch_cached = 64;  // tokens in each sequence's cache in the batch sweep
  int64_t decode_steps = 4;   // decode steps timed per repetition (ms/step is their mean)
  int64_t n_generate = 32;    // T of cache vs no cache
  int64_t bandwidth_bytes = int64_t{1} << 30;  // buffer streamed by the bandwidth probe
};

struct PrefillRow {
  int64_t n_tokens = 0;  // P
  Stats ms, ms_per_token, tokens_per_s;
  Stats ttft_ms;  // prefill + one sampling step (default sampler) on its logits
};

struct DecodeRow {
  int64_t n_cached = 0;        // C: tokens in the cache before the first timed step
  int64_t bytes_per_step = 0;  // weights + K/V of C + 1 positions, read once per step
  Stats ms_per_step, tokens_per_s, gb_per_s;
};

struct CachePoint {
  int64_t n_generated = 0;  // cumulative over the first n_generated tokens
  Stats cache_ms, no_cache_ms;
  int64_t cache_proj_macs = 0, cache_attn_macs = 0;
  int64_t no_cache_proj_macs = 0, no_cache_attn_macs = 0;
};

struct CacheResult {
  bool ran = false;
  int64_t prompt_tokens = 0, n_generate = 0;
  std::vector<int32_t> ids_cache, ids_no_cache;
  bool ids_identical = false;      // in the warm-up and in every repetition
  int64_t first_mismatch = -1;     // index into the generated ids, -1 when identical
  std::vector<CachePoint> points;  // n_generated = 1, 2, 4, ..., T
};

struct BatchRow {
  int64_t batch = 0, n_cached = 0;
  Stats step_ms, tokens_per_s;
};

struct RooflineResult {
  bool ran = false;
  int64_t buffer_bytes = 0;
  Stats bandwidth_gb_per_s;  // streaming read, all threads of the engine's pool
  int64_t weight_bytes = 0;  // Model::weight_bytes(): matrices one decode token reads
  int64_t n_cached = 0;      // cache length of the decode steps timed here
  int64_t kv_bytes = 0;      // K/V read by one of those steps
  Stats decode_ms_per_step;
  double weight_gb_per_s = 0;     // weight_bytes / median step time
  double fraction = 0;            // weight_gb_per_s / median bandwidth
  double bound_tokens_per_s = 0;  // median bandwidth / weight_bytes
};

struct KvShape {
  std::string name;
  int64_t n_layer = 0, n_head_kv = 0, head_dim = 0, n_tokens = 0;
};

struct KvRow {
  KvShape shape;
  int64_t bytes_per_token = 0;  // PagedKvCache::bytes_per_token()
  int64_t n_blocks = 0;         // ceil(n_tokens / 16)
  int64_t rounded_tokens = 0;   // n_blocks x 16
  int64_t formula_bytes = 0;    // 2 x n_layer x n_head_kv x head_dim x 2 bytes x rounded_tokens
  int64_t exact_bytes = 0;      // the same formula for n_tokens, without the block rounding
  int64_t bytes_allocated = 0;  // PagedKvCache::bytes_allocated() after filling n_tokens
  bool equal = false;           // bytes_allocated == formula_bytes
};

struct ThreadRun {
  int n_threads = 0;
  std::string device = "cpu";  // the backend: cpu, cuda
  DeviceReport report;         // the backend's own account, taken after the tests
  std::vector<PrefillRow> prefill;
  std::vector<DecodeRow> decode;
  CacheResult cache;
  std::vector<BatchRow> batch;
  RooflineResult roofline;
};

struct ModelInfo {
  std::string path, arch, weight_type;  // weight_type: of the first layer's wq
  int64_t n_layer = 0, d_model = 0, n_head = 0, n_head_kv = 0, head_dim = 0, d_ff = 0;
  int64_t n_vocab = 0, n_ctx = 0;  // n_ctx: the context the engine ran with
  int64_t weight_bytes = 0, kv_bytes_per_token = 0;
  std::string kv_cache = "fp16";  // the cache's types (kv_cache_label)
  // K/V one sequence at n_ctx holds: n_ctx x kv_bytes_per_token in whole
  // blocks, less what sliding-window layers free behind their window.
  int64_t kv_bytes_at_ctx = 0;
  // Weights one token multiplies by: every layer's matrices + output; of a
  // mixture of experts, the router and expert_used_count experts per layer.
  int64_t matmul_params = 0;
  int64_t total_params = 0;        // every tensor's elements (the file)
  int64_t active_params = 0;       // what one decode token reads of them (= total when dense)
  int64_t total_weight_bytes = 0;  // every matrix (weight_bytes: the ones a token reads)
  int64_t n_expert = 0, n_expert_used = 0, d_ff_exp = 0;  // 0: dense
};

struct Report {
  ModelInfo model;
  std::string cpu;  // model name from /proc/cpuinfo
  int hardware_threads = 0;
  Settings settings;  // after capping to the context
  std::vector<int> threads;
  std::vector<std::string> tests;
  std::vector<std::string> notices;
  bool verbose = false;  // -v: the kernel table in the markdown
  bool interrupted = false;
  std::vector<KvRow> kv;
  std::vector<ThreadRun> runs;
};

ModelInfo model_info(const Model& model, const std::string& path, int64_t n_ctx,
                     KvType k = KvType::kF16, KvType v = KvType::kF16);
std::string cpu_name();

// ---- measurement ---------------------------------------------------------------

// progress: a short line naming what runs now. stop: polled between
// repetitions; once set, each measurement returns what it has so far.
struct Hooks {
  std::function<void(const std::string&)> progress = [](const std::string&) {};
  const std::atomic<bool>* stop = nullptr;
  bool stopped() const { return stop != nullptr && stop->load(); }
};

std::vector<PrefillRow> run_prefill(Engine& engine, const Settings& s, const Hooks& h);
std::vector<DecodeRow> run_decode(Engine& engine, const Settings& s, const Hooks& h);
CacheResult run_cache(Engine& engine, std::span<const int32_t> prompt, const Settings& s,
                      const Hooks& h);
std::vector<BatchRow> run_batch(Engine& engine, const Settings& s, const Hooks& h);
RooflineResult run_roofline(Engine& engine, const Settings& s, const Hooks& h);
// Fresh PagedKvCache per shape, filled with n_tokens tokens of one sequence.
std::vector<KvRow> run_kv(std::span<const KvShape> shapes, const Hooks& h);
// The shapes run_kv checks by default: this model's at a few lengths, then
// well-known models' shapes.
std::vector<KvShape> default_kv_shapes(const ModelConfig& cfg);

// A deterministic token id for position i (the bench's prompts carry no text).
int32_t synthetic_token(int64_t i, int64_t n_vocab);

// ---- output ---------------------------------------------------------------------

std::string to_markdown(const Report& r);
std::string to_csv(const Report& r);
std::string to_json(const Report& r);  // schema: docs/bench-schema.md

// ---- SVG charts -----------------------------------------------------------------

struct Series {
  std::string name;
  std::vector<double> x, y;
};
struct Chart {
  std::string title, x_label, y_label;
  bool log2_x = false, log10_y = false;
  std::vector<Series> series;
};
std::string to_svg(const Chart& c);
// &, <, > and " as XML entities, for text inside an SVG.
std::string xml_escape(const std::string& s);
// The charts of a report: file name (no directory) and chart.
std::vector<std::pair<std::string, Chart>> report_charts(const Report& r);

}  // namespace barata::bench
