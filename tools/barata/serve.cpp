// barata serve: the OpenAI-compatible HTTP server (include/barata/server.h,
// docs/server.md). It listens before the model loads (GET /health answers
// "loading" meanwhile); SIGTERM or Ctrl-C drains, a second one cancels.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/gguf.h"
#include "barata/model_config.h"
#include "barata/server.h"
#include "commands.h"
#include "default_model.h"
#include "session.h"
#include "spec.h"

namespace barata::cli {
namespace {

struct ServeArgs {
  ModelOptions model;
  ServerOptions server;
  SpecArgs spec;
  std::string api_key, api_key_file, chat_template, chat_template_file, system, alias;
  double drain_grace_s = 30;
  size_t max_body_kib = 1024;
};

std::atomic<Server*> g_server{nullptr};
std::atomic<int> g_signals{0};

void on_signal(int) {
  Server* s = g_server.load();
  if (!s) return;
  if (g_signals.fetch_add(1) == 0)
    s->shutdown();
  else
    s->shutdown_now();
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  const auto e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

int serve(ServeArgs& a) {
  ServerOptions o = a.server;
  o.drain_grace_s = a.drain_grace_s;
  o.max_body_bytes = a.max_body_kib * 1024;
  if (!a.api_key.empty()) o.api_keys.push_back(a.api_key);
  if (!a.api_key_file.empty()) {
    // One key per line; blank lines and # comments skipped.
    const std::string text = read_regular_file(a.api_key_file, "API key file");
    size_t pos = 0;
    while (pos <= text.size()) {
      const size_t nl = std::min(text.find('\n', pos), text.size());
      const std::string line = trim(text.substr(pos, nl - pos));
      if (!line.empty() && line[0] != '#') o.api_keys.push_back(line);
      pos = nl + 1;
    }
    if (o.api_keys.empty()) fail("{}: the API key file holds no key", a.api_key_file);
  }
  const std::string path = a.model.model.empty() ? default_model_path() : a.model.model;
  o.model_id = a.alias.empty() ? std::filesystem::path(path).filename().string() : a.alias;
  // The KV pool: every slot can fill the context unless --kv-tokens says otherwise.
  ModelOptions mo = a.model;
  mo.kv_contexts = o.slots;

  // A file barata cannot run fails here, before "listening" is printed: the
  // header, the architecture and the hyperparameters (the weights load after).
  ModelConfig::from_gguf(GgufFile::open(path));
  Server server(o);
  const int port = server.listen();
  // SIGTERM and Ctrl-C drain this server while it lives; then as before.
  struct SignalGuard {
    explicit SignalGuard(Server& s)
        : term(std::signal(SIGTERM, on_signal)), intr(std::signal(SIGINT, on_signal)) {
      g_server = &s;
    }
    ~SignalGuard() {
      g_server = nullptr;
      std::signal(SIGTERM, term);
      std::signal(SIGINT, intr);
    }
    void (*term)(int);
    void (*intr)(int);
  } guard(server);
  fmt::print("barata serve: listening on http://{}:{} ({} slots, queue {}, {})\n", o.host, port,
             o.slots, o.max_queue, o.api_keys.empty() ? "no API key" : "API key required");
  std::fflush(stdout);
  Session s(session_options(mo));
  std::string why;
  std::shared_ptr<const ChatFormatter> format =
      a.chat_template.empty() && a.chat_template_file.empty()
          ? file_chat_format(s, &why)
          : choose_chat_format(a.chat_template, a.chat_template_file, s);
  if (!format) spdlog::warn("{}: {}; /v1/chat/completions answers 400", s.path, why);
  server.set_chat(format, format ? system_prompt_or_default(a.system, *format) : a.system);
  // Speculative decoding per slot: a drafter per request, over one draft
  // engine whose pool holds every slot's context.
  DraftFactory draft;
  if (a.spec.any()) {
    draft = make_draft_factory(a.spec, s, o.slots);
    server.set_drafter(draft.drafter_for, a.spec.draft_max, a.spec.draft_min, a.spec.draft_auto,
                       draft.setup.c_prior);
    fmt::print("barata serve: speculative decoding: {}, {}{} drafted tokens per step\n",
               draft.setup.name, a.spec.draft_auto ? "auto, at most " : "up to ", a.spec.draft_max);
  }
  fmt::print(
      "barata serve: ready: {} ({} threads, context {}, {} tokens of KV cache, chat "
      "template {}), load {:.0f} ms\n",
      o.model_id, s.engine.n_threads(), s.engine.n_ctx(), s.engine.blocks().max_tokens(),
      format ? format->name() : "none", s.load_ms);
  std::fflush(stdout);
  server.serve(s.engine, s.tok);
  fmt::print("barata serve: stopped\n");
  return 0;
}

}  // namespace

Command add_serve(CLI::App& app) {
  auto* sub = app.add_subcommand("serve", "OpenAI-compatible HTTP server with a web chat page");
  auto a = std::make_shared<ServeArgs>();
  add_model_options(sub, a->model);
  sub->add_option("--host", a->server.host, "Address to bind (default: 127.0.0.1, loopback only)");
  sub->add_option("--port", a->server.port, "Port (0: any free one, printed)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--slots", a->server.slots, "Requests decoding at once (default: 4)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--max-queue", a->server.max_queue,
                  "Requests waiting for a slot; past it, HTTP 429 (default: 16)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--max-batch-tokens", a->server.max_batch_tokens,
                  "Rows per forward call, decode rows and prefill chunks (default: 512)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto* key = sub->add_option("--api-key", a->api_key,
                              "Key clients must send as 'Authorization: Bearer KEY'");
  sub->add_option("--api-key-file", a->api_key_file, "File of keys, one per line")
      ->check(CLI::ExistingFile)
      ->excludes(key);
  add_chat_template_options(sub, a->chat_template, a->chat_template_file);
  sub->add_option("--system", a->system,
                  "System prompt when a conversation has none (default: the template's)");
  sub->add_option("--alias", a->alias, "Model name in /v1/models (default: the file's name)");
  sub->add_option("--drain-grace", a->drain_grace_s,
                  "SIGTERM: seconds running requests get before they are cancelled (default: 30)")
      ->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--max-body-kib", a->max_body_kib,
                  "Largest request body in KiB; larger gets 413 (default: 1024)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  sub->add_option("--http-threads", a->server.http_threads,
                  "Threads answering requests (default: 64 + slots + max-queue)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--max-connections", a->server.max_connections,
                  "Open connections at most; idle keep-alive ones are closed to make room, "
                  "then a new one gets 503 (default: 1024)")
      ->check(CLI::Range(1, 65536));
  sub->add_option("--header-timeout", a->server.head_timeout_s,
                  "Seconds a request's headers may take to arrive, in all (default: 10)")
      ->check(CLI::Range(0.1, 3600.0));
  sub->add_option("--cors-origin", a->server.cors_origin,
                  "Access-Control-Allow-Origin for browsers on other origins ('*' or one "
                  "origin; default: none)");
  sub->add_option("--log-format", a->server.log_format,
                  "One line per request on stderr: text (key=value), json, or off (default: text)")
      ->check(CLI::IsMember({"text", "json", "off"}));
  sub->add_flag("--allow-special-in-content", a->server.allow_special_in_content,
                "Parse special-token text inside chat messages as special tokens (default: a "
                "client's text is text)");
  // The defaults of requests that do not set temperature / top_p.
  add_sampling_options(sub, a->server.sampling);
  add_spec_options(sub, a->spec);
  sub->callback([a] { check_spec_args(a->spec); });
  return {sub, [a] { return serve(*a); }};
}

}  // namespace barata::cli
