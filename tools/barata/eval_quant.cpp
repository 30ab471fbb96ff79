// barata eval-quant -m FILE [--schemes LIST] [-f TEXT]: what each quantization
// scheme costs one model, measured three ways on the same model (perplexity
// and KL against the reference, the factual battery, teacher-forced top-1
// agreement with the reference) beside its size and weight-space error. Each
// scheme is quantized from the file's own weights into a temporary GGUF,
// loaded and evaluated, then removed. docs/eval.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/agreement.h"
#include "barata/battery.h"
#include "barata/convert.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/gguf.h"
#include "barata/model.h"
#include "barata/perplexity.h"
#include "barata/quantize.h"
#include "barata/tokenizer.h"
#include "commands.h"
#include "default_model.h"
#include "session.h"

namespace barata::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDefaultSchemes =
    "reference,int8-tensor,int8-row,int4-tensor,int4-row,int4-g128,nf4,q8_0,q4_0,q4_k";

struct EvalQuantArgs {
  std::string model, text_file, schemes = kDefaultSchemes, questions, work_dir, device = "cpu";
  int64_t n_ctx = 512, chunks = 9;
  int n_agree = 9, threads = 0;
  bool json = false, plain = false;
};

struct Row {
  std::string scheme;
  std::string weights;  // the weights' scheme ("reference", "q4_k", ...)
  DType type;
  KvType kv_k = KvType::kF16, kv_v = KvType::kF16;  // the KV cache's types
  QuantResult q;
  double rel_mean = 0, rel_worst = 0;
  std::string worst_matrix;
  int fallbacks = 0;
  PerplexityResult ppl;
  BatteryResult battery;
  AgreementResult agree;
  double seconds = 0;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// The reference: the file's own precision when every matrix is F32 or F16,
// else the file dequantized to F16.
DType reference_type(const SourceModel& src) {
  bool all_f32 = true;
  for (const SourceTensor& t : src.tensors)
    if (t.shape.size() == 2 && t.source_type != "F32") all_f32 = false;
  return all_f32 ? DType::F32 : DType::F16;
}

class TempFolder {
 public:
  explicit TempFolder(const std::string& given) {
    if (!given.empty()) {
      path_ = given;
      fs::create_directories(path_);
      keep_ = true;
      return;
    }
    path_ = fs::temp_directory_path() / fmt::format("barata-eval-quant-{}", ::getpid());
    fs::create_directories(path_);
  }
  ~TempFolder() {
    std::error_code ec;
    if (!keep_) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  bool kept() const { return keep_; }

 private:
  fs::path path_;
  bool keep_ = false;
};

std::string human_bytes(uint64_t b) {
  return b >= (1ull << 30) ? fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30))
                           : fmt::format("{:.1f} MiB", static_cast<double>(b) / (1ull << 20));
}

std::string ppl_text(double p) {
  return p >= 1e5 ? fmt::format("{:.4g}", p) : fmt::format("{:.2f}", p);
}

int run_eval_quant(EvalQuantArgs& a) {
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  const std::string text_file =
      a.text_file.empty() ? (fs::path(default_battery_path()).parent_path().parent_path() / "text" /
                             "devils-dictionary-a-f.txt")
                                .string()
                          : a.text_file;
  const std::string text = read_regular_file(text_file, "text file");
  const std::vector<BatteryQuestion> questions =
      load_battery(a.questions.empty() ? default_battery_path() : fs::path(a.questions));
  const SourceModel src = load_source(path);
  {
    // A text too short for two chunks is refused before anything is quantized.
    const Tokenizer tok = Tokenizer::from_gguf(GgufFile::open(path));
    const size_t n = perplexity_tokens(tok, text).size();
    if (static_cast<int64_t>(n) < 2 * a.n_ctx)
      fail("{}: the text has {} tokens; perplexity at -c {} needs at least {} (two chunks)",
           text_file, n, a.n_ctx, 2 * a.n_ctx);
  }
  const DeviceKind device = parse_device(a.device).value_or(DeviceKind::kCpu);
  const int threads = a.threads > 0
                          ? a.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // A scheme: weights ("reference", a quantization type), optionally with a
  // KV cache type: "WEIGHTS+kv:K[/V]", or "kv:K[/V]" on the reference weights
  // (V defaults to K's storage type: kv:q8_0s is K q8_0s, V q8_0).
  struct Scheme {
    std::string name, weights;
    DType type;
    KvType k = KvType::kF16, v = KvType::kF16;
  };
  std::vector<Scheme> schemes;
  for (const std::string& name : split(a.schemes)) {
    Scheme sc{name, name, DType::F16};
    const size_t at = name.rfind("kv:");
    if (at != std::string::npos) {
      if (at > 0 && name[at - 1] != '+')
        fail("--schemes: '{}': write WEIGHTS+kv:K/V or kv:K/V", name);
      sc.weights = at == 0 ? "reference" : name.substr(0, at - 1);
      const std::string kv = name.substr(at + 3);
      const size_t slash = kv.find('/');
      const std::string kn = kv.substr(0, slash);
      const auto k = parse_kv_type(kn);
      if (!k)
        fail("--schemes: '{}': K cache type '{}' is none of {}", name, kn, kv_type_names(true));
      sc.k = *k;
      sc.v = kv_storage_type(*k);
      if (slash != std::string::npos) {
        const std::string vn = kv.substr(slash + 1);
        const auto v = parse_kv_type(vn);
        if (!v || kv_type_info(*v).k_only)
          fail("--schemes: '{}': V cache type '{}' is none of {}", name, vn, kv_type_names(false));
        sc.v = *v;
      }
    }
    sc.type = sc.weights == "reference" ? reference_type(src) : parse_quant_type(sc.weights);
    schemes.push_back(sc);
  }
  if (schemes.empty()) fail("--schemes: no scheme named");
  if (schemes.front().name != "reference")
    schemes.insert(schemes.begin(), Scheme{"reference", "reference", reference_type(src)});

  TempFolder work(a.work_dir);
  const fs::path base_logits = work.path() / "reference.lgp";
  std::vector<GreedyTrace> traces;
  std::vector<Row> rows;
  BatteryOptions bo;
  bo.plain = a.plain;
  for (size_t si = 0; si < schemes.size(); ++si) {
    const auto t0 = std::chrono::steady_clock::now();
    Row row;
    row.scheme = schemes[si].name;
    row.type = schemes[si].type;
    row.kv_k = schemes[si].k;
    row.kv_v = schemes[si].v;
    row.weights = schemes[si].weights;
    const std::string& weights = row.weights;
    const fs::path file = work.path() / fmt::format("{}.gguf", weights);
    // Weights an earlier row quantized (a KV scheme on them) are reused.
    const auto same =
        std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.weights == weights; });
    if (same != rows.end()) {
      row.q = same->q;
    } else {
      fmt::print(stderr, "[{}/{}] {} ({}): quantizing\n", si + 1, schemes.size(), row.scheme,
                 quant_type_label(row.type));
      QuantOptions qo;
      qo.type = row.type;
      qo.threads = threads;
      row.q = quantize_model(src, qo, file);
    }
    double sum_w = 0, sum = 0;
    for (const MatrixStats& m : row.q.matrices) {
      sum += m.rel_error * static_cast<double>(m.n);
      sum_w += static_cast<double>(m.n);
      if (m.rel_error >= row.rel_worst) {
        row.rel_worst = m.rel_error;
        row.worst_matrix = m.name;
      }
    }
    row.rel_mean = sum_w > 0 ? sum / sum_w : 0;
    for (const TensorPlan& p : row.q.plan) row.fallbacks += p.fallback;
    {
      const Model model = Model::load(file);
      const Tokenizer tok = Tokenizer::from_gguf(model.file());
      Engine engine(model, {.n_threads = threads,
                            .n_ctx = std::max<int64_t>(a.n_ctx, 256),
                            .device = device,
                            .cache_k = row.kv_k,
                            .cache_v = row.kv_v});
      PerplexityOptions po;
      po.n_ctx = a.n_ctx;
      po.max_chunks = a.chunks;
      po.model_name = row.scheme;
      if (si == 0)
        po.save_logits = &base_logits;
      else
        po.kl_base = &base_logits;
      fmt::print(stderr, "[{}/{}] {}: perplexity\n", si + 1, schemes.size(), row.scheme);
      const std::vector<int32_t> ids = perplexity_tokens(tok, text);
      row.ppl = perplexity(engine, tok, ids, po);
      fmt::print(stderr, "[{}/{}] {}: battery\n", si + 1, schemes.size(), row.scheme);
      row.battery = run_battery(engine, tok, questions, bo);
      if (si == 0) {
        std::vector<std::vector<int32_t>> prompts;
        for (const BatteryQuestion& q : questions) {
          const BatteryPrompt bp = battery_prompt(tok, q.q, bo);
          prompts.push_back(tok.encode(bp.text, tok.add_bos_default(), bp.parse_special));
        }
        traces = greedy_traces(engine, prompts, a.n_agree);
      }
      fmt::print(stderr, "[{}/{}] {}: agreement\n", si + 1, schemes.size(), row.scheme);
      row.agree = teacher_forced_agreement(engine, traces);
    }
    std::error_code ec;
    const bool later =
        std::any_of(schemes.begin() + static_cast<std::ptrdiff_t>(si) + 1, schemes.end(),
                    [&](const Scheme& sc) { return sc.weights == weights; });
    if (!work.kept() && !later) fs::remove(file, ec);
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print(stderr, "[{}/{}] {}: PPL {} battery {}/{} agreement {}/{} ({:.0f} s)\n", si + 1,
               schemes.size(), row.scheme, ppl_text(row.ppl.ppl), row.battery.correct,
               row.battery.total(), row.agree.matches, row.agree.n, row.seconds);
    rows.push_back(std::move(row));
  }

  const Row& ref = rows.front();
  if (a.json) {
    nlohmann::json j = {{"schema", "barata.eval_quant/1"},
                        {"model", path},
                        {"text", text_file},
                        {"n_ctx", a.n_ctx},
                        {"n_chunks", ref.ppl.n_chunks},
                        {"n_scored", ref.ppl.n_scored},
                        {"threads", threads},
                        {"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      nlohmann::json battery = nlohmann::json::array();
      for (const BatteryRow& b : r.battery.rows)
        battery.push_back({{"question", b.question}, {"reply", b.reply}, {"ok", b.ok}});
      nlohmann::json row = {{"scheme", r.scheme},
                            {"type", quant_type_label(r.type)},
                            {"cache_type_k", kv_type_name(r.kv_k)},
                            {"cache_type_v", kv_type_name(r.kv_v)},
                            {"bits_per_weight", r.q.bits_per_weight()},
                            {"file_bytes", r.q.file_bytes},
                            {"fallback_tensors", r.fallbacks},
                            {"rel_error_mean", r.rel_mean},
                            {"rel_error_worst", r.rel_worst},
                            {"worst_matrix", r.worst_matrix},
                            {"ppl", r.ppl.ppl},
                            {"ppl_err", r.ppl.ppl_err},
                            {"battery_correct", r.battery.correct},
                            {"battery_total", r.battery.total()},
                            {"battery", battery},
                            {"agreement_matches", r.agree.matches},
                            {"agreement_n", r.agree.n},
                            {"seconds", r.seconds}};
      if (r.ppl.kl) {
        row["kl_mean"] = r.ppl.kl->mean;
        row["kl_p99"] = r.ppl.kl->p99;
        row["same_top"] = r.ppl.kl->same_top;
      }
      j["rows"].push_back(row);
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print(
      "{}: {} tokens of {}, -c {}, {} chunks ({} scored); battery {} questions; agreement "
      "{} prompts x {} tokens; {} threads\n\n",
      fs::path(path).filename().string(), ref.ppl.n_text_tokens,
      fs::path(text_file).filename().string(), a.n_ctx, ref.ppl.n_chunks, ref.ppl.n_scored,
      questions.size(), traces.size(), a.n_agree, threads);
  fmt::print(
      "| scheme | bits/weight | file | weight rel. error mean / worst | PPL | battery | agreement "
      "| KL mean |\n|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    const std::string name =
        r.scheme == "reference"
            ? fmt::format("reference ({})", quant_type_label(r.type))
            : r.scheme + (r.fallbacks ? fmt::format(" ({} fallback)", r.fallbacks) : "");
    fmt::print("| {} | {:.3f} | {} | {:.4f} / {:.4f} | {} ± {} | {}/{} | {}/{} | {} |\n", name,
               r.q.bits_per_weight(), human_bytes(r.q.file_bytes), r.rel_mean, r.rel_worst,
               ppl_text(r.ppl.ppl), ppl_text(r.ppl.ppl_err), r.battery.correct, r.battery.total(),
               r.agree.matches, r.agree.n, r.ppl.kl ? fmt::format("{:.4f}", r.ppl.kl->mean) : "—");
  }
  // Which questions flipped.
  fmt::print("\n| question |");
  for (const Row& r : rows) fmt::print(" {} |", r.scheme);
  fmt::print("\n|---|");
  for (size_t i = 0; i < rows.size(); ++i) fmt::print("---|");
  fmt::print("\n");
  for (size_t q = 0; q < ref.battery.rows.size(); ++q) {
    fmt::print("| {} |", ref.battery.rows[q].question);
    for (const Row& r : rows) fmt::print(" {} |", r.battery.rows[q].ok ? "yes" : "no");
    fmt::print("\n");
  }
  return 0;
}

}  // namespace

Command add_eval_quant(CLI::App& app) {
  auto a = std::make_shared<EvalQuantArgs>();
  CLI::App* sub = app.add_subcommand(
      "eval-quant",
      "What each quantization scheme costs one model: bits, size, weight error, perplexity, "
      "KL, the factual battery and top-1 agreement against the reference");
  sub->add_option("-m,--model", a->model, "GGUF file (default: the fetched default model)")
      ->check(CLI::ExistingFile);
  sub->add_option("-f,--file", a->text_file,
                  "Text for perplexity (default: tests/data/text/devils-dictionary-a-f.txt)")
      ->check(CLI::ExistingFile);
  sub->add_option("--schemes", a->schemes,
                  fmt::format("Comma-separated schemes; 'reference' is always first; a KV cache "
                              "row: kv:K[/V] (reference weights) or WEIGHTS+kv:K[/V], e.g. "
                              "kv:iq4_nls/iq4_nl (default: {})",
                              kDefaultSchemes));
  sub->add_option("-c,--ctx-size", a->n_ctx, "Perplexity chunk size (default 512)")
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 20));
  sub->add_option("--chunks", a->chunks,
                  "Perplexity chunks (default 9: 2,295 scored tokens at -c 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("-n,--agreement-tokens", a->n_agree,
                  "Greedy tokens per battery prompt for agreement (default 9)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--questions", a->questions,
                  "Battery file (default: tests/data/eval/battery.jsonl)")
      ->check(CLI::ExistingFile);
  sub->add_flag("--plain", a->plain, "Ask the battery without the chat template");
  sub->add_option("-t,--threads", a->threads, "Threads (default: hardware threads)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--device", a->device, "Backend: cpu or cuda (default: cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option(
      "--work-dir", a->work_dir,
      "Folder for the quantized files, kept there (default: a temporary folder, removed)");
  sub->add_flag("--json", a->json, "JSON on stdout instead of the Markdown tables");
  return {sub, [a] { return run_eval_quant(*a); }};
}

}  // namespace barata::cli
