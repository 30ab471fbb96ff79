// barata serve: an OpenAI-compatible HTTP/1.1 server over the scheduler
// (include/barata/scheduler.h). HTTP threads parse, validate and tokenize
// requests and write responses (SSE streams included); one engine thread owns
// the scheduler and runs its steps. They meet in a bounded inbox and in one
// Job per request, whose text the engine thread appends and the request's
// HTTP thread takes and writes, so a slow client never stalls a step.
//
// Endpoints (docs/server.md): POST /v1/chat/completions, POST /v1/completions,
// GET /v1/models, GET /health, GET /metrics (Prometheus text), GET / (the web
// chat page, embedded at build time from web/index.html).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "barata/chat_template.h"
#include "barata/sampler.h"
#include "barata/sequence.h"

namespace barata {

class Engine;
class Drafter;
class Tokenizer;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (Server::listen returns it)
  int slots = 4;    // sequences decoding at once
  // Requests waiting for a slot; one more gets 429 with Retry-After.
  int max_queue = 16;
  int64_t max_batch_tokens = 512;     // rows per forward call
  std::vector<std::string> api_keys;  // empty: no key asked for
  size_t max_body_bytes = 1 << 20;    // larger bodies get 413
  double drain_grace_s = 30;          // SIGTERM: running requests get this long, then are cancelled
  int http_threads = 0;               // 0: 64 + slots + max_queue
  int max_connections = 1024;         // open connections; beyond: 503 (idle ones closed first)
  double head_timeout_s = 10;         // a request's head must arrive whole within this
  double write_timeout_s = 30;        // a write to a client that makes no progress: it is gone
  std::string cors_origin;            // Access-Control-Allow-Origin; empty: no CORS headers
  std::string log_format = "text";    // one line per request on stderr: text, json, off
  // Special-token text inside chat messages is parsed as special tokens
  // (off: a client's text is text; only the template's markup makes them).
  bool allow_special_in_content = false;
  // SO_SNDBUF of every connection (set on the listening socket, which the
  // accepted ones inherit); 0: the system's, autotuned.
  int socket_send_buffer = 0;
  std::string model_id = "barata";  // what /v1/models lists and responses name
  // Sampling when a request does not say (temperature and top_p it may set).
  SamplerOptions sampling;
  // The chat template; null: /v1/chat/completions answers 400.
  std::shared_ptr<const ChatFormatter> chat;
  std::string default_system;  // inserted when a conversation has no system message
  // Speculative decoding per request (SchedulerOptions::drafter_for); null: none.
  std::function<std::unique_ptr<Drafter>(const Request&)> drafter_for;
  int draft_max = 8, draft_min = 0;
  bool draft_auto = false;  // each request chooses its gamma (SchedulerOptions::draft_auto)
  double draft_c_prior = -1;
};

class Server {
 public:
  explicit Server(ServerOptions o);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts answering (GET /health says "loading" until serve());
  // returns the port. Throws barata::Error when the address cannot be bound.
  int listen();
  // The chat template and default system prompt, when they are known only
  // once the model is loaded (before serve()).
  void set_chat(std::shared_ptr<const ChatFormatter> chat, std::string default_system);
  // The drafter of each request, when it is known only once the model is
  // loaded (before serve()).
  void set_drafter(std::function<std::unique_ptr<Drafter>(const Request&)> drafter_for,
                   int draft_max, int draft_min, bool draft_auto = false,
                   double draft_c_prior = -1);
  // Runs the engine loop in this thread until shutdown() and the drain are
  // over, then stops the HTTP side. The engine's KV pool must be empty.
  void serve(Engine& engine, const Tokenizer& tok);
  // Async-signal-safe: stop accepting requests (503), let running ones
  // finish for drain_grace_s, cancel the rest, and return from serve().
  void shutdown();
  // shutdown() with no grace: running requests are cancelled at once.
  void shutdown_now();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace barata
