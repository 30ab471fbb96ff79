// barata run: prompt in, tokens streamed out, timings on stderr.
#include <algorithm>
#include <cstdio>
#include <memory>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/chat_template.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/plan.h"
#include "barata/sampler.h"
#include "barata/tokenizer.h"
#include "commands.h"
#include "session.h"
#include "spec.h"

namespace barata::cli {
namespace {

struct RunArgs {
  ModelOptions model;
  std::string prompt, prompt_file, chat_template, chat_template_file, system;
  int n_predict = 256;
  SamplerOptions sampling;
  GrammarOptions grammar;
  bool no_cache = false, chat = false, json = false, truncate = false, no_bos = false;
  bool parse_special = false;
  int top_logits = 0, show_probs = 0;
  std::vector<std::string> stop;
  SpecArgs spec;
};

// The prompt as text (wrapped in the chat template with --chat), and whether
// its control tokens are read as tokens.
struct PromptText {
  std::string text;
  bool parse_special;
};

PromptText build_prompt(const RunArgs& a, const Session& s, std::string text) {
  PromptText p{std::move(text), a.parse_special};
  if (a.chat) {
    const auto format = choose_chat_format(a.chat_template, a.chat_template_file, s);
    std::vector<ChatMessage> msgs;
    const std::string system = system_prompt_or_default(a.system, *format);
    if (!system.empty()) msgs.push_back({"system", system});
    msgs.push_back({"user", p.text});
    p.text = format->apply(msgs, true);
    p.parse_special = true;
  }
  return p;
}

// Token ids of the prompt; an error when it does not fit the context, unless
// --truncate keeps its end.
std::vector<int32_t> encode_prompt(const RunArgs& a, const Session& s, const PromptText& p) {
  const bool add_bos = !a.no_bos && s.tok.add_bos_default();
  std::vector<int32_t> prompt = s.tok.encode(p.text, add_bos, p.parse_special);
  if (prompt.empty()) fail("the prompt is empty (give -p TEXT or -f FILE)");
  if (static_cast<int64_t>(prompt.size()) >= s.n_ctx) {
    if (!a.truncate)
      fail(
          "the prompt has {} tokens but the context holds {} (raise -c, or --truncate to keep "
          "the last part)",
          prompt.size(), s.n_ctx);
    if (s.n_ctx < 2)
      fail(
          "--truncate: a context of {} token holds no prompt token and its reply (need -c 2 "
          "or more)",
          s.n_ctx);
    // The end of the prompt, leaving room for the reply (half the context at most).
    const size_t keep = static_cast<size_t>(
        s.n_ctx - std::max<int64_t>(1, std::min<int64_t>(a.n_predict, s.n_ctx / 2)));
    prompt.erase(prompt.begin(), prompt.end() - static_cast<long>(keep));
    fmt::print(stderr, "note: prompt truncated to its last {} tokens\n", keep);
  }
  return prompt;
}

// The JSON document (--json) or the final newline, then the timing line on stderr.
void report(const RunArgs& a, const Session& s, const std::vector<int32_t>& prompt,
            const Generation& g, const std::string& draft_name) {
  const double ms_per_step = g.ms_per_step();
  const size_t n_prompt = prompt.size();
  if (a.json) {
    nlohmann::json timings = {
        {"load_ms", s.load_ms},
        {"prefill_tokens", n_prompt},
        {"prefill_ms", g.prefill_ms},
        {"prefill_tokens_per_s", n_prompt / (g.prefill_ms / 1e3)},
        {"time_to_first_token_ms", g.ttft_ms},
        {"decode_steps", g.decode_steps()},
        {"decode_ms", g.decode_ms},
        {"decode_ms_per_token", ms_per_step},
        {"decode_tokens_per_s", ms_per_step > 0 ? 1e3 / ms_per_step : 0.0},
        {"threads", s.engine.n_threads()},
        {"kv_cache", !a.no_cache},
    };
    nlohmann::json j = {{"model", s.path},
                        {"prompt_ids", prompt},
                        {"generated_ids", g.generated},
                        {"text", g.text},
                        {"stop", run_stop_name(g.finish)},
                        {"timings", timings}};
    if (!g.steps.empty()) j["steps"] = g.steps;
    if (a.spec.any()) j["speculative"] = spec_json(g.spec, a.spec, draft_name);
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("\n");
    std::fflush(stdout);
  }
  fmt::print(stderr,
             "\nload {:.0f} ms | prefill {} tokens in {:.1f} ms ({:.1f} tokens/s), time to first "
             "token {:.1f} ms | decode {} tokens, {:.2f} ms/token ({:.1f} tokens/s) | {} threads, "
             "{}{}\n",
             s.load_ms, n_prompt, g.prefill_ms, n_prompt / (g.prefill_ms / 1e3), g.ttft_ms,
             g.decode_steps(), ms_per_step, ms_per_step > 0 ? 1e3 / ms_per_step : 0.0,
             s.engine.n_threads(), a.no_cache ? "no KV cache" : "KV cache",
             g.interrupted() ? " | interrupted" : "");
  if (a.spec.any()) fmt::print(stderr, "{}\n", spec_line(g.spec, a.spec, draft_name));
  if (!g.grammar_us.empty()) {
    std::vector<float> us = g.grammar_us;
    std::sort(us.begin(), us.end());
    const auto at = [&](double q) {
      return us[static_cast<size_t>(q * static_cast<double>(us.size() - 1))];
    };
    fmt::print(stderr, "grammar: {} masks, median {:.0f} us, p99 {:.0f} us, max {:.0f} us\n",
               us.size(), at(0.5), at(0.99), us.back());
  }
}

int run(const RunArgs& a) {
  // The prompt file first: a FIFO or a device is refused before the model loads.
  std::string text =
      a.prompt_file.empty() ? a.prompt : read_regular_file(a.prompt_file, "prompt file");
  Session s(session_options(a.model));
  const std::vector<int32_t> prompt = encode_prompt(a, s, build_prompt(a, s, std::move(text)));
  fmt::print(stderr, "{}\n", kv_pool_line(s.engine));
  Sampler sampler(a.sampling);
  DraftSetup d;
  if (a.spec.any()) d = make_drafter(a.spec, s, a.sampling);
  GenerateOptions go{.n_predict = a.n_predict,
                     .no_cache = a.no_cache,
                     .top_logits = a.top_logits,
                     .show_probs = a.show_probs,
                     .stop = a.stop,
                     .grammar = make_grammar(a.grammar, s),
                     .drafter = d.drafter.get(),
                     .draft_max = a.spec.draft_max,
                     .draft_min = a.spec.draft_min,
                     .draft_auto = a.spec.draft_auto,
                     .draft_c_prior = d.drafter ? d.c_prior : -1.0,
                     .interrupted = [] { return SigintCatcher::interrupted(); },
                     .on_step = {}};
  if (!a.json) go.on_step = [&s](const nlohmann::json& st) { print_step_probs(s.tok, st); };
  std::vector<int32_t> all;
  Generation g;
  {
    SigintCatcher catcher;
    const int seq = s.engine.new_sequence();
    g = generate(s, seq, prompt, all, sampler, go, [&](std::string_view piece) {
      if (a.json) return;
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    });
  }
  note_context_full(g, s.n_ctx);
  report(a, s, prompt, g, d.name);
  return g.interrupted() ? 130 : 0;
}

}  // namespace

Command add_run(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "Generate text from a prompt");
  auto a = std::make_shared<RunArgs>();
  add_model_options(sub, a->model);
  auto* p = sub->add_option("-p,--prompt", a->prompt, "Prompt text");
  auto* f = sub->add_option("-f,--file", a->prompt_file, "Read the prompt from a file")
                ->check(CLI::ExistingFile);
  p->excludes(f);
  sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate")
      ->check(CLI::Range(0, 1 << 30));
  add_sampling_options(sub, a->sampling);
  add_grammar_options(sub, a->grammar);
  sub->add_flag("--no-kv-cache", a->no_cache, "Recompute the whole sequence at every step");
  sub->add_option("--stop,-r,--reverse-prompt", a->stop,
                  "Stop when the text contains this string, which is not printed (repeatable)")
      ->allow_extra_args(false);
  sub->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template");
  add_chat_template_options(sub, a->chat_template, a->chat_template_file);
  sub->add_option("--system", a->system, "System prompt for --chat");
  sub->add_flag("--no-bos", a->no_bos, "Do not add the BOS token");
  sub->add_flag(
      "--parse-special", a->parse_special,
      "Read control tokens such as <|im_start|> in the prompt as tokens (on with --chat)");
  sub->add_flag("--truncate", a->truncate, "Keep the end of a prompt longer than the context");
  sub->add_flag("--json", a->json, "Print prompt_ids, generated_ids, text and timings as JSON");
  sub->add_option("--top-logits", a->top_logits, "With --json: the K largest (id, logit) per step")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--show-probs", a->show_probs,
                  "The K most likely tokens and probabilities at --temp, each step")
      ->check(CLI::Range(0, 1 << 20));
  add_spec_options(sub, a->spec);
  sub->callback([a] {
    if (!a->chat_template.empty() || !a->chat_template_file.empty()) a->chat = true;
    if (a->spec.any()) {
      if (a->no_cache) throw CLI::ValidationError("--no-kv-cache", "not with speculative decoding");
      if (a->sampling.repeat_penalty != 1.0f)
        throw CLI::ValidationError("--repeat-penalty",
                                   "speculative decoding takes no repetition penalty");
    }
    check_spec_args(a->spec);
    if (a->prompt.empty() && a->prompt_file.empty()) throw CLI::RequiredError("-p or -f");
  });
  return {sub, [a] { return run(*a); }};
}

}  // namespace barata::cli
