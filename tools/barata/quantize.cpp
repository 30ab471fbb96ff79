// barata quantize IN OUT --type T: a GGUF (any readable type) or a Hugging
// Face checkpoint directory to a GGUF of type T, with the error it cost.
// barata quantize IN --report: every scheme side by side, nothing written.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/quantize.h"
#include "commands.h"
#include <thread>

namespace barata::cli {
namespace {

struct QuantizeArgs {
  std::string in, out, type, embed_type, output_type;
  std::vector<std::string> overrides;
  bool report = false, json = false, keep_embeddings = false, all_tensors = false;
  int threads = 0;
};

bool is_projection(const std::string& name) {
  return name.rfind("blk.", 0) == 0;
}

std::string mib(uint64_t b) {
  return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1024.0 * 1024.0));
}

// Mean and worst relative error over the matrices of a result.
struct Summary {
  double mean = 0, worst = 0;
  std::string worst_name;
};
Summary summarize(const QuantResult& r) {
  Summary s;
  for (const auto& m : r.matrices) {
    s.mean += m.rel_error;
    if (m.rel_error >= s.worst) {
      s.worst = m.rel_error;
      s.worst_name = m.name;
    }
  }
  if (!r.matrices.empty()) s.mean /= static_cast<double>(r.matrices.size());
  return s;
}

nlohmann::json matrix_json(const MatrixStats& m) {
  return {{"name", m.name},
          {"type", quant_type_label(m.type)},
          {"elements", m.n},
          {"bytes", m.bytes},
          {"rel_error", m.rel_error},
          {"max_over_std", m.max_over_std},
          {"beyond_6sigma", m.beyond_6sigma}};
}

nlohmann::json result_json(const QuantResult& r) {
  const Summary s = summarize(r);
  nlohmann::json j = {{"file_bytes", r.file_bytes},
                      {"bits_per_weight", r.bits_per_weight()},
                      {"quantized_weights", r.quantized_weights},
                      {"quantized_bytes", r.quantized_bytes},
                      {"mean_rel_error", s.mean},
                      {"worst_rel_error", s.worst},
                      {"worst_tensor", s.worst_name},
                      {"seconds", r.seconds}};
  j["fallbacks"] = nlohmann::json::array();
  for (const auto& p : r.plan)
    if (p.fallback) j["fallbacks"].push_back({{"name", p.name}, {"reason", p.why}});
  j["matrices"] = nlohmann::json::array();
  for (const auto& m : r.matrices) j["matrices"].push_back(matrix_json(m));
  return j;
}

void print_fallbacks(const QuantResult& r) {
  int n = 0;
  for (const auto& p : r.plan)
    if (p.fallback) ++n;
  if (n == 0) return;
  fmt::print("\n{} tensor(s) could not take the requested type:\n", n);
  for (const auto& p : r.plan)
    if (p.fallback) fmt::print("  {}: {}\n", printable(p.name), p.why);
}

// A progress bar on stderr when it is a terminal, else nothing.
std::function<void(size_t, size_t, const std::string&)> progress_bar() {
  const bool tty = ::isatty(2) != 0;
  return [tty](size_t done, size_t total, const std::string& name) {
    if (!tty) return;
    const int width = 30, fill = static_cast<int>(width * done / std::max<size_t>(total, 1));
    fmt::print(stderr, "\r[{}{}] {:3d}% {}/{} {:<32.32}", std::string(fill, '#'),
               std::string(width - fill, '.'), 100 * done / std::max<size_t>(total, 1), done, total,
               name);
    if (done == total) fmt::print(stderr, "\n");
    std::fflush(stderr);
  };
}

// The flags as QuantOptions, checked against each other.
QuantOptions options(const QuantizeArgs& a) {
  QuantOptions opt;
  if (!a.report && a.type.empty())
    fail("quantize: --type is required (valid: {})", quant_type_names());
  if (!a.type.empty()) opt.type = parse_quant_type(a.type);
  if (a.keep_embeddings) opt.embed_type = opt.output_type = DType::F16;
  if (!a.embed_type.empty()) opt.embed_type = parse_quant_type(a.embed_type);
  if (!a.output_type.empty()) opt.output_type = parse_quant_type(a.output_type);
  for (const auto& o : a.overrides) {
    const size_t eq = o.rfind('=');
    if (eq == std::string::npos || eq == 0)
      fail("quantize: --override '{}' must be PATTERN=TYPE (e.g. 'blk.*.ffn_down.weight=q8_0')", o);
    opt.overrides.emplace_back(o.substr(0, eq), parse_quant_type(o.substr(eq + 1)));
  }
  opt.threads = a.threads > 0 ? a.threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (a.report && !a.out.empty())
    fail("quantize: --report is a dry run and writes nothing; drop OUT ('{}') or --report", a.out);
  if (!a.report && a.out.empty()) fail("quantize: OUT is required (or --report for a dry run)");
  opt.progress = progress_bar();
  return opt;
}

// --report: every scheme on every matrix, as tables or JSON.
int print_report(const QuantizeArgs& a, const SourceModel& src, const QuantOptions& opt) {
  const std::vector<SchemeReport> reps = quantization_report(src, opt);
  if (a.json) {
    nlohmann::json j = {{"input", a.in}, {"source", src.description}};
    j["schemes"] = nlohmann::json::array();
    for (const auto& r : reps) {
      nlohmann::json s = result_json(r.result);
      s["scheme"] = r.scheme.name;
      s["description"] = r.scheme.summary;
      j["schemes"].push_back(std::move(s));
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("# Quantization report: {}\n\n", src.description);
  fmt::print("Relative error ||W - Q(W)|| / ||W|| per matrix ({}):\n\n",
             a.all_tensors ? "every 2-D tensor" : "projection matrices; --all adds embeddings");
  fmt::print("| tensor | max/std | >6σ |");
  for (const auto& r : reps) fmt::print(" {} |", r.scheme.name);
  fmt::print("\n|---|---:|---:|");
  for (size_t i = 0; i < reps.size(); ++i) fmt::print("---:|");
  fmt::print("\n");
  for (size_t m = 0; m < reps[0].result.matrices.size(); ++m) {
    const MatrixStats& s0 = reps[0].result.matrices[m];
    if (!a.all_tensors && !is_projection(s0.name)) continue;
    fmt::print("| {} | {:.1f} | {} |", printable(s0.name), s0.max_over_std, s0.beyond_6sigma);
    for (const auto& r : reps) {
      const MatrixStats& s = r.result.matrices[m];
      fmt::print(" {:.4f}{} |", s.rel_error, s.type != r.scheme.type ? "*" : "");
    }
    fmt::print("\n");
  }
  fmt::print("\n* = stored at a fallback type (row length not a multiple of the block)\n\n");
  fmt::print(
      "| scheme | mean rel. error | worst rel. error | worst tensor | bits/weight | file |\n");
  fmt::print("|---|---:|---:|---|---:|---:|\n");
  for (const auto& r : reps) {
    const Summary s = summarize(r.result);
    fmt::print("| {} | {:.4f} | {:.4f} | {} | {:.3f} | {} |\n", r.scheme.name, s.mean, s.worst,
               printable(s.worst_name), r.result.bits_per_weight(), mib(r.result.file_bytes));
  }
  fmt::print(
      "\nbits/weight: stored bytes of all 2-D tensors (scales, headers and fallbacks "
      "included) x 8 / their weights.\n");
  for (const auto& r : reps) {
    int n = 0;
    for (const auto& p : r.result.plan) n += p.fallback;
    if (n > 0) fmt::print("{}: {} tensor(s) at a fallback type\n", r.scheme.name, n);
  }
  return 0;
}

// The written file: its tensors, their types and errors, as a table or JSON.
int print_result(const QuantizeArgs& a, const SourceModel& src, const QuantOptions& opt,
                 const QuantResult& r) {
  const Summary s = summarize(r);
  if (a.json) {
    nlohmann::json j = result_json(r);
    j["input"] = a.in;
    j["output"] = a.out;
    j["type"] = quant_type_label(opt.type);
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  std::map<std::string, int> by_type;
  for (const auto& p : r.plan) ++by_type[quant_type_label(p.type)];
  fmt::print("{} -> {} ({}), {} tensors in {:.1f} s\n", printable(src.description),
             printable(a.out), quant_type_label(opt.type), r.plan.size(), r.seconds);
  std::string types;
  for (const auto& [t, n] : by_type)
    types += fmt::format("{}{} {}", types.empty() ? "" : ", ", n, t);
  fmt::print("tensor types: {}\n", types);
  fmt::print("| tensor | type | rel. error | max/std | >6σ |\n|---|---|---:|---:|---:|\n");
  for (const auto& m : r.matrices)
    fmt::print("| {} | {} | {:.4f} | {:.1f} | {} |\n", printable(m.name), quant_type_label(m.type),
               m.rel_error, m.max_over_std, m.beyond_6sigma);
  fmt::print(
      "\nmean rel. error {:.4f}, worst {:.4f} ({}); {:.3f} bits/weight over {} weights; "
      "file {} ({} bytes)\n",
      s.mean, s.worst, s.worst_name, r.bits_per_weight(), r.quantized_weights, mib(r.file_bytes),
      r.file_bytes);
  print_fallbacks(r);
  return 0;
}

int run_quantize(const QuantizeArgs& a) {
  const QuantOptions opt = options(a);
  const SourceModel src = load_source(a.in);
  if (a.report) return print_report(a, src, opt);
  return print_result(a, src, opt, quantize_model(src, opt, a.out));
}

}  // namespace

Command add_quantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "quantize", "Quantize a GGUF or a Hugging Face checkpoint directory, with an error report");
  sub->add_option("IN", a->in, "GGUF file or checkpoint directory (config.json, *.safetensors)")
      ->required();
  sub->add_option("OUT", a->out, "Output GGUF (written atomically; never the input)");
  sub->add_option("--type", a->type, "Target type: " + quant_type_names());
  sub->add_flag("--report", a->report,
                "Dry run: every scheme side by side (int8/int4 per tensor and per row, int4 "
                "group-128, NF4, q8_0, q4_0), nothing written");
  sub->add_flag("--json", a->json, "JSON instead of tables");
  sub->add_flag("--all", a->all_tensors, "Report: list the embedding/output matrices too");
  sub->add_option("--embed-type", a->embed_type, "Type of token_embd.weight");
  sub->add_option("--output-type", a->output_type, "Type of output.weight");
  sub->add_flag("--keep-embeddings", a->keep_embeddings,
                "Keep token_embd / output at F16 (overridden by --embed-type/--output-type)");
  sub->add_option("--override", a->overrides,
                  "PATTERN=TYPE: tensors whose name matches the glob get TYPE (repeatable; first "
                  "match wins)");
  sub->add_option("-t,--threads", a->threads, "Threads (default: all cores)")
      ->check(CLI::Range(1, 1024));
  return {sub, [a] { return run_quantize(*a); }};
}

}  // namespace barata::cli
