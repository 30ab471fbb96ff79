// barata perplexity -m FILE -f TEXT [-c N] [-b N] [--chunks N] [-t N]
//   [--save-logits F | --kl-base F] [--json]
// llama-perplexity's convention (include/barata/perplexity.h): per-chunk
// values and a progress bar on stderr, the final estimate last.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/perplexity.h"
#include "commands.h"
#include "session.h"

namespace barata::cli {
namespace {

struct PerplexityArgs {
  ModelOptions m;
  std::string text_file, save_logits, kl_base;
  int64_t n_batch = 0, chunks = -1;
  bool json = false;
};

std::string clock_text(double s) {
  const auto t = static_cast<int64_t>(std::lround(s));
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02}", t / 60, t % 60);
}

std::string bar(int64_t done, int64_t n, int width) {
  const auto full = static_cast<int>(done * width / n);
  return std::string(static_cast<size_t>(full), '#') +
         std::string(static_cast<size_t>(width - full), '.');
}

nlohmann::json kl_json(const KlSummary& k) {
  return {{"n", k.n},
          {"mean", k.mean},
          {"mean_err", k.sd_mean},
          {"median", k.median},
          {"p99", k.p99},
          {"max", k.max},
          {"same_top", k.same_top},
          {"mean_dp_base_top", k.dp_top},
          {"mean_dp_next_token", k.dp_token},
          {"ppl_base", k.ppl_base},
          {"ln_ppl_ratio", k.ln_ppl_ratio}};
}

int run_perplexity(PerplexityArgs& a) {
  if (a.m.n_ctx == 0) a.m.n_ctx = 512;
  if (!a.save_logits.empty() && !a.kl_base.empty())
    fail("--save-logits and --kl-base: give one (the base run saves, the candidate run compares)");
  const std::string text = read_regular_file(a.text_file, "text file");
  Session s(session_options(a.m));
  const std::vector<int32_t> tokens = perplexity_tokens(s.tok, text);
  const std::filesystem::path save(a.save_logits), base(a.kl_base);
  PerplexityOptions o;
  o.n_ctx = a.m.n_ctx;
  o.n_batch = a.n_batch;
  o.max_chunks = a.chunks;
  o.save_logits = a.save_logits.empty() ? nullptr : &save;
  o.kl_base = a.kl_base.empty() ? nullptr : &base;
  o.model_name = std::filesystem::path(s.path).filename().string();
  std::vector<double> running;
  fmt::print(stderr, "perplexity: {} tokens of {}, chunks of {} ({} scored each), {} thread(s)\n",
             tokens.size(), a.text_file, o.n_ctx, o.n_ctx - 1 - o.n_ctx / 2, s.engine.n_threads());
  double prev_nll_sum = 0;
  o.progress = [&](int64_t done, int64_t n, double ppl, double secs) {
    const double per = secs / static_cast<double>(done);
    const double nll_sum = std::log(ppl) * static_cast<double>(done);
    const double chunk_ppl = std::exp(nll_sum - prev_nll_sum);
    prev_nll_sum = nll_sum;
    fmt::print(stderr, "[{:>{}}/{}] {} ppl {:.4f} (this chunk {:.4f})  {:.2f} s/chunk, ETA {}\n",
               done, fmt::formatted_size("{}", n), n, bar(done, n, 20), ppl, chunk_ppl, per,
               clock_text(per * static_cast<double>(n - done)));
    running.push_back(ppl);
  };
  const PerplexityResult r = perplexity(s.engine, s.tok, tokens, o);
  const std::string final_line =
      fmt::format("Final estimate: PPL = {:.4f} +/- {:.5f}", r.ppl, r.ppl_err);
  if (a.json) {
    nlohmann::json j = {{"schema", "barata.perplexity/1"},
                        {"model", s.path},
                        {"text", a.text_file},
                        {"n_text_tokens", r.n_text_tokens},
                        {"n_ctx", r.n_ctx},
                        {"n_chunks", r.n_chunks},
                        {"n_scored", r.n_scored},
                        {"chunk_nll", r.chunk_nll},
                        {"running_ppl", running},
                        {"nll", r.nll},
                        {"ppl", r.ppl},
                        {"ppl_err", r.ppl_err},
                        {"seconds", r.seconds},
                        {"tokens_per_s", r.tokens_per_s},
                        {"threads", s.engine.n_threads()}};
    if (r.kl) j["kl"] = kl_json(*r.kl);
    fmt::print("{}\n", j.dump(2));
    std::fflush(stdout);
    fmt::print(stderr, "{}\n", final_line);
    return 0;
  }
  fmt::print("{} tokens, {} chunks of {}, {} scored; {:.1f} s, {:.1f} tokens/s\n", r.n_text_tokens,
             r.n_chunks, r.n_ctx, r.n_scored, r.seconds, r.tokens_per_s);
  if (r.kl) {
    const KlSummary& k = *r.kl;
    fmt::print("KL divergence against {}:\n", a.kl_base);
    fmt::print("  PPL(base)             {:.4f}\n", k.ppl_base);
    fmt::print("  ln(PPL(Q)/PPL(base))  {:.6f}\n", k.ln_ppl_ratio);
    fmt::print("  mean KL               {:.6f} +/- {:.6f}\n", k.mean, k.sd_mean);
    fmt::print("  median KL             {:.6f}\n", k.median);
    fmt::print("  p99 KL                {:.6f}\n", k.p99);
    fmt::print("  max KL                {:.6f}\n", k.max);
    fmt::print("  same top token        {:.3f} %\n", 100 * k.same_top);
    fmt::print("  mean dp (base top)    {:.4f} %\n", 100 * k.dp_top);
    fmt::print("  mean dp (next token)  {:.4f} %\n", 100 * k.dp_token);
  }
  if (!a.save_logits.empty()) fmt::print("base logits saved to {}\n", a.save_logits);
  fmt::print("{}\n", final_line);
  return 0;
}

}  // namespace

Command add_perplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* sub = app.add_subcommand(
      "perplexity",
      "Perplexity of a text in llama-perplexity's convention (chunks of -c tokens, BOS first, "
      "the second half of each chunk scored); KL divergence against a base run's saved logits");
  add_model_options(sub, a->m);
  sub->get_option("-c")->description("Tokens per chunk (default 512)");
  sub->add_option("-f,--file", a->text_file, "Text file to score")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("-b,--batch-size", a->n_batch,
                  "Rows per forward call (default: the chunk, one prefill per chunk)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_option("--chunks", a->chunks, "Chunks to evaluate (default: all the text fills)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_option("--save-logits", a->save_logits,
                  "Save the scored positions' log-probabilities (the base for --kl-base)");
  sub->add_option("--kl-base", a->kl_base,
                  "Compare against a base run's --save-logits file: KL divergence, top-token "
                  "agreement, PPL ratio")
      ->check(CLI::ExistingFile);
  sub->add_flag("--json", a->json, "JSON on stdout (per-chunk NLL, PPL and its error, KL)");
  return {sub, [a] { return run_perplexity(*a); }};
}

}  // namespace barata::cli
