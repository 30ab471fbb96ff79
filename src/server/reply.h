// barata serve's requests between its threads (one Job per sample: the HTTP
// thread fills it, the engine thread appends its text, a stream's writer
// takes it) and the replies made of them, in OpenAI's shapes: a whole
// choice, and a stream's chunks. Internal to barata_server.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "barata/sequence.h"
#include "tool_calls.h"

namespace barata::openai {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

enum class Kind { kChat, kCompletion };

// The lock and wake-up of a request's jobs: one per request, shared by its n
// samples, so that a stream's writer waits for any of them.
struct Signal {
  std::mutex m;
  std::condition_variable cv;
};

struct Job {
  explicit Job(std::shared_ptr<Signal> s = std::make_shared<Signal>())
      : sig(std::move(s)), m(sig->m), cv(sig->cv) {}
  std::shared_ptr<Signal> sig;
  std::mutex& m;
  std::condition_variable& cv;

  // Set by the HTTP thread before it is queued.
  Kind kind = Kind::kChat;
  int index = 0;  // its choice among the request's n samples
  int n = 1;      // the request's samples
  // On the first of n > 1 samples: the others (submitted with it).
  std::vector<std::shared_ptr<Job>> samples;
  Request req;
  bool stream = false, include_usage = false;
  std::string id;  // "chatcmpl-N" / "cmpl-N"
  // Tool calls are read from the reply in this syntax (tools given and
  // tool_choice not "none"); a stream holds back text that may be a call.
  std::optional<ToolSyntax> tools;
  bool parallel_tool_calls = true;
  int64_t created = 0;
  Clock::time_point t_arrival;

  // Between the threads (under m).
  std::string pending;  // text not yet taken by the writer
  // logprobs: one entry per generated token, in the reply's shape (chat:
  // {token, logprob, bytes, top_logprobs}; completions: {token, logprob,
  // top: {token: logprob}}); a stream takes them with the text.
  json pending_lp = json::array();
  int top_logprobs = -1;      // -1: no logprobs; else how many alternatives per token
  std::vector<float> lp_row;  // engine thread: the raw logits of the token being sampled
  double lp_lse = 0;
  size_t lp_offset = 0;  // the text's length before that token
  bool done = false;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  double ttft_s = -1;  // arrival to the first token
  std::atomic<bool> cancelled{false};
  int seq = -1;      // the scheduler's id (engine thread only)
  uint64_t tag = 0;  // its Request::tag: ids are reused, tags never (engine thread only)

  // A stream's writer thread only: the role went out; with tools, the reply
  // so far and how much of it went out as content.
  bool role_sent = false, finish_sent = false;
  std::string tool_held;
  size_t tool_sent = 0;
};

// Another sample of the same request: the same fields, its own results.
std::shared_ptr<Job> another_sample(const Job& j, int index);

// The logprobs object of a reply or chunk holding these entries.
json logprobs_json(Kind kind, const json& entries);
// The ids of a reply's tool calls: "call_" + the reply's number + "_" + the index.
std::string call_id_prefix(const Job& j);
// One chunk of a stream: the role on the first, text, or the finish_reason.
json chunk_json(const Job& j, const std::string& model, const std::string* text, const char* finish,
                bool first);
// A Server-Sent Event.
std::string sse(const json& j);
// A finished job's choice in a whole reply (tool calls parsed).
json choice_json(const Job& j);
// A stream's events for what one job produced since the last call: its text
// and logprobs; once it is done, its tool calls and its finish_reason.
// Writer thread only (it keeps the job's stream state).
std::string stream_chunks(Job& j, const std::string& model, std::string text, json lp, bool done);

}  // namespace barata::openai
