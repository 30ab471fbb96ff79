// barata spec-bench: plain decoding against speculative decoding at fixed
// gammas and --draft-auto, greedy, on the same prompts, in one run. Per
// configuration: tokens/s (mean +- sd over repetitions), the measured
// speedup, alpha, tokens per verify, the draft cost c, the verify cost v and
// the formula's predicted speedup beside the measured one; the
// teacher-forced agreement of the pair next to alpha.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/agreement.h"
#include "barata/atomic_file.h"
#include "barata/bench.h"
#include "barata/chat_template.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/spec_bench.h"
#include "commands.h"
#include "session.h"
#include "spec.h"

namespace barata::cli {
namespace {

// Chat prompts asking for code, and one edit-style prompt that holds the code
// to rewrite (where lookup shines).
const std::vector<std::string> kDefaultPrompts = {
    "Write a Python function that checks whether a number is prime.",
    "Write a C function that reverses a string in place.",
    "Rename the variable `total` to `sum_of_values` in this code and return the whole code:\n\n"
    "def average(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    if len(values) == 0:\n        return 0\n    return total / len(values)\n\n"
    "def report(values):\n    total = sum(values)\n    print('total', total)\n"
    "    print('mean', average(values))\n    return total\n"};

struct BenchArgs {
  ModelOptions model;
  SpecArgs spec;
  std::vector<std::string> prompts;
  std::string prompt_file;
  std::string gammas = "1,2,4,8";
  bool no_auto = false, plain = false, json = false, no_agreement = false;
  int n_predict = 128, reps = 2, agreement_n = 9;
  std::string plot;
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}
double sd(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

std::vector<int> parse_gammas(const std::string& s, int cap) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int g = 0;
    try {
      size_t used = 0;
      g = std::stoi(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      fail("--gammas: '{}' is not an integer (a list such as 1,2,4,8)", item);
    }
    if (g < 1 || g > cap) fail("--gammas: {} is outside [1, {}]", g, cap);
    out.push_back(g);
  }
  if (out.empty()) fail("--gammas: an empty list");
  return out;
}

int run(const BenchArgs& a) {
  std::vector<std::string> texts = a.prompts;
  if (!a.prompt_file.empty()) {
    std::istringstream in(read_regular_file(a.prompt_file, "prompts file"));
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) texts.push_back(line);
  }
  if (texts.empty()) texts = kDefaultPrompts;
  const std::vector<int> gammas = parse_gammas(a.gammas, 64);

  Session s(session_options(a.model));
  SamplerOptions greedy;
  greedy.temperature = 0.0f;
  SpecArgs spec = a.spec;
  spec.draft_max = *std::max_element(gammas.begin(), gammas.end());
  DraftSetup d = make_drafter(spec, s, greedy);

  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& t : texts) {
    std::string text = t;
    bool special = false;
    if (!a.plain) {
      if (auto f = detect_chat_family(s.tok.chat_template())) {
        text = single_turn_prompt(*f, s.tok.chat_template(), t);
        special = true;
      }
    }
    prompts.push_back(s.tok.encode(text, s.tok.add_bos_default(), special));
    if (static_cast<int64_t>(prompts.back().size()) + a.n_predict + 1 > s.n_ctx)
      fail("a prompt has {} tokens: with -n {} it does not fit the context of {} (raise -c)",
           prompts.back().size(), a.n_predict, s.n_ctx);
  }

  std::vector<SpecBenchConfig> configs;
  configs.push_back({.name = "plain"});
  for (int g : gammas) configs.push_back({.name = fmt::format("gamma {}", g), .gamma = g});
  if (!a.no_auto)
    configs.push_back({.name = fmt::format("auto (max {})", spec.draft_max),
                       .gamma = spec.draft_max,
                       .automatic = true});

  fmt::print(stderr, "spec-bench: {} prompts x {} configurations x {} repetitions, -n {}, {}\n",
             prompts.size(), configs.size(), a.reps, a.n_predict, d.name);
  const Tokenizer& tok = s.tok;
  run_spec_bench(s.engine, *d.drafter, prompts, configs,
                 {.n_predict = a.n_predict,
                  .reps = a.reps,
                  .draft_min = spec.draft_min,
                  .c_prior = d.c_prior,
                  .is_eog = [&tok](int32_t t) { return tok.is_eog(t); }},
                 [](const std::string& line) { fmt::print(stderr, "  {}\n", line); });

  // The teacher-forced agreement of the pair (a model drafter only).
  double agreement = -1;
  if (d.engine && !a.no_agreement)
    agreement = teacher_forced_agreement(s.engine, *d.engine, prompts, a.agreement_n).rate();

  const SpecBenchConfig& plain = configs[0];
  const double step_ms = plain.plain_steps ? plain.plain_ms / plain.plain_steps : 0;
  const double plain_tps = mean(plain.tps);
  nlohmann::json rows = nlohmann::json::array();
  std::string table =
      "| configuration | tokens/s | speedup | alpha | tokens/verify | c | v (pass/step) | "
      "predicted (gamma c + 1) | predicted (gamma c + v) |\n|---|---|---|---|---|---|---|---|---|"
      "\n";
  bench::Chart chart{.title = fmt::format("speculative decoding: {}", d.name),
                     .x_label = "gamma (tokens drafted per verify)",
                     .y_label = "speedup over plain decoding"};
  bench::Series measured{.name = "measured"}, pred1{.name = "predicted: gamma c + 1"},
      predv{.name = "predicted: gamma c + v"}, autos{.name = "--draft-auto (measured)"};
  for (const SpecBenchConfig& c : configs) {
    const double tps = mean(c.tps);
    const double speedup = plain_tps > 0 ? tps / plain_tps : 0;
    nlohmann::json row = {{"configuration", c.name},
                          {"gamma", c.gamma},
                          {"auto", c.automatic},
                          {"tokens_per_s_mean", tps},
                          {"tokens_per_s_sd", sd(c.tps)},
                          {"tokens_per_s", c.tps},
                          {"speedup", speedup}};
    if (c.gamma == 0) {
      table += fmt::format("| plain | {:.2f} ± {:.2f} | 1.00 | | | | | | |\n", tps, sd(c.tps));
      row["step_ms"] = step_ms;
      rows.push_back(row);
      continue;
    }
    const double alpha = c.trials ? static_cast<double>(c.accepted) / c.trials : 0;
    const double per_verify =
        c.verify_passes ? static_cast<double>(c.accepted + c.verify_passes) / c.verify_passes : 0;
    const double cc = d.engine && c.drafted && step_ms > 0 ? c.draft_ms / c.drafted / step_ms : 0.0;
    const double v = c.verify_passes && step_ms > 0 ? c.verify_ms / c.verify_passes / step_ms : 0;
    const double mean_gamma =
        c.verify_passes ? static_cast<double>(c.verify_rows) / c.verify_passes - 1 : 0;
    const int g = c.automatic ? static_cast<int>(std::lround(mean_gamma)) : c.gamma;
    const double p1 = c.automatic ? 0 : predicted_speedup(alpha, g, cc);
    const double pv = c.automatic ? 0 : predicted_speedup(alpha, g, cc, v);
    table += fmt::format(
        "| {} | {:.2f} ± {:.2f} | {:.2f} | {:.3f} | {:.2f} | {:.3f} | {:.2f} | {} | {} |\n", c.name,
        tps, sd(c.tps), speedup, alpha, per_verify, cc, v,
        c.automatic ? "" : fmt::format("{:.2f}", p1), c.automatic ? "" : fmt::format("{:.2f}", pv));
    row.update({{"alpha", alpha},
                {"acceptance", c.drafted ? static_cast<double>(c.accepted) / c.drafted : 0},
                {"tokens_per_verify", per_verify},
                {"c", cc},
                {"verify_cost", v},
                {"mean_gamma", mean_gamma},
                {"verify_passes", c.verify_passes},
                {"plain_steps", c.plain_steps}});
    if (!c.automatic) {
      row["predicted_speedup"] = p1;
      row["predicted_speedup_with_verify_cost"] = pv;
      measured.x.push_back(c.gamma);
      measured.y.push_back(speedup);
      pred1.x.push_back(c.gamma);
      pred1.y.push_back(p1);
      predv.x.push_back(c.gamma);
      predv.y.push_back(pv);
    }
    rows.push_back(row);
  }
  if (!a.no_auto && !measured.x.empty()) {
    autos.x = {measured.x.front(), measured.x.back()};
    autos.y.assign(2, rows.back()["speedup"].get<double>());
  }
  chart.log2_x = true;
  chart.series = {measured, pred1, predv};
  if (!autos.x.empty()) chart.series.push_back(autos);
  if (!a.plot.empty()) write_file_atomically(a.plot, bench::to_svg(chart));

  if (a.json) {
    nlohmann::json j = {{"schema", "barata.spec_bench/1"},
                        {"target", s.path},
                        {"drafter", d.name},
                        {"n_predict", a.n_predict},
                        {"repetitions", a.reps},
                        {"prompts", prompts.size()},
                        {"threads", s.engine.n_threads()},
                        {"teacher_forced_agreement",
                         agreement >= 0 ? nlohmann::json(agreement) : nlohmann::json(nullptr)},
                        {"rows", rows}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("target {} | draft {} | {} prompts, -n {}, greedy, {} threads, {} repetitions\n\n",
               s.path, d.name, prompts.size(), a.n_predict, s.engine.n_threads(), a.reps);
    fmt::print("{}", table);
    if (agreement >= 0)
      fmt::print("\nteacher-forced agreement of the pair ({} tokens after each prompt): {:.3f}\n",
                 a.agreement_n, agreement);
    fmt::print(
        "\nalpha: per drafted token, kept / (kept + rejections); c: draft ms per token / plain "
        "step ms; v: verify pass ms / plain step ms.\n");
  }
  return 0;
}

}  // namespace

Command add_spec_bench(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "spec-bench", "Speculative decoding against plain decoding: speedup, alpha, c, v, formula");
  auto a = std::make_shared<BenchArgs>();
  add_model_options(sub, a->model);
  add_spec_options(sub, a->spec, false);
  sub->add_option("-p,--prompt", a->prompts, "A prompt (repeatable; default: three code prompts)");
  sub->add_option("-f,--file", a->prompt_file, "Prompts, one per line")->check(CLI::ExistingFile);
  sub->add_option("-n,--n-predict", a->n_predict, "Tokens per generation")
      ->check(CLI::Range(2, 1 << 20));
  sub->add_option("--gammas", a->gammas, "Fixed gammas to measure (default 1,2,4,8)");
  sub->add_flag("--no-auto", a->no_auto, "Leave --draft-auto out");
  sub->add_option("--reps", a->reps, "Repetitions of the whole sweep")->check(CLI::Range(1, 100));
  sub->add_flag("--plain", a->plain, "Prompts as they are, not in the chat template");
  sub->add_flag("--no-agreement", a->no_agreement, "Skip the teacher-forced agreement");
  sub->add_option("--agreement-n", a->agreement_n, "Tokens per prompt for the agreement")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--plot", a->plot, "Write the speedup-against-gamma chart (SVG) here");
  sub->add_flag("--json", a->json, "JSON (schema barata.spec_bench/1)");
  sub->callback([a] {
    if (!a->spec.any()) throw CLI::RequiredError("--draft, --draft-self or --lookup");
  });
  return {sub, [a] { return run(*a); }};
}

}  // namespace barata::cli
