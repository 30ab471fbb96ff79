// barata serve (include/barata/server.h). HTTP from cpp-httplib (Debian's
// libcpp-httplib-dev: maintained, HTTP/1.1 with chunked streaming and a thread
// per connection, which is what SSE to many clients needs without an event
// loop of our own), JSON from nlohmann-json.
#include "barata/server.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <map>
#include <mutex>
#include <limits>
#include <numeric>
#include <random>
#include <thread>
#include <unordered_map>

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "barata/engine.h"
#include "barata/error.h"
#include "barata/grammar.h"
#include "barata/scheduler.h"
#include "barata/tokenizer.h"
#include "http_front.h"
#include "metrics.h"
#include "openai_request.h"
#include "barata/file_io.h"
#include "safe_text.h"
#include "reply.h"
#include "tool_calls.h"

namespace barata {

// The page, embedded at build time (CMake writes it from web/index.html).
extern const unsigned char kWebIndexHtml[];
extern const size_t kWebIndexHtmlSize;

namespace {

using namespace openai;  // ApiError, bad_request and the field checks

constexpr int64_t kMaxSamples = 16;  // a request's `n` at most

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  // Messages are printable already (net::printable); replace is the second guard.
  res.set_content(error_body(e).dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

// The metrics' path label: one of the routes, else "other" (a client cannot
// add series or lines).
const std::string& route_label(const std::string& path) {
  static const std::vector<std::string> kRoutes = {
      "/",          "/index.html",          "/favicon.ico",    "/health",   "/metrics",
      "/v1/models", "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"};
  static const std::string kOther = "other";
  for (const std::string& r : kRoutes)
    if (r == path) return r;
  return kOther;
}

// What the request log line says of a request, gathered on the thread that
// answers it (the router, its handler and a stream's writer share it).
struct RequestRecord {
  Clock::time_point start;
  bool started = false;
  int64_t prompt_tokens = -1, completion_tokens = -1;
  double ttft_s = -1;
};
thread_local RequestRecord tl_record;

// ---- one request --------------------------------------------------------------------

}  // namespace

// ---- the server ---------------------------------------------------------------------

struct Server::Impl {
  ServerOptions o;
  net::Routes http;
  std::unique_ptr<net::Front> front;  // after `http`, which it calls: destroyed first
  int port = -1;
  std::mutex log_m;
  Clock::time_point t0 = Clock::now();

  // Set by serve().
  Engine* engine = nullptr;
  const Tokenizer* tok = nullptr;
  int64_t n_ctx = 0, pool_tokens = 0;
  std::atomic<bool> ready{false};

  // Shutdown: 1 drain, 2 now. Written from a signal handler.
  std::atomic<int> shutdown_req{0};
  std::atomic<bool> accepting{true};

  // The inbox: jobs to submit and scheduler ids to cancel.
  std::mutex inbox_m;
  std::condition_variable inbox_cv;
  std::deque<std::shared_ptr<Job>> inbox;
  std::vector<std::shared_ptr<Job>> to_cancel;
  // Requests handed to the engine and not yet finished (inbox_m): queued in
  // the inbox, waiting in the scheduler or running.
  int64_t in_flight = 0;
  std::atomic<int64_t> next_id{1};
  // Streaming responses not yet written to their end: the drain waits for
  // them before the listener stops (stopping ends a stream mid-chunk).
  std::atomic<int64_t> open_streams{0};

  // Metrics (metrics_m).
  std::mutex metrics_m;
  std::map<std::pair<std::string, int>, int64_t> http_requests;  // (endpoint, status)
  int64_t rejected_429 = 0, prompt_tokens = 0, generated_tokens = 0, finished = 0, cancelled = 0;
  int64_t queue_depth = 0, slots_in_use = 0, kv_used = 0, kv_total = 0, kv_cached = 0;
  int64_t kv_block_bytes = 0, kv_token_bytes = 0;  // in the cache's types (-ctk/-ctv)
  int64_t prefix_hit_tokens = 0, prefix_lookups = 0, prefix_hit_blocks = 0, steps = 0;
  int64_t sample_forks = 0;
  int64_t draft_rows = 0, draft_accepted = 0;  // speculative decoding
  net::Histogram ttft{net::kTimeBuckets}, latency{net::kTimeBuckets};
  std::deque<double> completions;  // when the last requests finished (seconds since t0)

  explicit Impl(ServerOptions opts) : o(std::move(opts)) {}

  void count(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> l(metrics_m);
    ++http_requests[{route_label(endpoint), status}];
    if (status == 429) ++rejected_429;
  }
  // One line per request on stderr (--log-format text|json).
  void log_request(const std::string& method, const std::string& target, int status,
                   const std::string& peer, const RequestRecord& r, const std::string& error);

  // Seconds until a place in the queue frees, from the recent drain rate.
  // `queued`: requests waiting beyond the slots.
  int retry_after_s(int64_t queued) {
    std::lock_guard<std::mutex> l(metrics_m);
    if (completions.size() < 2) return 1;
    const double span = completions.back() - completions.front();
    if (span <= 0) return 1;
    const double rate = static_cast<double>(completions.size() - 1) / span;
    const double s = std::ceil(static_cast<double>(queued - o.max_queue + 1) / rate);
    return static_cast<int>(std::clamp(s, 1.0, 600.0));
  }

  bool authorized(const httplib::Request& req) const {
    if (o.api_keys.empty()) return true;
    const std::string h = req.get_header_value("Authorization");
    const std::string bearer = "Bearer ";
    if (h.compare(0, bearer.size(), bearer) != 0) return false;
    const std::string key = h.substr(bearer.size());
    for (const std::string& k : o.api_keys)
      if (key.size() == k.size()) {
        unsigned char diff = 0;  // no early exit on the first differing byte
        for (size_t i = 0; i < k.size(); ++i) diff |= static_cast<unsigned char>(key[i] ^ k[i]);
        if (diff == 0) return true;
      }
    return false;
  }

  void setup_routes();
  void handle_generate(const httplib::Request& req, httplib::Response& res, Kind kind);
  std::shared_ptr<Job> parse_job(const json& body, std::string_view raw, Kind kind);
  // response_format (chat), or llama-server's "grammar" / "json_schema": the
  // request's grammar, or null.
  std::shared_ptr<const GrammarIndex> parse_constraint(const json& body, std::string_view raw,
                                                       Kind kind);
  std::string parse_tools(const json& body, std::string_view raw, Job& job);
  void engine_loop();
  std::string metrics_text();
};

void Server::Impl::setup_routes() {
  const int threads = o.http_threads > 0 ? o.http_threads : 64 + o.slots + o.max_queue;
  net::FrontOptions fo;
  fo.max_body_bytes = o.max_body_bytes;
  fo.head_timeout_s = o.head_timeout_s;
  fo.write_timeout_s = o.write_timeout_s;
  fo.max_connections = o.max_connections;
  fo.workers = threads;
  front = std::make_unique<net::Front>(
      http, fo,
      [this](int status, const std::string& method, const std::string& target,
             const std::string& message) {
        count("", status);
        log_request(method, target, status, "", RequestRecord{}, message);
      });
  http.set_payload_max_length(o.max_body_bytes);

  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    tl_record = RequestRecord{};
    tl_record.start = Clock::now();
    tl_record.started = true;
    if (!o.cors_origin.empty()) {
      res.set_header("Access-Control-Allow-Origin", o.cors_origin);
      if (o.cors_origin != "*") res.set_header("Vary", "Origin");
      if (req.method == "OPTIONS") {  // a CORS preflight
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
        res.set_header("Access-Control-Max-Age", "600");
        count(req.path, 204);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    const bool open = req.path == "/" || req.path == "/health" || req.path == "/index.html" ||
                      req.path == "/favicon.ico";
    if (!open && !authorized(req)) {
      send_error(
          res,
          {401,
           o.api_keys.empty() ? "" : "Incorrect or missing API key (Authorization: Bearer KEY)",
           "invalid_request_error", "", "invalid_api_key"});
      count(req.path, 401);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Every status >= 400 passes here; fill in a body where a handler did not
  // (404, 405, httplib's own 400 and 413). Client bytes go through
  // net::printable: this runs outside httplib's try block.
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const std::string method = printable(req.method, 32);
        const std::string path = printable(req.path, 200);
        std::string msg = fmt::format("HTTP {} for {} {}", res.status, method, path);
        if (res.status == 404) msg = fmt::format("no route {} {}", method, path);
        if (res.status == 413)
          msg = fmt::format("the request body exceeds {} bytes", o.max_body_bytes);
        const int status = res.status;
        send_error(res, {status, msg, "invalid_request_error", "", ""});
        count(req.path, status);
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = printable(e.what());
        } catch (...) {
        }
        send_error(res, {500, what, "server_error", "", ""});
        count(req.path, 500);
      });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    std::string error;
    if (res.status >= 400) {
      try {
        const json b = json::parse(res.body);
        error = b.at("error").at("message").get<std::string>();
      } catch (const std::exception&) {
      }
    }
    log_request(req.method, req.target, res.status,
                fmt::format("{}:{}", req.remote_addr, req.remote_port), tl_record, error);
    tl_record = RequestRecord{};
  });

  http.Get("/favicon.ico", [this](const httplib::Request& req, httplib::Response& res) {
    res.status = 204;  // no icon; a browser asks on every page load
    res.set_header("Cache-Control", "max-age=86400");
    count(req.path, 204);
  });
  http.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    if (!ready) {
      res.status = 503;
      res.set_content(R"({"status":"loading"})", "application/json");
    } else if (!accepting) {
      res.status = 503;
      res.set_content(R"({"status":"shutting down"})", "application/json");
    } else {
      res.set_content(R"({"status":"ok"})", "application/json");
    }
    count(req.path, res.status);
  });
  auto page = [this](const httplib::Request& req, httplib::Response& res) {
    res.set_content(std::string(reinterpret_cast<const char*>(kWebIndexHtml), kWebIndexHtmlSize),
                    "text/html; charset=utf-8");
    count(req.path, 200);
  };
  http.Get("/", page);
  http.Get("/index.html", page);
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    const json m = {{"id", o.model_id},
                    {"object", "model"},
                    {"created", std::chrono::duration_cast<std::chrono::seconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count()},
                    {"owned_by", "barata"}};
    res.set_content(json{{"object", "list"}, {"data", json::array({m})}}.dump(),
                    "application/json");
    count(req.path, 200);
  });
  http.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
    count(req.path, 200);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Kind::kChat);
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, Kind::kCompletion);
  });
  // llama-server's tokenizer endpoints.
  auto tokenizer_route = [this](const char* path, auto body_fn) {
    http.Post(path, [this, body_fn](const httplib::Request& req, httplib::Response& res) {
      try {
        if (!ready) throw ApiError{503, "the model is loading", "server_error", "", "loading"};
        const json body = parse_body(req.body);
        if (!body.is_object()) bad_request("the request body must be a JSON object");
        res.set_content(body_fn(body).dump(-1, ' ', false, json::error_handler_t::replace),
                        "application/json");
        count(req.path, 200);
      } catch (const ApiError& e) {
        send_error(res, e);
        count(req.path, e.status);
      }
    });
  };
  tokenizer_route("/tokenize", [this](const json& body) {
    check_known(body, {"content", "add_special", "parse_special", "with_pieces"});
    const json& c = field(body, "content");
    if (!c.is_string()) bad_request("'content' must be a string", "content");
    const bool add = boolean(body, "add_special", false);
    const bool special = boolean(body, "parse_special", true);
    const bool pieces = boolean(body, "with_pieces", false);
    const std::vector<int32_t> ids =
        tok->encode(c.get<std::string>(), add && tok->bos_id() >= 0, special);
    json out = json::array();
    for (int32_t id : ids) {
      if (!pieces) {
        out.push_back(id);
        continue;
      }
      // A piece that is not whole UTF-8 is given as its bytes, as llama-server does.
      const std::string p = tok->token_to_piece(id);
      json piece = p;
      if (!net::valid_utf8(p)) {
        piece = json::array();
        for (unsigned char b : p) piece.push_back(b);
      }
      out.push_back({{"id", id}, {"piece", piece}});
    }
    return json{{"tokens", out}};
  });
  tokenizer_route("/detokenize", [this](const json& body) {
    check_known(body, {"tokens"});
    const json& t = field(body, "tokens");
    if (!t.is_array()) bad_request("'tokens' must be an array of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const json& x : t) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= tok->n_vocab())
        bad_request(fmt::format("'tokens' must hold ids in [0, {})", tok->n_vocab()), "tokens");
      ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    return json{{"content", tok->decode(ids)}};
  });
}

std::shared_ptr<const GrammarIndex> Server::Impl::parse_constraint(const json& body,
                                                                   std::string_view raw,
                                                                   Kind kind) {
  // Schemas are read again from the raw body with their keys in order: a
  // schema's properties are written in the order it lists them.
  auto ordered = [&](auto&& path) {
    nlohmann::ordered_json o = nlohmann::ordered_json::parse(raw);
    for (const char* k : path) o = nlohmann::ordered_json(o.at(k));
    return o;
  };
  std::string gbnf, where;
  const json& g = field(body, "grammar");
  const json& js = field(body, "json_schema");
  const json& rf = kind == Kind::kChat ? field(body, "response_format") : json();
  const int given = !g.is_null() + !js.is_null() + (!rf.is_null() && rf != json{{"type", "text"}});
  if (given > 1)
    bad_request("give one of 'response_format', 'grammar' and 'json_schema'",
                !rf.is_null() ? "response_format" : "grammar");
  try {
    if (!g.is_null()) {
      where = "grammar";
      if (!g.is_string()) bad_request("'grammar' must be a string (GBNF)", where);
      gbnf = g.get<std::string>();
    } else if (!js.is_null()) {
      where = "json_schema";
      if (!js.is_object() && !js.is_boolean())
        bad_request("'json_schema' must be a JSON Schema (an object)", where);
      gbnf = json_schema_to_gbnf(ordered(std::array{"json_schema"}));
    } else if (!rf.is_null()) {
      where = "response_format";
      if (!rf.is_object() || !field(rf, "type").is_string())
        bad_request("'response_format' must be an object with a string 'type'", where);
      const std::string type = rf.at("type").get<std::string>();
      if (type == "text") return nullptr;
      if (type == "json_object") {
        gbnf = json_object_gbnf();
      } else if (type == "json_schema") {
        const json& spec = field(rf, "json_schema");
        if (!spec.is_object() || field(spec, "schema").is_null())
          bad_request("response_format: 'json_schema' must be an object with a 'schema'", where);
        for (auto it = spec.begin(); it != spec.end(); ++it)
          if (it.key() != "name" && it.key() != "schema" && it.key() != "strict" &&
              it.key() != "description")
            bad_request(fmt::format("response_format.json_schema: unknown field '{}'",
                                    printable(it.key(), 80)),
                        where);
        gbnf = json_schema_to_gbnf(ordered(std::array{"response_format", "json_schema", "schema"}));
      } else {
        bad_request(fmt::format("response_format: type '{}' is not one of text, json_object, "
                                "json_schema",
                                printable(type, 80)),
                    where);
      }
    } else {
      return nullptr;
    }
    return grammar_index(gbnf, *tok);
  } catch (const Error& e) {
    bad_request(printable(e.what(), 400), where);
  }
}

// "tools" and "tool_choice": the tools as JSON text for the template ("" when
// none reach it), the syntax replies are read in, and for "required" or a
// named function the grammar of a call.
std::string Server::Impl::parse_tools(const json& body, std::string_view raw, Job& job) {
  const json& tools = field(body, "tools");
  const json& choice = field(body, "tool_choice");
  if (tools.is_null() || (tools.is_array() && tools.empty())) {
    if (!choice.is_null() && choice != "none" && choice != "auto")
      bad_request("'tool_choice' needs 'tools'", "tool_choice");
    return "";
  }
  if (!tools.is_array()) bad_request("'tools' must be an array", "tools");
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string p = fmt::format("tools[{}]", i);
    if (!t.is_object() || field(t, "type") != "function" || !field(t, "function").is_object())
      bad_request(fmt::format("{} must be {{\"type\": \"function\", \"function\": {{...}}}}", p),
                  p);
    const json& f = t["function"];
    if (!field(f, "name").is_string() || f["name"].get<std::string>().empty())
      bad_request(fmt::format("{}.function.name must be a non-empty string", p), p);
    const json& params = field(f, "parameters");
    if (!params.is_null() && !params.is_object())
      bad_request(fmt::format("{}.function.parameters must be a JSON Schema (an object)", p), p);
    names.push_back(f["name"].get<std::string>());
  }
  std::string mode = "auto", named;
  if (choice.is_string()) {
    mode = choice.get<std::string>();
    if (mode != "auto" && mode != "none" && mode != "required")
      bad_request(fmt::format("'tool_choice' '{}' is not one of auto, none, required or a "
                              "function",
                              printable(mode, 40)),
                  "tool_choice");
  } else if (choice.is_object()) {
    const json& f = field(choice, "function");
    if (field(choice, "type") != "function" || !f.is_object() || !field(f, "name").is_string())
      bad_request(
          "'tool_choice' must be auto, none, required or {\"type\": \"function\", "
          "\"function\": {\"name\": ...}}",
          "tool_choice");
    named = f["name"].get<std::string>();
    if (std::find(names.begin(), names.end(), named) == names.end())
      bad_request(fmt::format("'tool_choice' names no tool in 'tools': '{}'", printable(named, 80)),
                  "tool_choice");
    mode = "function";
  } else if (!choice.is_null()) {
    bad_request("'tool_choice' must be a string or an object", "tool_choice");
  }
  if (mode == "none") return "";
  if (!o.chat) return "";  // answered below: no chat template
  const std::optional<ToolSyntax> syntax = tool_syntax_of(*o.chat);
  if (!syntax)
    bad_request(fmt::format("'tools': this model's chat template ({}) shows no tool-call syntax "
                            "barata reads (hermes <tool_call>, llama3 JSON, mistral [TOOL_CALLS])",
                            o.chat->name()),
                "tools");
  job.tools = syntax;
  // The tools as sent, keys in order (the template prints them; a
  // grammar writes properties in their order).
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(raw).at("tools");
  if (mode == "required" || mode == "function") {
    if (job.req.grammar)
      bad_request("give either 'tool_choice' required (or a function) or a response format",
                  "tool_choice");
    try {
      job.req.grammar = grammar_index(
          tool_call_gbnf(*syntax, ordered, mode == "function" ? &named : nullptr), *tok);
    } catch (const Error& e) {
      bad_request(printable(e.what(), 400), "tools");
    }
  }
  return ordered.dump();
}

std::shared_ptr<Job> Server::Impl::parse_job(const json& body, std::string_view raw, Kind kind) {
  if (!body.is_object()) bad_request("the request body must be a JSON object");
  static const std::vector<std::string> kCommon = {"model",
                                                   "stream",
                                                   "stream_options",
                                                   "max_tokens",
                                                   "temperature",
                                                   "top_p",
                                                   "seed",
                                                   "stop",
                                                   "n",
                                                   "user",
                                                   "presence_penalty",
                                                   "frequency_penalty",
                                                   "logprobs",
                                                   "logit_bias",
                                                   "grammar",
                                                   "json_schema"};
  std::vector<std::string> known = kCommon;
  if (kind == Kind::kChat) {
    for (const char* k :
         {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
          "response_format", "parallel_tool_calls", "store", "metadata"})
      known.push_back(k);
  } else {
    for (const char* k : {"prompt", "echo", "suffix", "best_of"}) known.push_back(k);
  }
  check_known(body, known);

  auto job = std::make_shared<Job>();
  job->kind = kind;
  const json& model = field(body, "model");
  if (!model.is_null() && !model.is_string()) bad_request("'model' must be a string", "model");
  job->stream = boolean(body, "stream", false);
  const json& so = field(body, "stream_options");
  if (!so.is_null()) {
    if (!so.is_object()) bad_request("'stream_options' must be an object", "stream_options");
    for (auto it = so.begin(); it != so.end(); ++it)
      if (it.key() != "include_usage")
        bad_request(fmt::format("stream_options: unsupported field '{}'", printable(it.key(), 80)),
                    "stream_options");
    job->include_usage = boolean(so, "include_usage", false);
  }
  job->n = static_cast<int>(integer_in(body, "n", 1, kMaxSamples).value_or(1));
  only_default(body, "logit_bias", json::object());
  const json& user = field(body, "user");
  if (!user.is_null() && !user.is_string()) bad_request("'user' must be a string", "user");
  if (kind == Kind::kChat) {
    const bool lp = boolean(body, "logprobs", false);
    const std::optional<int64_t> top = integer_in(body, "top_logprobs", 0, 20);
    if (top && !lp) bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
    if (lp) job->top_logprobs = static_cast<int>(top.value_or(0));
    job->parallel_tool_calls = boolean(body, "parallel_tool_calls", true);
    only_default(body, "store", false);
  } else {
    if (!field(body, "logprobs").is_null())
      job->top_logprobs = static_cast<int>(*integer_in(body, "logprobs", 0, 5));
    only_default(body, "echo", false);
    only_default(body, "suffix", nullptr);
    only_default(body, "best_of", 1);
  }

  SamplerOptions s = o.sampling;
  if (auto t = number_in(body, "temperature", 0, 2)) s.temperature = static_cast<float>(*t);
  if (auto p = number_in(body, "top_p", 0, 1)) {
    if (*p == 0) bad_request("'top_p' must be above 0", "top_p");
    s.top_p = static_cast<float>(*p);
  }
  if (auto seed = integer_in(body, "seed", std::numeric_limits<int64_t>::min(),
                             std::numeric_limits<int64_t>::max())) {
    s.seed = static_cast<uint64_t>(*seed);
  } else {
    static std::mutex rd_m;
    static std::random_device rd;
    std::lock_guard<std::mutex> l(rd_m);
    s.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  if (auto p = number_in(body, "presence_penalty", -2, 2))
    s.presence_penalty = static_cast<float>(*p);
  if (auto f = number_in(body, "frequency_penalty", -2, 2))
    s.frequency_penalty = static_cast<float>(*f);
  job->req.sampling = s;

  std::optional<int64_t> max_tokens = integer_in(body, "max_tokens", 1, 1LL << 40);
  if (kind == Kind::kChat)
    if (auto m = integer_in(body, "max_completion_tokens", 1, 1LL << 40)) max_tokens = m;
  job->req.stop = parse_stop(body);
  job->req.grammar = parse_constraint(body, raw, kind);
  std::string tools_text;
  if (kind == Kind::kChat) tools_text = parse_tools(body, raw, *job);

  // The prompt.
  const bool bos = tok->add_bos_default();
  if (kind == Kind::kChat) {
    std::vector<ChatMessage> msgs = parse_messages(body);
    if (!o.chat)
      bad_request(
          "this model has no chat template barata knows; use /v1/completions, or start the "
          "server with --chat-template");
    const bool has_system = std::any_of(msgs.begin(), msgs.end(),
                                        [](const ChatMessage& m) { return m.role == "system"; });
    if (!has_system && !o.default_system.empty())
      msgs.insert(msgs.begin(), ChatMessage{"system", o.default_system});
    // The template's markup is parsed for special tokens; the messages' text
    // is text (a "<|im_end|>" typed by a client is not a control token)
    // unless --allow-special-in-content.
    std::vector<TextRange> content;
    const std::string text = o.chat->apply(msgs, true, &content, tools_text);
    if (o.allow_special_in_content) content.clear();
    job->req.prompt = tok->encode(text, bos, true, content);
  } else {
    const json& p = field(body, "prompt");
    if (p.is_string()) {
      if (p.get<std::string>().empty()) bad_request("'prompt' is empty", "prompt");
      job->req.prompt = tok->encode(p.get<std::string>(), bos, false);
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      for (const json& t : p) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
            t.get<int64_t>() >= static_cast<int64_t>(tok->n_vocab()))
          bad_request("'prompt' token ids must be integers inside the vocabulary", "prompt");
        job->req.prompt.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      job->req.prompt = tok->encode(p[0].get<std::string>(), bos, false);
    } else {
      bad_request("'prompt' must be a string, one string in an array, or an array of token ids",
                  "prompt");
    }
    if (job->req.prompt.empty()) bad_request("'prompt' is empty", "prompt");
  }
  const auto n_prompt = static_cast<int64_t>(job->req.prompt.size());
  if (n_prompt >= n_ctx)
    bad_request(fmt::format("the prompt has {} tokens but the context holds {} (one more is "
                            "needed for the reply)",
                            n_prompt, n_ctx),
                kind == Kind::kChat ? "messages" : "prompt", "context_length_exceeded");
  if (n_prompt + 1 > pool_tokens)
    bad_request(fmt::format("the prompt has {} tokens but the whole KV pool holds {}", n_prompt,
                            pool_tokens),
                kind == Kind::kChat ? "messages" : "prompt", "context_length_exceeded");
  // Without max_tokens: until the context is full (finish_reason "length").
  job->req.max_tokens = max_tokens ? *max_tokens : n_ctx - n_prompt;
  job->created = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  job->id = fmt::format("{}-{}", kind == Kind::kChat ? "chatcmpl" : "cmpl", next_id++);
  return job;
}

void Server::Impl::log_request(const std::string& method, const std::string& target, int status,
                               const std::string& peer, const RequestRecord& r,
                               const std::string& error) {
  if (o.log_format == "off") return;
  const double ms = r.started ? seconds_since(r.start) * 1000 : 0;
  const auto now = std::chrono::system_clock::now();
  const auto t = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch());
  std::string line;
  if (o.log_format == "json") {
    json j = {{"ts", static_cast<double>(t.count()) / 1000},
              {"event", "request"},
              {"method", printable(method, 32)},
              {"path", printable(target, 200)},
              {"status", status},
              {"duration_ms", std::round(ms * 10) / 10}};
    if (!peer.empty()) j["peer"] = peer;
    if (r.prompt_tokens >= 0) j["prompt_tokens"] = r.prompt_tokens;
    if (r.completion_tokens >= 0) j["completion_tokens"] = r.completion_tokens;
    if (r.ttft_s >= 0) j["ttft_ms"] = std::round(r.ttft_s * 10000) / 10;
    if (!error.empty()) j["error"] = printable(error, 200);
    line = j.dump(-1, ' ', false, json::error_handler_t::replace);
  } else {
    // key=value, values without spaces except the quoted error.
    auto dash = [](const std::string& v) { return v.empty() ? std::string("-") : v; };
    line = fmt::format(
        "request method={} path={} status={} prompt_tokens={} completion_tokens={} "
        "ttft_ms={} duration_ms={:.1f} peer={}",
        dash(printable(method, 32)), dash(printable(target, 200)), status,
        r.prompt_tokens >= 0 ? std::to_string(r.prompt_tokens) : "-",
        r.completion_tokens >= 0 ? std::to_string(r.completion_tokens) : "-",
        r.ttft_s >= 0 ? fmt::format("{:.1f}", r.ttft_s * 1000) : "-", ms, dash(peer));
    if (!error.empty()) {
      std::string e = printable(error, 200);
      std::replace(e.begin(), e.end(), '"', '\'');
      line += fmt::format(" error=\"{}\"", e);
    }
  }
  std::lock_guard<std::mutex> l(log_m);
  std::fprintf(stderr, "%s\n", line.c_str());
}

void Server::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, Kind kind) {
  const std::string endpoint = req.path;
  std::shared_ptr<Job> job;
  try {
    if (!ready) throw ApiError{503, "the model is loading", "server_error", "", "loading"};
    if (!accepting)
      throw ApiError{503, "the server is shutting down", "server_error", "", "shutting_down"};
    const std::string& ct = req.get_header_value("Content-Type");
    if (!ct.empty() && ct.find("application/json") == std::string::npos)
      bad_request(
          fmt::format("Content-Type must be application/json, not '{}'", printable(ct, 80)));
    const json body = parse_body(req.body);
    job = parse_job(body, req.body, kind);
    job->t_arrival = Clock::now();
    for (int i = 1; i < job->n; ++i) job->samples.push_back(another_sample(*job, i));
    {
      std::lock_guard<std::mutex> l(inbox_m);
      // Again under the lock: the drain ends once it sees the inbox empty
      // after the signal, and a job queued later would never be answered.
      if (!accepting)
        throw ApiError{503, "the server is shutting down", "server_error", "", "shutting_down"};
      // Refused only when every slot and every queue place is taken.
      if (in_flight + job->n > o.slots + o.max_queue) {
        const int64_t queued = in_flight - o.slots;
        const int retry = retry_after_s(queued);
        res.set_header("Retry-After", std::to_string(retry));
        throw ApiError{429,
                       fmt::format("{} slots are busy and {} requests are waiting (at most {}); "
                                   "retry in {} s",
                                   o.slots, queued, o.max_queue, retry),
                       "rate_limit_error", "", "queue_full"};
      }
      inbox.push_back(job);
      in_flight += job->n;
    }
    inbox_cv.notify_all();
  } catch (const ApiError& e) {
    send_error(res, e);
    count(endpoint, e.status);
    return;
  } catch (const json::exception& e) {
    send_error(res, {400, printable(e.what()), "invalid_request_error", "", ""});
    count(endpoint, 400);
    return;
  } catch (const Error& e) {  // the tokenizer's limits and the like
    send_error(res, {400, printable(e.what()), "invalid_request_error", "", ""});
    count(endpoint, 400);
    return;
  }

  // The request's jobs: one, or its n samples.
  std::vector<std::shared_ptr<Job>> group{job};
  group.insert(group.end(), job->samples.begin(), job->samples.end());
  auto cancel = [this, group](const std::shared_ptr<Job>&) {
    bool any = false;
    for (const auto& j : group) any |= !j->cancelled.exchange(true);
    if (!any) return;
    {
      std::lock_guard<std::mutex> l(inbox_m);
      for (const auto& j : group) to_cancel.push_back(j);
    }
    inbox_cv.notify_all();
  };
  auto all_done = [group] {
    return std::all_of(group.begin(), group.end(), [](const auto& j) { return j->done; });
  };
  // Usage over the samples: the prompt once, every sample's tokens.
  auto record = [group](json* usage) {
    int64_t completion = 0;
    for (const auto& j : group) completion += j->completion_tokens;
    tl_record.prompt_tokens = group[0]->prompt_tokens;
    tl_record.completion_tokens = completion;
    tl_record.ttft_s = group[0]->ttft_s;
    if (usage)
      *usage = {{"prompt_tokens", group[0]->prompt_tokens},
                {"completion_tokens", completion},
                {"total_tokens", group[0]->prompt_tokens + completion}};
  };
  // A sample that failed or was cancelled fails the request.
  auto failure = [group]() -> std::optional<ApiError> {
    for (const auto& j : group) {
      if (j->finish == FinishReason::kCancelled)
        return ApiError{503, "cancelled: the server is shutting down", "server_error", "",
                        "shutting_down"};
      if (j->finish == FinishReason::kError)
        return ApiError{400, j->error, "invalid_request_error", "", ""};
    }
    return std::nullopt;
  };

  if (!job->stream) {
    json usage, choices = json::array();
    {
      std::unique_lock<std::mutex> l(job->m);
      job->cv.wait(l, all_done);
      record(&usage);
    }
    if (const auto e = failure()) {
      send_error(res, *e);
      count(endpoint, e->status);
      return;
    }
    for (const auto& j : group) choices.push_back(choice_json(*j));
    const json out = {{"id", job->id},
                      {"object", kind == Kind::kChat ? "chat.completion" : "text_completion"},
                      {"created", job->created},
                      {"model", o.model_id},
                      {"choices", std::move(choices)},
                      {"usage", std::move(usage)}};
    res.set_content(out.dump(), "application/json");
    count(endpoint, 200);
    return;
  }

  // Streaming: this connection's thread waits for text and writes it; the
  // engine thread only appends to each job's pending text.
  count(endpoint, 200);
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");  // nginx: pass the stream through unbuffered
  ++open_streams;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, group, cancel, all_done, record, failure](size_t, httplib::DataSink& sink) {
        const std::shared_ptr<Job>& job = group[0];
        struct Taken {
          std::string text;
          json lp = json::array();
          bool done = false;
        };
        std::vector<Taken> taken(group.size());
        bool finished = false;
        json usage;
        {
          std::unique_lock<std::mutex> l(job->m);
          // Wake now and then to notice a client that went away.
          job->cv.wait_for(l, std::chrono::milliseconds(50), [&] {
            return std::any_of(group.begin(), group.end(),
                               [](const auto& j) { return j->done || !j->pending.empty(); });
          });
          for (size_t i = 0; i < group.size(); ++i) {
            Job& j = *group[i];
            taken[i].text.swap(j.pending);
            // A token's logprobs go with the first chunk whose text follows it.
            if (!taken[i].text.empty() || j.done) taken[i].lp.swap(j.pending_lp);
            taken[i].done = j.done;
          }
          finished = all_done();
          if (finished) record(&usage);
        }
        if (!sink.is_writable()) {
          cancel(job);
          return false;
        }
        std::string out;
        const auto e = finished ? failure() : std::nullopt;
        if (e) {
          out += sse(error_body(*e));
        } else {
          // A sample that failed is told in the request's error at the end.
          for (size_t i = 0; i < group.size(); ++i)
            if (!group[i]->finish_sent &&
                !(taken[i].done && (group[i]->finish == FinishReason::kError ||
                                    group[i]->finish == FinishReason::kCancelled)))
              out += stream_chunks(*group[i], o.model_id, std::move(taken[i].text),
                                   std::move(taken[i].lp), taken[i].done);
          if (finished && job->include_usage) {
            json u = chunk_json(*job, o.model_id, nullptr, nullptr, false);
            u["choices"] = json::array();
            u["usage"] = usage;
            out += sse(u);
          }
        }
        if (finished) out += "data: [DONE]\n\n";
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          cancel(job);
          return false;
        }
        if (finished) sink.done();
        return true;
      },
      [this, group, cancel, all_done](bool) {
        // However the response ended: a request still running is cancelled.
        bool done;
        {
          std::lock_guard<std::mutex> l(group[0]->m);
          done = all_done();
        }
        if (!done) cancel(group[0]);
        --open_streams;
      });
}

std::string Server::Impl::metrics_text() {
  std::lock_guard<std::mutex> l(metrics_m);
  std::string out;
  auto gauge = [&out](const char* name, const char* help, const char* type, int64_t v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  out +=
      "# HELP barata_http_requests_total HTTP requests answered, by path and status\n"
      "# TYPE barata_http_requests_total counter\n";
  for (const auto& [k, v] : http_requests)
    out += fmt::format("barata_http_requests_total{{path=\"{}\",status=\"{}\"}} {}\n",
                       k.first.size() > 64 ? "other" : k.first, k.second, v);
  gauge("barata_requests_finished_total", "Generation requests finished", "counter", finished);
  gauge("barata_requests_cancelled_total", "Generation requests cancelled (client gone, drain)",
        "counter", cancelled);
  gauge("barata_requests_rejected_total", "Requests refused with 429 (queue full)", "counter",
        rejected_429);
  gauge("barata_prompt_tokens_total", "Prompt tokens of admitted requests", "counter",
        prompt_tokens);
  gauge("barata_generation_tokens_total", "Tokens generated", "counter", generated_tokens);
  gauge("barata_steps_total", "Forward calls", "counter", steps);
  gauge("barata_queue_depth", "Requests waiting for a slot", "gauge", queue_depth);
  gauge("barata_slots_in_use", "Slots holding a sequence", "gauge", slots_in_use);
  gauge("barata_slots_total", "Slots", "gauge", o.slots);
  gauge("barata_http_connections", "Open client connections", "gauge",
        front ? front->connections() : 0);
  gauge("barata_kv_blocks_used", "KV blocks held by sequences", "gauge", kv_used);
  gauge("barata_kv_blocks_free", "KV blocks free (cached prefix blocks included)", "gauge",
        kv_total - kv_used);
  gauge("barata_kv_blocks_cached", "Free KV blocks that hold a cached prefix", "gauge", kv_cached);
  gauge("barata_kv_bytes_used", "KV bytes held by sequences (the cache's types)", "gauge",
        kv_used * kv_block_bytes);
  gauge("barata_kv_bytes_total", "KV pool bytes", "gauge", kv_total * kv_block_bytes);
  gauge("barata_kv_bytes_per_token", "K and V bytes of one position of every layer", "gauge",
        kv_token_bytes);
  gauge("barata_prefix_cache_hit_tokens_total", "Prompt tokens taken from the prefix cache",
        "counter", prefix_hit_tokens);
  gauge("barata_prefix_cache_lookups_total", "Prefix-cache lookups", "counter", prefix_lookups);
  gauge("barata_speculative_draft_tokens_total", "Drafted tokens verified", "counter", draft_rows);
  gauge("barata_speculative_accepted_tokens_total", "Drafted tokens kept", "counter",
        draft_accepted);
  gauge("barata_prefix_cache_hit_blocks_total", "Blocks found in the prefix cache", "counter",
        prefix_hit_blocks);
  gauge("barata_sample_forks_total",
        "Samples (n > 1) that forked the first sample's cache instead of computing the prompt",
        "counter", sample_forks);
  ttft.write(out, "barata_time_to_first_token_seconds", "Arrival to first token");
  latency.write(out, "barata_request_latency_seconds", "Arrival to last token");
  return out;
}

void Server::Impl::engine_loop() {
  SchedulerOptions so;
  so.slots = o.slots;
  so.max_batch_tokens = o.max_batch_tokens;
  so.tokenizer = tok;
  so.drafter_for = o.drafter_for;
  so.draft_max = o.draft_max;
  so.draft_min = o.draft_min;
  so.draft_auto = o.draft_auto;
  so.draft_c_prior = o.draft_c_prior;
  const Tokenizer* t = tok;
  so.is_eog = [t](int32_t id) { return t->is_eog(id); };
  const Clock::time_point zero = t0;
  so.clock = [zero] { return seconds_since(zero); };
  EngineSteps engine_steps(*engine);
  Scheduler sch(engine_steps, so);

  std::unordered_map<uint64_t, std::shared_ptr<Job>> live;  // Request::tag -> job
  uint64_t next_tag = 0;
  std::vector<int> to_forget;
  // A finished job is told so only after the metrics are published: a client
  // that reads /metrics after its reply sees its blocks given back.
  struct Ending {
    std::shared_ptr<Job> job;
    FinishReason finish;
    std::string error;
    int64_t prompt_tokens, completion_tokens;
  };
  std::vector<Ending> endings;
  auto tell_endings = [this, &endings] {
    if (!endings.empty()) {
      std::lock_guard<std::mutex> l(inbox_m);
      in_flight -= static_cast<int64_t>(endings.size());
    }
    for (Ending& e : endings) {
      {
        std::lock_guard<std::mutex> l(e.job->m);
        e.job->done = true;
        e.job->finish = e.finish;
        e.job->error = std::move(e.error);
        e.job->prompt_tokens = e.prompt_tokens;
        e.job->completion_tokens = e.completion_tokens;
      }
      e.job->cv.notify_all();
    }
    endings.clear();
  };
  sch.on_text = [&live](const Sequence& s, std::string_view text) {
    auto it = live.find(s.req.tag);
    if (it == live.end()) return;
    Job& j = *it->second;
    {
      std::lock_guard<std::mutex> l(j.m);
      j.pending.append(text);
    }
    j.cv.notify_all();
  };
  sch.on_logits = [&live](const Sequence& s, std::span<const float> logits) {
    auto it = live.find(s.req.tag);
    if (it == live.end() || it->second->top_logprobs < 0) return;
    Job& j = *it->second;
    j.lp_row.assign(logits.begin(), logits.end());
    float mx = -std::numeric_limits<float>::infinity();
    for (float x : logits) mx = std::max(mx, x);
    double sum = 0;
    for (float x : logits) sum += std::exp(static_cast<double>(x - mx));
    j.lp_lse = static_cast<double>(mx) + std::log(sum);
    j.lp_offset = s.text.size();
  };
  sch.on_token = [this, &live](const Sequence& s, int32_t token) {
    auto it = live.find(s.req.tag);
    if (it == live.end()) return;
    // The end-of-generation token is no part of the reply, nor of its logprobs.
    if (Job& j = *it->second; j.top_logprobs >= 0 && !j.lp_row.empty() && !tok->is_eog(token)) {
      auto entry = [&](int32_t id) {
        const std::string piece = tok->token_to_piece(id);
        json bytes = json::array();
        for (unsigned char b : piece) bytes.push_back(b);
        // Part of a character: its valid prefix and U+FFFD for the rest; `bytes` is exact.
        std::string text;
        for (size_t i = 0; i < piece.size();) {
          const size_t n = net::utf8_sequence(std::string_view(piece).substr(i));
          text += n ? piece.substr(i, n) : "\xEF\xBF\xBD";
          i += n ? n : 1;
        }
        return json{{"token", text},
                    {"logprob", static_cast<double>(j.lp_row[static_cast<size_t>(id)]) - j.lp_lse},
                    {"bytes", bytes}};
      };
      json e = entry(token);
      json top = json::array();
      if (j.top_logprobs > 0) {
        std::vector<int32_t> ids(j.lp_row.size());
        std::iota(ids.begin(), ids.end(), 0);
        const size_t k = std::min(ids.size(), static_cast<size_t>(j.top_logprobs));
        std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                          [&](int32_t a, int32_t b) {
                            const float x = j.lp_row[static_cast<size_t>(a)];
                            const float y = j.lp_row[static_cast<size_t>(b)];
                            return x > y || (x == y && a < b);
                          });
        for (size_t i = 0; i < k; ++i) top.push_back(entry(ids[i]));
      }
      e["top"] = top;
      e["offset"] = j.lp_offset;
      std::lock_guard<std::mutex> l(j.m);
      j.pending_lp.push_back(std::move(e));
    }
    if (s.output().size() != 1) return;
    const double t = seconds_since(it->second->t_arrival);
    {
      std::lock_guard<std::mutex> l(it->second->m);
      it->second->ttft_s = t;
    }
    std::lock_guard<std::mutex> l(metrics_m);
    ttft.observe(t);
  };
  sch.on_finish = [this, &live, &to_forget, &endings](const Sequence& s) {
    to_forget.push_back(s.id);
    auto it = live.find(s.req.tag);
    if (it == live.end()) return;
    std::shared_ptr<Job> j = it->second;
    live.erase(it);
    {
      std::lock_guard<std::mutex> l(metrics_m);
      if (s.finish == FinishReason::kCancelled) {
        ++cancelled;
      } else if (s.status == SeqStatus::kFinished) {
        ++finished;
        latency.observe(seconds_since(j->t_arrival));
        completions.push_back(seconds_since(t0));
        while (completions.size() > 32) completions.pop_front();
      }
    }
    endings.push_back({std::move(j),
                       s.status == SeqStatus::kFailed ? FinishReason::kError : s.finish, s.error,
                       s.n_prompt, static_cast<int64_t>(s.output().size())});
  };
  auto finish_unsubmitted = [this](const std::shared_ptr<Job>& j, FinishReason r) {
    {
      std::lock_guard<std::mutex> l(inbox_m);
      --in_flight;
    }
    {
      std::lock_guard<std::mutex> l(j->m);
      j->done = true;
      j->finish = r;
    }
    j->cv.notify_all();
  };

  auto publish = [&] {
    const KvBlockManager& kv = engine->blocks();
    std::lock_guard<std::mutex> l(metrics_m);
    queue_depth = sch.n_waiting();
    slots_in_use = sch.n_running();
    kv_used = kv.blocks_in_use();
    kv_total = kv.max_blocks();
    kv_cached = kv.cached_blocks();
    kv_block_bytes = engine->kv_layout().bytes_per_block();
    kv_token_bytes = engine->kv_bytes_per_token();
    const SchedulerStats& st = sch.stats();
    prefix_hit_tokens = st.prefix_hit_tokens;
    prefix_lookups = st.prefix_lookups;
    draft_rows = st.draft_rows;
    draft_accepted = st.accepted;
    prefix_hit_blocks = st.prefix_hit_blocks;
    sample_forks = st.sample_forks;
    generated_tokens = st.generated_tokens;
    steps = st.steps;
  };
  publish();
  ready = true;  // /health: ok, once the metrics hold the pool

  double drain_deadline = -1;
  bool cancelled_all = false;
  for (;;) {
    std::deque<std::shared_ptr<Job>> incoming;
    std::vector<std::shared_ptr<Job>> cancels;
    {
      std::unique_lock<std::mutex> l(inbox_m);
      if (sch.idle() && inbox.empty() && to_cancel.empty() && shutdown_req == 0)
        inbox_cv.wait_for(l, std::chrono::milliseconds(50));
      incoming.swap(inbox);
      cancels.swap(to_cancel);
    }
    const int req = shutdown_req.load();
    if (req != 0 && drain_deadline < 0) {
      drain_deadline = req == 2 ? 0 : seconds_since(t0) + o.drain_grace_s;
      spdlog::info("serve: shutting down; {} requests running or waiting, {:.0f} s to finish",
                   sch.n_running() + sch.n_waiting() + static_cast<int64_t>(incoming.size()),
                   req == 2 ? 0.0 : o.drain_grace_s);
    }
    if (req == 2 && drain_deadline != 0) drain_deadline = 0;
    for (auto& j : incoming) {
      if (j->cancelled) {
        finish_unsubmitted(j, FinishReason::kCancelled);
        for (auto& x : j->samples) finish_unsubmitted(x, FinishReason::kCancelled);
        continue;
      }
      Request r = std::move(j->req);
      r.id = j->id;
      r.arrival_s = sch.now();  // the scheduler's clock counts from t0 too
      // Sample i's tag is the first's + i (Scheduler::submit_samples).
      r.tag = j->tag = next_tag + 1;
      next_tag += static_cast<uint64_t>(j->n);
      live[r.tag] = j;  // before submit: a refused request finishes inside it
      for (auto& x : j->samples) {
        x->tag = j->tag + static_cast<uint64_t>(x->index);
        live[x->tag] = x;
      }
      {
        std::lock_guard<std::mutex> l(metrics_m);
        prompt_tokens += static_cast<int64_t>(r.prompt.size());
      }
      const std::vector<int> ids = sch.submit_samples(std::move(r), j->n);
      j->seq = ids[0];
      for (auto& x : j->samples) x->seq = ids[static_cast<size_t>(x->index)];
    }
    // A job's id may since have gone to another request: its tag says.
    auto cancel_job = [&sch](const Job& j) {
      if (j.seq >= 0 && sch.has(j.seq) && sch.sequence(j.seq).req.tag == j.tag &&
          !sch.sequence(j.seq).done())
        sch.cancel(j.seq);
    };
    for (auto& j : cancels) cancel_job(*j);
    if (drain_deadline >= 0 && !cancelled_all && seconds_since(t0) >= drain_deadline) {
      cancelled_all = true;
      std::vector<std::shared_ptr<Job>> jobs;  // cancel() finishes: on_finish erases from `live`
      for (const auto& [tag, job] : live) jobs.push_back(job);
      for (const auto& j : jobs) cancel_job(*j);
    }
    if (!sch.idle()) {
      try {
        sch.step();
      } catch (const std::exception& e) {
        // An engine failure fails every request in flight; the server goes on.
        spdlog::error("serve: a step failed: {}", e.what());
        std::vector<std::shared_ptr<Job>> jobs;
        for (const auto& [tag, job] : live) jobs.push_back(job);
        for (const auto& j : jobs) cancel_job(*j);
      }
    }
    for (int id : to_forget) sch.forget(id);
    to_forget.clear();
    publish();
    tell_endings();
    if (drain_deadline >= 0 && sch.idle()) {
      std::lock_guard<std::mutex> l(inbox_m);
      if (inbox.empty()) break;
    }
  }
  spdlog::info("serve: drained; {} requests finished, {} cancelled", finished, cancelled);
}

Server::Server(ServerOptions o) : impl_(std::make_unique<Impl>(std::move(o))) {
  if (impl_->o.slots < 1) fail("serve: --slots is {} (need at least 1)", impl_->o.slots);
  if (impl_->o.max_queue < 0) fail("serve: --max-queue is {}", impl_->o.max_queue);
}

Server::~Server() {
  if (impl_->front) impl_->front->stop();
}

int Server::listen() {
  Impl& m = *impl_;
  // A client gone mid-write must not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  m.setup_routes();
  m.port = m.front->bind(m.o.host, m.o.port, m.o.socket_send_buffer);
  m.front->start();
  return m.port;
}

void Server::serve(Engine& engine, const Tokenizer& tok) {
  Impl& m = *impl_;
  if (m.port < 0) fail("internal: Server::serve before listen");
  if (engine.blocks().blocks_in_use() != 0) fail("internal: Server::serve: the KV pool is in use");
  m.engine = &engine;
  m.tok = &tok;
  m.n_ctx = engine.n_ctx();
  // The longest prompt one request may bring: with sliding-window layers,
  // past max_tokens() (their groups keep only their windows' blocks).
  m.pool_tokens = engine.blocks().max_sequence_tokens(m.o.max_batch_tokens);
  m.engine_loop();
  // Every request is done; let the streams write their last events.
  for (int i = 0; i < 500 && m.open_streams > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.front->stop();
}

void Server::set_chat(std::shared_ptr<const ChatFormatter> chat, std::string default_system) {
  if (impl_->ready) fail("internal: Server::set_chat after serve");
  impl_->o.chat = std::move(chat);
  impl_->o.default_system = std::move(default_system);
}

void Server::set_drafter(std::function<std::unique_ptr<Drafter>(const Request&)> drafter_for,
                         int draft_max, int draft_min, bool draft_auto, double draft_c_prior) {
  if (impl_->ready) fail("internal: Server::set_drafter after serve");
  impl_->o.drafter_for = std::move(drafter_for);
  impl_->o.draft_max = draft_max;
  impl_->o.draft_min = draft_min;
  impl_->o.draft_auto = draft_auto;
  impl_->o.draft_c_prior = draft_c_prior;
}

void Server::shutdown() {
  // New requests are refused from now on, not from the next step's end.
  impl_->accepting = false;
  int expected = 0;
  impl_->shutdown_req.compare_exchange_strong(expected, 1);
}

void Server::shutdown_now() {
  impl_->accepting = false;
  impl_->shutdown_req = 2;
}

}  // namespace barata
