// barata batch: many requests through the scheduler (include/barata/scheduler.h),
// under static or continuous batching or both, with latency, throughput,
// slot and prefix-cache accounting, an optional replay of both policies in a
// simulation fed by measured step costs (include/barata/workload.h), JSON
// and SVG charts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/atomic_file.h"
#include "barata/batch_run.h"
#include "barata/bench.h"
#include "barata/error.h"
#include "barata/grammar.h"
#include "barata/file_io.h"
#include "barata/plan.h"
#include "barata/scheduler.h"
#include "barata/workload.h"
#include "commands.h"
#include "session.h"
#include "spec.h"

namespace barata::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using workload::RequestSpec;

struct BatchArgs {
  ModelOptions model;
  std::string requests, workload, policy = "continuous", plot_dir;
  int slots = 8;
  int64_t max_batch_tokens = 512;
  int64_t shared_prefix = 0;
  double arrival_interval_ms = 0;
  bool no_prefix_cache = false, simulate = false, json = false;
  SpecArgs spec;
  // Set from spec once the model is loaded: a drafter per request.
  std::function<std::unique_ptr<Drafter>(const Request&)> drafter_for;
  double c_prior = -1;  // --draft-auto's prior for the draft's cost
};

// The carriage-return progress line on stderr, at most ~4 updates a second,
// always (a log gets a few lines' worth of updates), ended by a newline.
class Progress {
 public:
  void update(const Scheduler& s, BatchPolicy p, int64_t finished, int64_t total, bool force) {
    const auto now = Clock::now();
    if (!force && shown_ && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double t = s.now();
    const std::string line = fmt::format(
        "[batch] {} {}/{} done, {} steps, {:.1f} tokens/s", policy_name(p), finished, total,
        s.stats().steps, t > 0 ? static_cast<double>(s.stats().generated_tokens) / t : 0.0);
    fmt::print(stderr, "\r{:<{}}", line, std::max(width_, line.size()));
    width_ = line.size();
    std::fflush(stderr);
    shown_ = true;
  }
  void end() {
    if (shown_) fmt::print(stderr, "\n");
    shown_ = false;
    width_ = 0;
  }

 private:
  Clock::time_point last_{};
  bool shown_ = false;
  size_t width_ = 0;
};

std::vector<BatchPolicy> policies_of(const std::string& p) {
  if (p == "static") return {BatchPolicy::kStatic};
  if (p == "continuous") return {BatchPolicy::kContinuous};
  return {BatchPolicy::kStatic, BatchPolicy::kContinuous};
}

// ---- output ---------------------------------------------------------------------

json policy_json(const PolicyRun& r, int slots) {
  const auto lat = workload::summarize_latency(r.latencies());
  const auto ttft = workload::summarize_latency(r.ttfts());
  const SchedulerStats& st = r.stats;
  json rows = json::array();
  for (const BatchRow& q : r.rows) {
    json j = {{"id", q.id},
              {"prompt_tokens", q.prompt_tokens},
              {"output_tokens", q.output.size()},
              {"output_ids", q.output},
              {"text", q.text},
              {"status", q.status},
              {"finish", q.finish},
              {"arrival_s", q.arrival_s},
              {"latency_s", q.latency_s >= 0 ? json(q.latency_s) : json(nullptr)},
              {"ttft_s", q.ttft_s >= 0 ? json(q.ttft_s) : json(nullptr)},
              {"preemptions", q.preemptions},
              {"prefix_hit_tokens", q.prefix_hit_tokens}};
    if (!q.error.empty()) j["error"] = q.error;
    rows.push_back(std::move(j));
  }
  return {
      {"policy", policy_name(r.policy)},
      {"interrupted", r.interrupted},
      {"wall_s", r.wall_s},
      {"requests", r.rows.size()},
      {"finished", r.finished()},
      {"failed", r.failed()},
      {"output_tokens", st.generated_tokens},
      {"output_tokens_per_s", r.tokens_per_s()},
      {"requests_per_s", r.requests_per_s()},
      {"latency_s",
       {{"mean", lat.mean},
        {"median", lat.median},
        {"p90", lat.p90},
        {"p99", lat.p99},
        {"max", lat.max}}},
      {"ttft_s", {{"mean", ttft.mean}, {"p99", ttft.p99}}},
      {"steps", st.steps},
      {"rows", st.rows},
      {"decode_rows", st.decode_rows},
      {"prefill_rows", st.prefill_rows},
      {"padding_rows", st.padding_rows},
      {"busy_slot_steps", st.busy_slot_steps},
      {"padding_slot_steps", st.padding_slot_steps},
      {"slot_utilization", r.slot_utilization(slots)},
      {"running_mean", r.running_mean()},
      {"running_max", r.running_max()},
      {"preemptions", st.preemptions},
      {"forward_ms", st.forward_ms},
      {"speculative",
       {{"draft_rows", st.draft_rows},
        {"accepted", st.accepted},
        {"verify_passes", st.verify_passes},
        {"draft_ms", st.draft_ms}}},
      {"prefix_cache",
       {{"lookups", st.prefix_lookups},
        {"hit_tokens", st.prefix_hit_tokens},
        {"prompt_tokens", st.prompt_tokens},
        {"hit_rate", st.prompt_tokens > 0 ? static_cast<double>(st.prefix_hit_tokens) /
                                                static_cast<double>(st.prompt_tokens)
                                          : 0.0},
        {"prefill_tokens_saved", st.prefix_hit_tokens},
        {"blocks_shared", st.prefix_hit_blocks}}},
      {"per_request", rows},
  };
}

json sim_json(const workload::SimResult& r) {
  return {{"total_s", r.total_s},
          {"output_tokens_per_s", r.tokens_per_s()},
          {"mean_latency_s", r.mean_latency_s()},
          {"steps", r.steps},
          {"busy_slot_steps", r.busy_slot_steps},
          {"padding_slot_steps", r.padding_slot_steps}};
}

// A duration for the text report: milliseconds below a second, else seconds.
std::string ms(double s) {
  return s < 1 ? fmt::format("{:.1f} ms", s * 1e3) : fmt::format("{:.3f} s", s);
}

void print_policy(const PolicyRun& r, int slots) {
  const auto lat = workload::summarize_latency(r.latencies());
  const auto ttft = workload::summarize_latency(r.ttfts());
  const SchedulerStats& st = r.stats;
  fmt::print("\npolicy {}: {} requests ({} finished, {} failed{}), {} output tokens in {:.3f} s\n",
             policy_name(r.policy), r.rows.size(), r.finished(), r.failed(),
             r.interrupted ? ", interrupted" : "", st.generated_tokens, r.wall_s);
  fmt::print("  throughput    {:.1f} output tokens/s, {:.2f} requests/s\n", r.tokens_per_s(),
             r.requests_per_s());
  fmt::print("  latency       mean {}, median {}, p90 {}, p99 {}\n", ms(lat.mean), ms(lat.median),
             ms(lat.p90), ms(lat.p99));
  fmt::print("  TTFT          mean {}, p99 {}\n", ms(ttft.mean), ms(ttft.p99));
  fmt::print(
      "  slots         {:.1f}% utilized ({} busy of {} slot-steps: {} steps x {} slots), "
      "padding {} slot-steps ({} rows computed)\n",
      100 * r.slot_utilization(slots), st.busy_slot_steps, st.steps * slots, st.steps, slots,
      st.padding_slot_steps, st.padding_rows);
  fmt::print("  rows          {} ({} decode, {} prefill), forward {:.1f} ms, {} preemptions\n",
             st.rows, st.decode_rows, st.prefill_rows, st.forward_ms, st.preemptions);
  if (st.verify_passes > 0)
    fmt::print(
        "  speculative   {} drafted tokens verified in {} passes, {} kept ({:.1f}%), "
        "drafting {:.1f} ms\n",
        st.draft_rows, st.verify_passes, st.accepted,
        100.0 * static_cast<double>(st.accepted) /
            static_cast<double>(std::max<int64_t>(st.draft_rows, 1)),
        st.draft_ms);
  const double rate = st.prompt_tokens > 0 ? static_cast<double>(st.prefix_hit_tokens) /
                                                 static_cast<double>(st.prompt_tokens)
                                           : 0.0;
  fmt::print(
      "  prefix cache  {} hit tokens of {} prompt tokens ({:.1f}%): {} prefill tokens saved, "
      "{} blocks shared, {} lookups\n",
      st.prefix_hit_tokens, st.prompt_tokens, 100 * rate, st.prefix_hit_tokens,
      st.prefix_hit_blocks, st.prefix_lookups);
}

void write_plots(const std::string& dir, const std::vector<PolicyRun>& runs, int slots) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create the plot directory: {}", dir, ec.message());
  std::vector<std::pair<std::string, bench::Chart>> charts;
  bench::Chart cdf{
      "Request latency CDF", "latency (s)", "fraction of requests done", false, false, {}};
  for (const PolicyRun& r : runs) {
    std::vector<double> l = r.latencies();
    std::sort(l.begin(), l.end());
    bench::Series s{policy_name(r.policy), {}, {}};
    for (size_t i = 0; i < l.size(); ++i) {
      s.x.push_back(l[i]);
      s.y.push_back(static_cast<double>(i + 1) / static_cast<double>(l.size()));
    }
    cdf.series.push_back(std::move(s));
  }
  charts.emplace_back("latency-cdf.svg", std::move(cdf));
  for (const PolicyRun& r : runs) {
    bench::Chart c{
        fmt::format("Slot occupancy, {} batching ({} slots)", policy_name(r.policy), slots),
        "step",
        "sequences",
        false,
        false,
        {}};
    bench::Series held{"holding a slot", {}, {}}, busy{"generating", {}, {}};
    for (size_t i = 0; i < r.steps.size(); ++i) {
      held.x.push_back(static_cast<double>(i + 1));
      held.y.push_back(static_cast<double>(r.steps[i].running));
      busy.x.push_back(static_cast<double>(i + 1));
      busy.y.push_back(static_cast<double>(r.steps[i].busy));
    }
    c.series.push_back(std::move(held));
    c.series.push_back(std::move(busy));
    charts.emplace_back(fmt::format("occupancy-{}.svg", policy_name(r.policy)), std::move(c));
  }
  for (const auto& [name, chart] : charts) {
    const fs::path file = fs::path(dir) / name;
    write_file_atomically(file, bench::to_svg(chart));
    fmt::print(stderr, "wrote {}\n", file.string());
  }
}

// ---- the command -------------------------------------------------------------------

int run(BatchArgs& a) {
  // The requests first: a malformed file is refused before the model loads.
  std::vector<RequestSpec> specs;
  std::string source;
  if (!a.requests.empty()) {
    specs = workload::parse_jsonl(read_regular_file(a.requests, "requests file"), a.requests);
    source = a.requests;
  } else {
    specs = workload::reference64();
    source = a.workload;
  }
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].id.empty()) specs[i].id = std::to_string(i);

  Session s(session_options(a.model));
  DraftFactory draft;
  if (a.spec.any()) {
    draft = make_draft_factory(a.spec, s, a.slots);
    a.drafter_for = draft.drafter_for;
    a.c_prior = draft.setup.c_prior;
  }
  const std::vector<int32_t> prefix = workload::shared_prefix_ids(s.tok, a.shared_prefix);
  std::vector<Request> requests;
  for (size_t i = 0; i < specs.size(); ++i) {
    const RequestSpec& sp = specs[i];
    Request r;
    r.id = sp.id;
    r.prompt = workload::prompt_ids(s.tok, sp.prompt, prefix);
    r.sampling = sp.sampling;
    r.max_tokens = sp.max_tokens;
    r.ignore_eos = sp.ignore_eos;
    r.stop = sp.stop;
    if (!sp.grammar.empty()) r.grammar = grammar_index(sp.grammar, s.tok);
    r.arrival_s = sp.arrival_ms >= 0 ? sp.arrival_ms / 1e3
                                     : static_cast<double>(i) * a.arrival_interval_ms / 1e3;
    requests.push_back(std::move(r));
  }

  const KvBlockManager& kv = s.engine.blocks();
  const std::string pool = kv_pool_line(s.engine);
  const std::string header =
      fmt::format(
          "barata batch: {} requests ({}), {} slots, at most {} rows per step, prefix cache {}, "
          "shared prefix {} tokens, {}",
          requests.size(), source, a.slots, a.max_batch_tokens, a.no_prefix_cache ? "off" : "on",
          a.shared_prefix,
          a.arrival_interval_ms > 0 ? fmt::format("one arrival every {} ms", a.arrival_interval_ms)
                                    : std::string("arrivals as given (default: all at 0)")) +
      (a.spec.any()
           ? fmt::format(", speculative: {}, {}{} drafted tokens per step", draft.setup.name,
                         a.spec.draft_auto ? "auto, at most " : "up to ", a.spec.draft_max)
           : std::string());
  if (a.json) {
    fmt::print(stderr, "{}\n{}\n", header, pool);
  } else {
    fmt::print("{}\nmodel {} ({} threads, context {}), load {:.0f} ms\n{}\n", header, s.path,
               s.engine.n_threads(), s.engine.n_ctx(), s.load_ms, pool);
    std::fflush(stdout);
  }

  SigintCatcher catcher;
  std::vector<double> cost;
  if (a.simulate) {
    fmt::print(stderr, "[batch] timing decode steps of 1..{} sequences for the simulation\n",
               a.slots);
    cost = measure_step_costs(s.engine, a.slots);
  }
  Progress progress;
  std::vector<PolicyRun> runs;
  std::vector<std::string> ids;
  for (const RequestSpec& sp : specs) ids.push_back(sp.id);
  for (BatchPolicy p : policies_of(a.policy)) {
    if (SigintCatcher::interrupted()) break;
    SchedulerOptions o;
    o.policy = p;
    o.slots = a.slots;
    o.max_batch_tokens = a.max_batch_tokens;
    o.prefix_cache = !a.no_prefix_cache;
    o.drafter_for = a.drafter_for;
    o.draft_max = a.spec.draft_max;
    o.draft_min = a.spec.draft_min;
    o.draft_auto = a.spec.draft_auto;
    o.draft_c_prior = a.c_prior;
    runs.push_back(run_policy(
        s.engine, s.tok, o, requests, ids, [] { return SigintCatcher::interrupted(); },
        [&](const Scheduler& sch, int64_t finished, int64_t total, bool force) {
          progress.update(sch, p, finished, total, force);
        }));
    progress.end();
  }
  const bool interrupted = SigintCatcher::interrupted();
  const std::optional<Comparison> cmp = compare(runs);
  std::optional<Simulation> sim;
  if (a.simulate && !runs.empty()) sim = simulate_both(runs.front(), a.slots, cost);

  if (a.json) {
    json j = {{"schema", "barata.batch/1"},
              {"model", s.path},
              {"n_ctx", s.engine.n_ctx()},
              {"threads", s.engine.n_threads()},
              {"source", source},
              {"kv_pool",
               {{"tokens", kv.max_tokens()},
                {"blocks", kv.max_blocks()},
                {"bytes_per_token", s.engine.kv_bytes_per_token()},
                {"bytes", kv.max_tokens() * s.engine.kv_bytes_per_token()},
                {"description", pool}}},
              {"settings",
               {{"slots", a.slots},
                {"max_batch_tokens", a.max_batch_tokens},
                {"prefix_cache", !a.no_prefix_cache},
                {"shared_prefix_tokens", a.shared_prefix},
                {"arrival_interval_ms", a.arrival_interval_ms}}},
              {"interrupted", interrupted},
              {"policies", json::array()}};
    for (const PolicyRun& r : runs) j["policies"].push_back(policy_json(r, a.slots));
    if (cmp)
      j["comparison"] = {{"throughput_ratio_continuous_over_static", cmp->throughput_ratio},
                         {"mean_latency_ratio_static_over_continuous", cmp->latency_ratio}};
    if (sim)
      j["simulation"] = {{"cost_ms_per_step", sim->cost_ms},
                         {"model",
                          "a request of L tokens holds a slot for L steps (its prefill counted as "
                          "one row); a step of B rows costs cost_ms_per_step[B-1]"},
                         {"static", sim_json(sim->stat)},
                         {"continuous", sim_json(sim->cont)},
                         {"throughput_ratio_continuous_over_static", sim->throughput_ratio()},
                         {"mean_latency_ratio_static_over_continuous", sim->latency_ratio()}};
    fmt::print("{}\n", j.dump(-1, ' ', false, json::error_handler_t::replace));
  } else {
    for (const PolicyRun& r : runs) print_policy(r, a.slots);
    if (cmp)
      fmt::print(
          "\ncomparison: continuous/static throughput {:.2f}x, static/continuous mean latency "
          "{:.2f}x\n",
          cmp->throughput_ratio, cmp->latency_ratio);
    if (sim) {
      std::string costs;
      for (double c : sim->cost_ms) costs += fmt::format("{}{:.2f}", costs.empty() ? "" : " ", c);
      fmt::print("simulation (decode step ms at B = 1..{}: {}; prefill counted as one row):\n",
                 a.slots, costs);
      const auto measured = [&](double v) {
        return cmp ? fmt::format(" (measured {:.2f}x)", v) : std::string();
      };
      fmt::print(
          "  continuous/static throughput {:.2f}x{}, static/continuous mean latency {:.2f}x{}\n",
          sim->throughput_ratio(), measured(cmp ? cmp->throughput_ratio : 0), sim->latency_ratio(),
          measured(cmp ? cmp->latency_ratio : 0));
      fmt::print("  static {:.3f} s, continuous {:.3f} s simulated\n", sim->stat.total_s,
                 sim->cont.total_s);
    }
  }
  std::fflush(stdout);
  if (!a.plot_dir.empty()) write_plots(a.plot_dir, runs, a.slots);

  // Failed requests, once each (a refusal at submission is the same under every policy).
  struct Failure {
    std::string error, policies;
    int64_t prompt_tokens = 0;
  };
  std::vector<std::optional<Failure>> failures(specs.size());
  int64_t failed = 0;
  for (const PolicyRun& r : runs) {
    for (size_t i = 0; i < r.rows.size(); ++i) {
      const BatchRow& q = r.rows[i];
      if (q.status != "failed") continue;
      ++failed;
      auto& f = failures[i];
      if (!f) f = Failure{q.error, "", q.prompt_tokens};
      f->policies += (f->policies.empty() ? "" : ", ") + std::string(policy_name(r.policy));
    }
  }
  int64_t n_failed_requests = 0;
  for (size_t i = 0; i < failures.size(); ++i) {
    if (!failures[i]) continue;
    ++n_failed_requests;
    fmt::print(stderr, "error: request {} ({} prompt tokens) failed under {}: {}\n", specs[i].id,
               failures[i]->prompt_tokens, failures[i]->policies, failures[i]->error);
  }
  if (n_failed_requests > 0)
    fmt::print(stderr, "{} of {} requests failed\n", n_failed_requests, specs.size());
  if (interrupted) return 130;
  return failed > 0 ? 1 : 0;
}

// A finite number >= 0, the whole argument.
CLI::Validator non_negative_real() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        const char* b = v.c_str();
        char* end = nullptr;
        const double x = std::strtod(b, &end);
        if (end == b || *end != '\0' || !std::isfinite(x))
          return fmt::format("'{}' is not a finite number", v);
        if (x < 0) return fmt::format("{} is negative", v);
        return "";
      },
      "", "REAL");
}

}  // namespace

Command add_batch(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "batch", "Run many requests through the scheduler: static against continuous batching");
  auto a = std::make_shared<BatchArgs>();
  add_model_options(sub, a->model);
  auto* req = sub->add_option("--requests", a->requests,
                              "JSON Lines file: one {\"prompt\": ..., \"max_tokens\": ...} a line")
                  ->check(CLI::ExistingFile);
  auto* wl = sub->add_option("--workload", a->workload,
                             "A built-in workload: reference64 (64 requests, 1,874 output tokens)")
                 ->check(CLI::IsMember(workload::workload_names()));
  req->excludes(wl);
  sub->add_option("--policy", a->policy, "static, continuous or both (default: continuous)")
      ->check(CLI::IsMember({"static", "continuous", "both"}));
  sub->add_option("--slots", a->slots, "Sequences running at once (default: 8)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--max-batch-tokens", a->max_batch_tokens,
                  "Rows per forward call, decode rows and prefill chunks (default: 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_option("--shared-prefix", a->shared_prefix,
                  "Prepend one common system text of exactly N tokens to every prompt")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  sub->add_flag("--no-prefix-cache", a->no_prefix_cache, "Do not share cached prompt blocks");
  sub->add_flag("--simulate", a->simulate,
                "Time decode steps of 1..slots sequences and replay both policies in a simulation");
  sub->add_option("--arrival-interval", a->arrival_interval_ms,
                  "Request i arrives at i x MS milliseconds (default: 0, all at once)")
      ->check(non_negative_real());
  sub->add_flag("--json", a->json, "Print one JSON document (per policy and per request)");
  sub->add_option("--plot", a->plot_dir, "Write SVG charts (latency CDF, slot occupancy) here");
  sub->callback([a] {
    if (a->requests.empty() && a->workload.empty())
      throw CLI::RequiredError("--requests FILE or --workload NAME");
    check_spec_args(a->spec);
  });
  add_spec_options(sub, a->spec);
  return {sub, [a] { return run(*a); }};
}

}  // namespace barata::cli
