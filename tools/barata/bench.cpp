// barata bench: prefill against decode, KV cache against none, KV memory, a
// batch sweep and a roofline, per thread count, as markdown, CSV or JSON,
// with optional SVG charts. Ctrl-C stops and prints what was measured.
#include <algorithm>
#include <cmath>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <thread>

#include <unistd.h>

#include <fmt/core.h>

#include "barata/atomic_file.h"
#include "barata/bench.h"
#include "barata/error.h"
#include "barata/plan.h"
#include "barata/tokenizer.h"
#include "commands.h"
#include "session.h"
#include "default_model.h"

namespace barata::cli {
namespace {

namespace fs = std::filesystem;
using bench::Settings;

std::atomic<bool> g_stop{false};

const std::vector<std::string> kTests{"prefill", "decode", "cache", "kv", "batch", "roofline"};

struct BenchArgs {
  std::string model, plot_dir;
  std::vector<int> threads;
  std::vector<std::string> tests = kTests;
  int64_t n_ctx = 0;
  int64_t bandwidth_mib = 1024;
  std::string device = "cpu";
  std::string experts_on = "device";
  std::string cache_k = "f16", cache_v = "f16";
  bool json = false, csv = false, md = false, verbose = false;
  Settings s;
};

// Caps every value of `v` at `cap` (with a notice naming `what`), then drops
// repeats, keeping the first order.
void cap_list(std::vector<int64_t>& v, int64_t cap, const std::string& what, const std::string& why,
              std::vector<std::string>& notices) {
  std::vector<int64_t> out;
  for (int64_t x : v) {
    if (x > cap) {
      notices.push_back(fmt::format("{}={} is beyond {}: capped to {}", what, x, why, cap));
      x = cap;
    }
    if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
  }
  v = out;
}

// This machine's physical memory in bytes (0 when the system does not say).
double physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

std::string mib(double bytes) {
  return fmt::format("{:.0f} MiB", bytes / (1024.0 * 1024.0));
}

// The bandwidth probe streams one buffer: refused beyond half the memory
// (the model and the engine need the rest), before it is allocated.
void check_bandwidth_buffer(int64_t bw_mib) {
  const double bytes = static_cast<double>(bw_mib) * 1024.0 * 1024.0, mem = physical_memory();
  if (mem > 0 && bytes > mem / 2)
    fail(
        "--bw-mib {}: the bandwidth probe's buffer would take more than half of this machine's "
        "{} of memory",
        bw_mib, mib(mem));
}

// What the engines of this run allocate at most: RoPE tables for the
// longest sequence, K/V for every cached token (the batch sweep's sequences
// included), and activations for the longest prefill; refused beyond the
// machine's memory before anything is allocated.
void check_engine_memory(const ModelConfig& c, int64_t max_pos, int64_t cache_tokens,
                         int64_t max_rows, const std::string& flags) {
  const double rope = static_cast<double>(max_pos) * static_cast<double>(c.rope_dims / 2) * 8.0;
  const double blocks = std::ceil(static_cast<double>(cache_tokens) / PagedKvCache::kBlockTokens);
  const double kv =
      blocks * PagedKvCache::kBlockTokens * static_cast<double>(c.kv_bytes_per_token());
  const double width =
      static_cast<double>(3 * c.d_model + std::max(c.d_model, c.d_ff) + 2 * c.d_ff +
                          2 * c.n_head * c.head_dim + 2 * c.n_head_kv * c.head_dim + c.n_vocab);
  const double act = static_cast<double>(max_rows) * width * 4.0;
  const double total = rope + kv + act, mem = physical_memory();
  if (mem > 0 && total > mem)
    fail(
        "{}: the engine would need about {} (K/V cache for {} tokens: {}, RoPE tables: {}, "
        "activations: {}), more than this machine's {} of memory",
        flags, mib(total), cache_tokens, mib(kv), mib(rope), mib(act), mib(mem));
}

std::vector<int32_t> cache_prompt(const Model& model) {
  const char* text = "Once upon a time, there was a little girl who loved to read books about";
  try {
    const Tokenizer tok = Tokenizer::from_gguf(model.file());
    auto ids = tok.encode(text, tok.add_bos_default(), false);
    if (!ids.empty()) return ids;
  } catch (const Error&) {
    // no usable tokenizer: synthetic ids serve the comparison as well
  }
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < 12; ++i) ids.push_back(bench::synthetic_token(i, model.config().n_vocab));
  return ids;
}

class Progress {
 public:
  Progress() : tty_(isatty(STDERR_FILENO) != 0) {}
  ~Progress() { clear(); }
  void set_threads(int t) { threads_ = t; }
  void operator()(const std::string& msg) {
    if (tty_) {
      fmt::print(stderr, "\r\033[K[bench] {}", where(msg));
      std::fflush(stderr);
      shown_ = true;
    } else {
      // Not a terminal (a log): one line per test and thread count.
      const std::string section = fmt::format("{} {}", threads_, msg.substr(0, msg.find(' ')));
      if (section != section_) fmt::print(stderr, "bench: {}\n", where(msg));
      section_ = section;
    }
  }
  void clear() {
    if (shown_) fmt::print(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  std::string where(const std::string& msg) const {
    return threads_ > 0 ? fmt::format("t={} {}", threads_, msg) : msg;
  }
  bool tty_, shown_ = false;
  int threads_ = 0;
  std::string section_;
};

bool wants(const BenchArgs& a, const char* test) {
  return std::find(a.tests.begin(), a.tests.end(), test) != a.tests.end();
}

int run(BenchArgs& a) {
  if (wants(a, "roofline")) check_bandwidth_buffer(a.bandwidth_mib);
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  const Model model = Model::load(path);
  const ModelConfig& cfg = model.config();
  const int64_t n_ctx = a.n_ctx > 0 ? a.n_ctx : std::min<int64_t>(cfg.n_ctx_train, 4096);

  bench::Report rep;
  Settings& s = a.s;
  s.bandwidth_bytes = a.bandwidth_mib << 20;
  // Capping applies always; the notices only for the tests that run.
  std::vector<std::string> unused;
  auto notices = [&](bool run) -> std::vector<std::string>& { return run ? rep.notices : unused; };
  const std::string ctx = fmt::format("the context of {} tokens", n_ctx);
  cap_list(s.prefill_tokens, n_ctx, "P", ctx, notices(wants(a, "prefill")));
  if (s.decode_steps >= n_ctx) fail("--decode-steps {} leaves no room in {}", s.decode_steps, ctx);
  cap_list(s.cache_tokens, n_ctx - s.decode_steps, "C",
           fmt::format("{} less the {} timed steps", ctx, s.decode_steps),
           notices(wants(a, "decode") || wants(a, "roofline")));
  if (s.batch_cached + 1 > n_ctx) {
    notices(wants(a, "batch"))
        .push_back(fmt::format("--batch-cached {} leaves no room for a step in {}: capped to {}",
                               s.batch_cached, ctx, n_ctx - 1));
    s.batch_cached = n_ctx - 1;
  }
  const std::vector<int32_t> prompt = cache_prompt(model);
  // The no-cache run feeds the prompt and all but the last generated token
  // as one prompt, which must leave a position for its reply.
  const int64_t max_t = n_ctx - static_cast<int64_t>(prompt.size());
  if (wants(a, "cache") && max_t < 1) fail("the cache test's prompt fills {}", ctx);
  if (s.n_generate > max_t) {
    notices(wants(a, "cache"))
        .push_back(fmt::format("-n {} after the {}-token prompt is beyond {}: capped to {}",
                               s.n_generate, prompt.size(), ctx, max_t));
    s.n_generate = std::max<int64_t>(max_t, 1);
  }
  for (const auto& n : rep.notices) fmt::print(stderr, "note: {}\n", n);

  rep.model = bench::model_info(model, path, n_ctx, cache_type(a.cache_k), cache_type(a.cache_v));
  rep.verbose = a.verbose;
  rep.cpu = bench::cpu_name();
  rep.hardware_threads = static_cast<int>(std::thread::hardware_concurrency());
  rep.settings = s;
  for (const auto& t : kTests)  // the canonical order, whatever the flag's
    if (wants(a, t.c_str())) rep.tests.push_back(t);

  Progress progress;
  bench::Hooks hooks{[&progress](const std::string& m) { progress(m); }, &g_stop};
  g_stop = false;
  auto prev = std::signal(SIGINT, [](int) {
    if (g_stop) std::_Exit(130);  // a second Ctrl-C does not wait
    g_stop = true;
  });

  if (wants(a, "kv")) rep.kv = bench::run_kv(bench::default_kv_shapes(cfg), hooks);
  const int64_t max_b = *std::max_element(s.batch_sizes.begin(), s.batch_sizes.end());
  const int64_t blocks_per_seq =
      (s.batch_cached + 1 + PagedKvCache::kBlockTokens - 1) / PagedKvCache::kBlockTokens;
  const int64_t cache_tokens = n_ctx + max_b * blocks_per_seq * PagedKvCache::kBlockTokens;
  {
    // K/V tokens the largest test fills (the cache grows as it fills; the
    // sequences of one test are freed before the next), rows of the longest
    // forward call.
    const int64_t blk = PagedKvCache::kBlockTokens;
    int64_t max_p = 1, max_c = 1;
    for (int64_t p : s.prefill_tokens) max_p = std::max(max_p, p);
    for (int64_t c : s.cache_tokens) max_c = std::max(max_c, c);
    int64_t kv_tokens = 0, rows = 1, max_pos = 1;
    auto fills = [&](int64_t tokens, int64_t row_count, int64_t positions) {
      kv_tokens = std::max(kv_tokens, tokens);
      rows = std::max(rows, row_count);
      max_pos = std::max(max_pos, positions);
    };
    if (wants(a, "prefill")) fills(max_p, max_p, max_p);
    if (wants(a, "decode") || wants(a, "roofline"))
      fills(max_c + s.decode_steps, 1, max_c + s.decode_steps);
    if (wants(a, "cache")) {
      const int64_t n = static_cast<int64_t>(prompt.size()) + s.n_generate;
      fills(n, n, n);
    }
    if (wants(a, "batch")) fills(max_b * blocks_per_seq * blk, max_b, s.batch_cached + 1);
    check_engine_memory(cfg, std::min(max_pos, n_ctx), std::min(kv_tokens, cache_tokens), rows,
                        fmt::format("--ctx-size {} (-p, -c, -b, --batch-cached, -n)", n_ctx));
  }
  const std::vector<int> threads = a.threads.empty() ? std::vector<int>{0} : a.threads;
  try {
    for (int t : threads) {
      if (g_stop) break;
      Engine engine(model, {.n_threads = t,
                            .n_ctx = n_ctx,
                            .cache_tokens = cache_tokens,
                            .device = parse_device(a.device).value_or(DeviceKind::kCpu),
                            .cache_k = cache_type(a.cache_k),
                            .cache_v = cache_type(a.cache_v),
                            .experts_on_cpu = a.experts_on == "cpu"});
      if (rep.runs.empty()) fmt::print(stderr, "{}\n", kv_pool_line(engine));
      progress.set_threads(engine.n_threads());
      rep.threads.push_back(engine.n_threads());
      bench::ThreadRun& run = rep.runs.emplace_back();
      run.n_threads = engine.n_threads();
      if (wants(a, "prefill")) run.prefill = bench::run_prefill(engine, s, hooks);
      if (wants(a, "decode")) run.decode = bench::run_decode(engine, s, hooks);
      if (wants(a, "cache")) run.cache = bench::run_cache(engine, prompt, s, hooks);
      if (wants(a, "batch")) run.batch = bench::run_batch(engine, s, hooks);
      if (wants(a, "roofline")) run.roofline = bench::run_roofline(engine, s, hooks);
      run.device = device_name(engine.backend().kind());
      run.report = engine.backend().report();
    }
  } catch (const std::bad_alloc&) {
    // What the estimate above cannot see: the rest of the machine.
    progress.clear();
    std::signal(SIGINT, prev);
    fail("bench: out of memory with --ctx-size {} (lower it, -p, -c, -b or --batch-cached)", n_ctx);
  }
  progress.clear();
  std::signal(SIGINT, prev);
  rep.interrupted = g_stop;

  const std::string out = a.json  ? bench::to_json(rep)
                          : a.csv ? bench::to_csv(rep)
                                  : bench::to_markdown(rep);
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (a.json) fmt::print("\n");
  std::fflush(stdout);
  if (!a.plot_dir.empty()) {
    std::error_code ec;
    const bool existed = fs::exists(a.plot_dir, ec);
    fs::create_directories(a.plot_dir, ec);
    if (ec) fail("{}: cannot create the plot directory: {}", a.plot_dir, ec.message());
    std::vector<fs::path> written;
    try {
      for (const auto& [name, chart] : bench::report_charts(rep)) {
        const fs::path file = fs::path(a.plot_dir) / name;
        write_file_atomically(file, bench::to_svg(chart));  // whole or absent, never truncated
        written.push_back(file);
        fmt::print(stderr, "wrote {}\n", file.string());
      }
    } catch (...) {
      // A full disk: no partial set of charts, and no empty folder we made.
      for (const fs::path& f : written) fs::remove(f, ec);
      if (!existed) fs::remove(a.plot_dir, ec);
      throw;
    }
  }
  if (rep.interrupted) fmt::print(stderr, "interrupted: printed what was measured so far\n");
  return rep.interrupted ? 130 : 0;
}

}  // namespace

Command add_bench(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "bench", "Measure prefill, decode, KV cache, KV memory, batching and bandwidth");
  auto a = std::make_shared<BenchArgs>();
  const auto positive = CLI::Range(int64_t{1}, int64_t{1} << 24);
  sub->add_option("-m,--model", a->model,
                  "GGUF file (default: the model scripts/fetch-model.sh fetches)")
      ->check(CLI::ExistingFile);
  add_cache_type_options(sub, a->cache_k, a->cache_v);
  sub->add_option("--experts-on", a->experts_on,
                  "Where a mixture of experts' expert tensors live and run: device or cpu "
                  "(with --device cuda; docs/moe.md)")
      ->check(CLI::IsMember({"cpu", "device"}));
  sub->add_option("--device", a->device, "Backend: cpu or cuda (default: cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("-t,--threads", a->threads, "Thread counts, e.g. 1,2 (everything runs per count)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  sub->add_option("-r,--reps", a->s.reps, "Timed repetitions of each measurement (after a warm-up)")
      ->check(CLI::Range(1, 100000));
  sub->add_option("--tests", a->tests, "Tests to run: prefill,decode,cache,kv,batch,roofline")
      ->delimiter(',')
      ->check(CLI::IsMember(kTests));
  sub->add_option("-p,--n-prompt", a->s.prefill_tokens, "Prefill lengths P")
      ->delimiter(',')
      ->check(positive);
  sub->add_option("-c,--n-cached", a->s.cache_tokens, "Decode cache lengths C")
      ->delimiter(',')
      ->check(positive);
  sub->add_option("-b,--batch", a->s.batch_sizes, "Batch sizes B")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  sub->add_option("-n,--n-gen", a->s.n_generate, "T: tokens generated with and without the cache")
      ->check(positive);
  sub->add_option("--ctx-size", a->n_ctx, "Context (default: the model's, at most 4096)")
      ->check(positive);
  sub->add_option("--batch-cached", a->s.batch_cached,
                  "Tokens in each sequence's cache in the batch sweep")
      ->check(positive);
  sub->add_option("--decode-steps", a->s.decode_steps, "Decode steps timed per repetition")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--bw-mib", a->bandwidth_mib, "MiB streamed by the bandwidth probe")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_flag("-v,--verbose", a->verbose,
                "Also print the kernel each matmul ran, by weight type and batch width");
  auto* json = sub->add_flag("--json", a->json, "Print JSON (schema: docs/bench-schema.md)");
  auto* csv = sub->add_flag("--csv", a->csv, "Print CSV, one row per measured quantity");
  auto* md = sub->add_flag("--md", a->md, "Print markdown tables (the default)");
  json->excludes(csv)->excludes(md);
  csv->excludes(md);
  sub->add_option("--plot", a->plot_dir, "Write SVG charts into this directory");
  return {sub, [a] { return run(*a); }};
}

}  // namespace barata::cli
