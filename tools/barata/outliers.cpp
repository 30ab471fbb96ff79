// barata outliers: one prefill of a prompt with the residual stream captured
// after every layer, then the outlier statistics of barata/outliers.h as a
// text report (bars included), JSON (--json) and SVG charts (--plot DIR).
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "barata/atomic_file.h"
#include "barata/bench.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/outliers.h"
#include "commands.h"
#include "session.h"

namespace barata::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace barata::outliers;

struct OutlierArgs {
  ModelOptions model;
  std::string prompt, prompt_file, plot_dir;
  int64_t layer = -1;  // -1: n_layer / 2
  int64_t top_k = 4;
  bool json = false, no_bos = false;
};

// "4-20", "3, 5-7, 9".
std::string ranges(const std::vector<int64_t>& v) {
  std::string o;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!o.empty()) o += ", ";
    o += j == i ? fmt::format("{}", v[i]) : fmt::format("{}-{}", v[i], v[j]);
    i = j + 1;
  }
  return o;
}

json levels_json(const Int8Levels& q, const LayerSummary& s) {
  json typical = json::array();
  for (size_t i = 0; i < q.typical.size(); ++i)
    typical.push_back({{"dim", q.typical[i]},
                       {"max_abs", s.dim_max[static_cast<size_t>(q.typical[i])]},
                       {"levels", q.typical_levels[i]}});
  return {{"scale", q.scale},
          {"excluded_dims", q.excluded},
          {"typical", typical},
          {"median_levels", q.median_levels},
          {"tensor_levels", q.tensor_levels}};
}

json to_json(const Analysis& a, const std::string& model, size_t n_tokens) {
  json layers = json::array();
  for (const LayerSummary& s : a.layers)
    layers.push_back({{"layer", s.layer},
                      {"max_abs", s.max_abs},
                      {"max_dim", s.max_dim},
                      {"max_token", s.max_row},
                      {"median_abs", s.median_abs},
                      {"p99_abs", s.p99_abs},
                      {"median_dim_max", s.median_dim_max}});
  json top = json::array();
  for (const TopDim& t : a.top)
    top.push_back(
        {{"dim", t.dim}, {"max_abs", t.max_abs}, {"max_layer", t.max_layer}, {"layers", t.layers}});
  json bins = json::array();
  for (const Bin& b : a.histogram) bins.push_back({{"lo", b.lo}, {"hi", b.hi}, {"count", b.count}});
  const LayerSummary& s = a.layers[static_cast<size_t>(a.layer)];
  return {{"model", model},
          {"tokens", n_tokens},
          {"n_layer", a.layers.size()},
          {"d_model", s.d},
          {"top_k", a.top_k},
          {"layers", layers},
          {"top_dims", top},
          {"layer", a.layer},
          {"histogram", bins},
          {"int8",
           {{"all_dims", levels_json(a.with_outliers, s)},
            {"without_top_dims", levels_json(a.without_outliers, s)},
            {"scale_shrink", a.scale_shrink}}}};
}

std::string typical_line(const Int8Levels& q, const LayerSummary& s) {
  std::string o;
  for (size_t i = 0; i < q.typical.size(); ++i) {
    const auto j = static_cast<size_t>(q.typical[i]);
    o += fmt::format("{}dim {} (max {:.2f}): {}", o.empty() ? "" : ", ", j, s.dim_max[j],
                     q.typical_levels[i]);
  }
  return o;
}

void print_text(const Analysis& a, const std::string& model, size_t n_tokens, int threads) {
  const LayerSummary& s = a.layers[static_cast<size_t>(a.layer)];
  fmt::print("model {} | {} tokens | {} layers x {} dimensions | threads {}\n\n", model, n_tokens,
             a.layers.size(), s.d, threads);
  fmt::print("residual stream after each layer, |h| over {} tokens x {} dimensions:\n", n_tokens,
             s.d);
  fmt::print("  layer      max |h|    dim  token   median |h|    p99 |h|   median dim max\n");
  for (const LayerSummary& l : a.layers)
    fmt::print("  {:>5} {:>12.2f} {:>6} {:>6} {:>12.4f} {:>10.3f} {:>16.3f}\n", l.layer, l.max_abs,
               l.max_dim, l.max_row, l.median_abs, l.p99_abs, l.median_dim_max);
  fmt::print("\ndimensions in some layer's top {} by max |h| ({} layers in all):\n", a.top_k,
             a.layers.size());
  for (const TopDim& t : a.top)
    fmt::print("  dim {:>5}: max {:>10.2f} at layer {:>2}; in the top {} of {:>2}/{} layers: {}\n",
               t.dim, t.max_abs, t.max_layer, a.top_k, t.layers.size(), a.layers.size(),
               ranges(t.layers));
  fmt::print("\nlayer {}: max |h| per dimension, log2 bins (dimensions per bin):\n", a.layer);
  fmt::print("{}", histogram_bars(a.histogram));
  const Int8Levels& w = a.with_outliers;
  const Int8Levels& wo = a.without_outliers;
  fmt::print("\nint8 of layer {}'s activations, one symmetric scale for the tensor:\n", a.layer);
  fmt::print("  all dimensions:     scale {:.4f} (max |h| {:.2f} / 127)\n", w.scale, s.max_abs);
  fmt::print("    levels used of 256: {}\n", typical_line(w, s));
  fmt::print("    median dimension: {} of 256 levels; whole tensor: {} of 256\n", w.median_levels,
             w.tensor_levels);
  fmt::print("  without the top {} dimensions ({}): scale {:.4f}\n", a.top_k,
             fmt::join(wo.excluded, ", "), wo.scale);
  fmt::print("    levels used of 256: {}\n", typical_line(wo, s));
  fmt::print("    median dimension: {} of 256 levels; the rest of the tensor: {} of 256\n",
             wo.median_levels, wo.tensor_levels);
  fmt::print("  the scale shrinks {:.1f}x\n", a.scale_shrink);
}

void write_plots(const Analysis& a, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create the plot directory: {}", dir, ec.message());
  const std::string hist = fmt::format("outliers-histogram-layer{}.svg", a.layer);
  write_file_atomically(
      fs::path(dir) / hist,
      histogram_svg(
          a.histogram,
          fmt::format("Layer {}: per-dimension max |h| of the residual stream", a.layer)));
  bench::Chart c;
  c.title = "Residual stream |h| per layer";
  c.x_label = "layer";
  c.y_label = "|h| (log scale)";
  c.log10_y = true;
  bench::Series mx{"max |h|", {}, {}}, p99{"p99 |h|", {}, {}}, med{"median |h|", {}, {}};
  for (const LayerSummary& s : a.layers) {
    const auto l = static_cast<double>(s.layer);
    mx.x.push_back(l), mx.y.push_back(s.max_abs);
    p99.x.push_back(l), p99.y.push_back(s.p99_abs);
    med.x.push_back(l), med.y.push_back(s.median_abs);
  }
  c.series = {mx, p99, med};
  write_file_atomically(fs::path(dir) / "outliers-layers.svg", bench::to_svg(c));
  fmt::print(stderr, "wrote {} and outliers-layers.svg in {}\n", hist, dir);
}

int run(const OutlierArgs& a) {
  const std::string text =
      a.prompt_file.empty() ? a.prompt : read_regular_file(a.prompt_file, "prompt file");
  Session s(session_options(a.model));
  const int64_t n_layer = s.model.config().n_layer;
  const int64_t d = s.model.config().d_model;
  const int64_t layer = a.layer >= 0 ? a.layer : n_layer / 2;
  if (layer >= n_layer) fail("--layer {}: the model has layers 0..{}", layer, n_layer - 1);
  if (a.top_k >= d) fail("--top {}: the model has {} dimensions", a.top_k, d);
  const std::vector<int32_t> ids = s.tok.encode(text, !a.no_bos && s.tok.add_bos_default(), false);
  if (ids.empty()) fail("the prompt is empty (give -p TEXT or -f FILE)");
  if (static_cast<int64_t>(ids.size()) > s.n_ctx)
    fail("the prompt has {} tokens but the context holds {} (raise -c or shorten the prompt)",
         ids.size(), s.n_ctx);

  std::vector<LayerSummary> layers;
  std::vector<float> kept;  // the chosen layer's rows x d
  s.engine.set_residual_hook([&](int64_t l, const float* x, int64_t rows, int64_t dd) {
    layers.push_back(summarize_layer(l, x, rows, dd));
    if (l == layer) kept.assign(x, x + rows * dd);
  });
  std::vector<float> logits(static_cast<size_t>(s.model.config().n_vocab));
  s.engine.prefill(s.engine.new_sequence(), ids, logits.data());
  s.engine.set_residual_hook({});
  if (static_cast<int64_t>(layers.size()) != n_layer)
    fail("internal: captured {} layers of {}", layers.size(), n_layer);

  const Analysis an = analyze(std::move(layers), layer, kept.data(), a.top_k);
  if (a.json)
    fmt::print("{}\n", to_json(an, s.path, ids.size()).dump());
  else
    print_text(an, s.path, ids.size(), s.engine.n_threads());
  if (!a.plot_dir.empty()) write_plots(an, a.plot_dir);
  return 0;
}

}  // namespace

Command add_outliers(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "outliers", "Outlier dimensions of the residual stream, and what they do to int8");
  auto a = std::make_shared<OutlierArgs>();
  add_model_options(sub, a->model);
  auto* p = sub->add_option("-p,--prompt", a->prompt, "Prompt text");
  auto* f = sub->add_option("-f,--file", a->prompt_file, "Read the prompt from a file")
                ->check(CLI::ExistingFile);
  p->excludes(f);
  sub->add_option("--layer", a->layer,
                  "Layer of the histogram and the int8 study (default: the middle one)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  sub->add_option("--top", a->top_k,
                  "Outlier dimensions per layer: listed, and left out of the second int8 scale")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_flag("--no-bos", a->no_bos, "Do not add the BOS token");
  sub->add_flag("--json", a->json, "Print the statistics as JSON on stdout");
  sub->add_option("--plot", a->plot_dir, "Write SVG charts into this directory");
  sub->callback([a] {
    if (a->prompt.empty() && a->prompt_file.empty()) throw CLI::RequiredError("-p or -f");
  });
  return {sub, [a] { return run(*a); }};
}

}  // namespace barata::cli
