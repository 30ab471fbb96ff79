// barata run: prompt in, tokens streamed out, timings on stderr.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>

#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/chat_template.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/sampler.h"
#include "barata/tokenizer.h"
#include "commands.h"
#include "default_model.h"

namespace barata::cli {
namespace {

using Clock = std::chrono::steady_clock;
std::atomic<bool> g_interrupted{false};

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct RunArgs {
  std::string model, prompt, prompt_file, chat_template, system;
  int n_predict = 256;
  int64_t n_ctx = 0;
  int n_threads = 0;
  SamplerOptions sampling;
  bool no_cache = false, chat = false, json = false, truncate = false, no_bos = false;
  bool parse_special = false;
  int top_logits = 0, show_probs = 0;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot read the prompt file", path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

int run(const RunArgs& a) {
  const auto t_load = Clock::now();
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  const Model model = Model::load(path);
  const Tokenizer tok = Tokenizer::from_gguf(model.file());
  const ModelConfig& cfg = model.config();
  const int64_t n_ctx = a.n_ctx > 0 ? a.n_ctx : std::min<int64_t>(cfg.n_ctx_train, 4096);
  Engine engine(model, {.n_threads = a.n_threads, .n_ctx = n_ctx});
  const double load_ms = ms_since(t_load);

  std::string text = a.prompt_file.empty() ? a.prompt : read_file(a.prompt_file);
  bool parse_special = a.parse_special;
  if (a.chat) {
    ChatFamily family;
    if (!a.chat_template.empty()) {
      family = chat_family_from_name(a.chat_template);
    } else if (auto f = detect_chat_family(tok.chat_template())) {
      family = *f;
    } else {
      fail(
          "{}: cannot tell the chat template family from tokenizer.chat_template; name one with "
          "--chat-template ({})",
          path, "chatml, llama3, gemma, llama2");
    }
    std::vector<ChatMessage> msgs;
    const std::string system =
        a.system.empty() ? default_system_prompt(tok.chat_template()) : a.system;
    if (!system.empty()) msgs.push_back({"system", system});
    msgs.push_back({"user", text});
    text = apply_chat_template(family, msgs, true);
    parse_special = true;
  }
  const bool add_bos = !a.no_bos && tok.add_bos_default();
  std::vector<int32_t> prompt = tok.encode(text, add_bos, parse_special);
  if (prompt.empty()) fail("the prompt is empty (give -p TEXT or -f FILE)");
  if (static_cast<int64_t>(prompt.size()) >= n_ctx) {
    if (!a.truncate)
      fail(
          "the prompt has {} tokens but the context holds {} (raise -c, or --truncate to keep "
          "the last part)",
          prompt.size(), n_ctx);
    const size_t keep = static_cast<size_t>(n_ctx - std::min<int64_t>(a.n_predict, n_ctx / 2));
    prompt.erase(prompt.begin(), prompt.end() - static_cast<long>(keep));
    fmt::print(stderr, "note: prompt truncated to its last {} tokens\n", keep);
  }

  Sampler sampler(a.sampling);
  for (int32_t t : prompt) sampler.accept(t);
  const int64_t V = cfg.n_vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> all = prompt, generated;
  nlohmann::json steps = nlohmann::json::array();
  StreamDecoder stream(tok);
  std::string out_text;

  g_interrupted = false;
  auto prev = std::signal(SIGINT, [](int) { g_interrupted = true; });
  const int seq = engine.new_sequence();
  const auto t_prefill = Clock::now();
  engine.prefill(seq, prompt, logits.data());
  const double prefill_ms = ms_since(t_prefill);
  double ttft_ms = 0.0;
  const auto t_decode = Clock::now();
  std::string stop_reason = "n_predict";
  for (int i = 0; i < a.n_predict; ++i) {
    if (a.top_logits > 0 || a.show_probs > 0) {
      nlohmann::json step;
      if (a.top_logits > 0) {
        nlohmann::json tl = nlohmann::json::array();
        for (auto [id, p] : top_probs(logits, 1.0f, a.top_logits)) {
          (void)p;
          tl.push_back({id, logits[static_cast<size_t>(id)]});
        }
        step["top_logits"] = tl;
      }
      if (a.show_probs > 0) {
        const float temp = a.sampling.temperature > 0 ? a.sampling.temperature : 1.0f;
        nlohmann::json tp = nlohmann::json::array();
        for (auto [id, p] : top_probs(logits, temp, a.show_probs)) tp.push_back({id, p});
        step["probs"] = tp;
        if (!a.json) {
          std::string line = "\n[probs";
          for (const auto& e : tp)
            line += fmt::format(" {}:{:.4f}",
                                nlohmann::json(tok.token_to_piece(e[0].get<int32_t>()))
                                    .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                                e[1].get<float>());
          fmt::print(stderr, "{}]\n", line);
        }
      }
      steps.push_back(step);
    }
    const int32_t next = sampler.sample(logits);
    if (i == 0) ttft_ms = prefill_ms + ms_since(t_decode);
    sampler.accept(next);
    generated.push_back(next);
    all.push_back(next);
    if (tok.is_eog(next)) {
      stop_reason = "eog";
      break;
    }
    const std::string piece = stream.push(next);
    out_text += piece;
    if (!a.json) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    if (g_interrupted) {
      stop_reason = "interrupted";
      break;
    }
    if (i + 1 == a.n_predict) break;
    if (static_cast<int64_t>(all.size()) >= n_ctx) {
      stop_reason = "context_full";
      fmt::print(stderr, "\nnote: stopped at the context limit of {} tokens\n", n_ctx);
      break;
    }
    if (a.no_cache) {
      engine.truncate(seq, 0);  // recompute the whole sequence: what the cache saves
      engine.prefill(seq, all, logits.data());
    } else {
      const int seqs[1] = {seq};
      const int32_t toks[1] = {next};
      engine.decode(seqs, toks, logits.data());
    }
  }
  const double decode_ms = ms_since(t_decode);
  std::signal(SIGINT, prev);
  const std::string tail = stream.flush();
  out_text += tail;
  const int64_t n_gen = static_cast<int64_t>(generated.size());
  // The first token comes from the prefill's logits; the others cost a decode step each.
  const int64_t n_steps = std::max<int64_t>(n_gen - 1, 0);
  const double ms_per_step = n_steps > 0 ? decode_ms / static_cast<double>(n_steps) : 0.0;

  nlohmann::json timings = {
      {"load_ms", load_ms},
      {"prefill_tokens", prompt.size()},
      {"prefill_ms", prefill_ms},
      {"prefill_tokens_per_s", prompt.size() / (prefill_ms / 1e3)},
      {"time_to_first_token_ms", ttft_ms},
      {"decode_steps", n_steps},
      {"decode_ms", decode_ms},
      {"decode_ms_per_token", ms_per_step},
      {"decode_tokens_per_s", ms_per_step > 0 ? 1e3 / ms_per_step : 0.0},
      {"threads", engine.n_threads()},
      {"kv_cache", !a.no_cache},
  };
  if (a.json) {
    nlohmann::json j = {{"model", path},    {"prompt_ids", prompt}, {"generated_ids", generated},
                        {"text", out_text}, {"stop", stop_reason},  {"timings", timings}};
    if (!steps.empty()) j["steps"] = steps;
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    std::fwrite(tail.data(), 1, tail.size(), stdout);
    fmt::print("\n");
    std::fflush(stdout);
  }
  fmt::print(stderr,
             "\nload {:.0f} ms | prefill {} tokens in {:.1f} ms ({:.1f} tokens/s), time to first "
             "token {:.1f} ms | decode {} tokens, {:.2f} ms/token ({:.1f} tokens/s) | {} threads, "
             "{}{}\n",
             load_ms, prompt.size(), prefill_ms, prompt.size() / (prefill_ms / 1e3), ttft_ms,
             n_steps, ms_per_step, ms_per_step > 0 ? 1e3 / ms_per_step : 0.0, engine.n_threads(),
             a.no_cache ? "no KV cache" : "KV cache",
             stop_reason == "interrupted" ? " | interrupted" : "");
  return stop_reason == "interrupted" ? 130 : 0;
}

}  // namespace

Command add_run(CLI::App& app) {
  auto* sub = app.add_subcommand("run", "Generate text from a prompt");
  auto a = std::make_shared<RunArgs>();
  sub->add_option("-m,--model", a->model,
                  "GGUF file (default: the model scripts/fetch-model.sh fetches)")
      ->check(CLI::ExistingFile);
  sub->add_option("-p,--prompt", a->prompt, "Prompt text");
  sub->add_option("-f,--file", a->prompt_file, "Read the prompt from a file")
      ->check(CLI::ExistingFile);
  sub->add_option("-n,--n-predict", a->n_predict, "Tokens to generate")
      ->check(CLI::Range(0, 1 << 30));
  sub->add_option("-c,--ctx-size", a->n_ctx, "Context size (default: the model's, at most 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_option("-t,--threads", a->n_threads, "Threads (default: hardware threads)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--temp", a->sampling.temperature, "Temperature; 0 = greedy");
  sub->add_option("--top-k", a->sampling.top_k, "Top-k (0 = off)");
  sub->add_option("--top-p", a->sampling.top_p, "Top-p (1 = off)");
  sub->add_option("--min-p", a->sampling.min_p, "Min-p (0 = off)");
  sub->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Repetition penalty (1 = off)");
  sub->add_option("--repeat-last-n", a->sampling.repeat_last_n, "Window of the repetition penalty");
  sub->add_option("-s,--seed", a->sampling.seed, "Random seed");
  sub->add_flag("--no-kv-cache", a->no_cache, "Recompute the whole sequence at every step");
  sub->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template");
  sub->add_option("--chat-template", a->chat_template,
                  "chatml, llama3, gemma or llama2 (implies --chat)");
  sub->add_option("--system", a->system, "System prompt for --chat");
  sub->add_flag("--no-bos", a->no_bos, "Do not add the BOS token");
  sub->add_flag(
      "--parse-special", a->parse_special,
      "Read control tokens such as <|im_start|> in the prompt as tokens (on with --chat)");
  sub->add_flag("--truncate", a->truncate, "Keep the end of a prompt longer than the context");
  sub->add_flag("--json", a->json, "Print prompt_ids, generated_ids, text and timings as JSON");
  sub->add_option("--top-logits", a->top_logits, "With --json: the K largest (id, logit) per step");
  sub->add_option("--show-probs", a->show_probs,
                  "The K most likely tokens and probabilities at --temp, each step");
  sub->callback([a] {
    if (!a->chat_template.empty()) a->chat = true;
    if (a->prompt.empty() && a->prompt_file.empty()) throw CLI::RequiredError("-p or -f");
  });
  return {sub, [a] { return run(*a); }};
}

}  // namespace barata::cli
