#include "reply.h"

namespace barata::openai {

// Another sample of the same request: the same fields, its own results.
std::shared_ptr<Job> another_sample(const Job& j, int index) {
  auto s = std::make_shared<Job>(j.sig);
  s->kind = j.kind;
  s->index = index;
  s->req = j.req;
  s->stream = j.stream;
  s->include_usage = j.include_usage;
  s->id = j.id;
  s->created = j.created;
  s->t_arrival = j.t_arrival;
  s->tools = j.tools;
  s->parallel_tool_calls = j.parallel_tool_calls;
  s->top_logprobs = j.top_logprobs;
  return s;
}

// The logprobs object of a reply or chunk holding these entries.
json logprobs_json(Kind kind, const json& entries) {
  if (kind == Kind::kChat) {
    json content = json::array();
    for (const json& e : entries)
      content.push_back({{"token", e["token"]},
                         {"logprob", e["logprob"]},
                         {"bytes", e["bytes"]},
                         {"top_logprobs", e["top"]}});
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const json& e : entries) {
    tokens.push_back(e["token"]);
    lps.push_back(e["logprob"]);
    json t = json::object();
    for (const json& a : e["top"]) t[a["token"].get<std::string>()] = a["logprob"];
    tops.push_back(t);
    offs.push_back(e["offset"]);
  }
  return {
      {"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

// The ids of a reply's tool calls: "call_" + the reply's number + "_" + the index.
std::string call_id_prefix(const Job& j) {
  return "call_" + j.id.substr(j.id.rfind('-') + 1) + "_";
}

json chunk_json(const Job& j, const std::string& model, const std::string* text, const char* finish,
                bool first) {
  json choice = {{"index", j.index}};
  if (j.kind == Kind::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (text) delta["content"] = *text;
    choice["delta"] = delta;
    choice["logprobs"] = nullptr;
  } else {
    choice["text"] = text ? *text : std::string();
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish ? json(finish) : json(nullptr);
  return {{"id", j.id},
          {"object", j.kind == Kind::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", j.created},
          {"model", model},
          {"choices", json::array({choice})}};
}

std::string sse(const json& j) {
  return "data: " + j.dump() + "\n\n";
}

// A finished job's choice in a whole reply.
json choice_json(const Job& j) {
  json choice = {
      {"index", j.index}, {"finish_reason", openai_finish_reason(j.finish)}, {"logprobs", nullptr}};
  if (j.top_logprobs >= 0) choice["logprobs"] = logprobs_json(j.kind, j.pending_lp);
  if (j.kind != Kind::kChat) {
    choice["text"] = j.pending;
    return choice;
  }
  choice["message"] = {{"role", "assistant"}, {"content", j.pending}};
  if (j.tools) {
    ToolReply r = parse_tool_calls(*j.tools, j.pending, call_id_prefix(j));
    if (!j.parallel_tool_calls && r.calls.size() > 1)
      r.calls.erase(r.calls.begin() + 1, r.calls.end());
    if (!r.calls.empty()) {
      choice["message"]["content"] = r.content.empty() ? json(nullptr) : json(r.content);
      choice["message"]["tool_calls"] = std::move(r.calls);
      if (j.finish != FinishReason::kLength && j.finish != FinishReason::kContext)
        choice["finish_reason"] = "tool_calls";
    }
  }
  return choice;
}

// A stream's events for what one job produced since the last call: its text
// and logprobs; once it is done, its tool calls and its finish_reason.
// Writer thread only (it keeps the job's stream state).
std::string stream_chunks(Job& j, const std::string& model, std::string text, json lp, bool done) {
  // Tools: text that is or may become a call waits; at the end the calls go
  // out as OpenAI streams them, each whole in one delta.
  json calls;
  if (j.tools) {
    j.tool_held += text;
    text.clear();
    if (!done) {
      const size_t safe = std::max(j.tool_sent, tool_text_prefix(*j.tools, j.tool_held));
      text = j.tool_held.substr(j.tool_sent, safe - j.tool_sent);
      j.tool_sent = safe;
    } else {
      ToolReply r = parse_tool_calls(*j.tools, j.tool_held, call_id_prefix(j));
      if (r.calls.empty()) {
        text = j.tool_held.substr(j.tool_sent);
      } else {
        // The content not yet sent: what follows the text before the call.
        std::string_view before = std::string_view(j.tool_held).substr(0, j.tool_sent);
        while (!before.empty() && std::isspace(static_cast<unsigned char>(before.front())))
          before.remove_prefix(1);
        if (r.content.starts_with(before)) text = r.content.substr(before.size());
        if (!j.parallel_tool_calls && r.calls.size() > 1)
          r.calls.erase(r.calls.begin() + 1, r.calls.end());
        calls = std::move(r.calls);
        for (size_t i = 0; i < calls.size(); ++i) calls[i]["index"] = i;
      }
      j.tool_sent = j.tool_held.size();
    }
  }
  std::string out;
  if (!j.role_sent || !text.empty() || !lp.empty()) {
    json c = chunk_json(j, model, &text, nullptr, !j.role_sent);
    if (j.top_logprobs >= 0 && !lp.empty()) c["choices"][0]["logprobs"] = logprobs_json(j.kind, lp);
    out += sse(c);
    j.role_sent = true;
  }
  if (!done) return out;
  const char* finish = openai_finish_reason(j.finish);
  if (!calls.is_null()) {
    json c = chunk_json(j, model, nullptr, nullptr, false);
    c["choices"][0]["delta"]["tool_calls"] = calls;
    out += sse(c);
    if (j.finish != FinishReason::kLength && j.finish != FinishReason::kContext)
      finish = "tool_calls";
  }
  out += sse(chunk_json(j, model, nullptr, finish, false));
  j.finish_sent = true;
  return out;
}

}  // namespace barata::openai
