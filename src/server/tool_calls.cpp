#include "tool_calls.h"

#include <fmt/core.h>

#include "barata/chat_template.h"
#include "barata/grammar.h"

namespace barata::openai {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>", kMistralOpen = "[TOOL_CALLS]";

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// One call from {"name": ..., "arguments"|"parameters": {...}}; null when it
// is not one.
json call_of(const json& j, std::string_view id_prefix, size_t index) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return nullptr;
  json args = json::object();
  if (j.contains("arguments"))
    args = j["arguments"];
  else if (j.contains("parameters"))
    args = j["parameters"];
  // OpenAI's arguments are JSON text; a model that wrote them as a string
  // already wrote that text.
  const std::string text = args.is_string() ? args.get<std::string>() : args.dump();
  return {{"id", fmt::format("{}{}", id_prefix, index)},
          {"type", "function"},
          {"function", {{"name", j["name"]}, {"arguments", text}}}};
}

json parse_or_null(std::string_view s) {
  return json::parse(s.begin(), s.end(), nullptr, false);
}

// The longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace

const char* tool_syntax_name(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::kHermes:
      return "hermes";
    case ToolSyntax::kLlama3:
      return "llama3";
    case ToolSyntax::kMistral:
      return "mistral";
  }
  return "?";
}

std::optional<ToolSyntax> tool_syntax_of(const ChatFormatter& f) {
  const std::string& src = f.source();
  if (!f.is_jinja()) return std::nullopt;
  if (src.find(kHermesOpen) != std::string::npos) return ToolSyntax::kHermes;
  if (src.find(kMistralOpen) != std::string::npos) return ToolSyntax::kMistral;
  if (src.find("<|start_header_id|>") != std::string::npos &&
      (src.find(kPythonTag) != std::string::npos || src.find("tools") != std::string::npos))
    return ToolSyntax::kLlama3;
  return std::nullopt;
}

ToolReply parse_tool_calls(ToolSyntax s, std::string_view text, std::string_view id_prefix) {
  ToolReply r;
  switch (s) {
    case ToolSyntax::kHermes: {
      size_t at = 0;
      while (at < text.size()) {
        const size_t open = text.find(kHermesOpen, at);
        if (open == std::string_view::npos) {
          r.content += text.substr(at);
          break;
        }
        const size_t body = open + kHermesOpen.size();
        size_t close = text.find(kHermesClose, body);
        const size_t end =
            close == std::string_view::npos ? text.size() : close + kHermesClose.size();
        if (close == std::string_view::npos) close = text.size();
        json c = call_of(parse_or_null(trim(text.substr(body, close - body))), id_prefix,
                         r.calls.size());
        if (c.is_null())
          r.content += text.substr(at, end - at);
        else {
          r.content += text.substr(at, open - at);
          r.calls.push_back(std::move(c));
        }
        at = end;
      }
      break;
    }
    case ToolSyntax::kLlama3: {
      std::string_view t = trim(text);
      if (t.starts_with(kPythonTag)) t = trim(t.substr(kPythonTag.size()));
      json c = t.starts_with("{") ? call_of(parse_or_null(t), id_prefix, 0) : json(nullptr);
      if (!c.is_null()) r.calls.push_back(std::move(c));
      break;
    }
    case ToolSyntax::kMistral: {
      const size_t open = text.find(kMistralOpen);
      const json arr = open == std::string_view::npos
                           ? json(nullptr)
                           : parse_or_null(trim(text.substr(open + kMistralOpen.size())));
      json calls = json::array();
      if (arr.is_array())
        for (const json& j : arr) {
          json c = call_of(j, id_prefix, calls.size());
          if (c.is_null()) {
            calls = nullptr;
            break;
          }
          calls.push_back(std::move(c));
        }
      if (arr.is_array() && !calls.is_null() && !calls.empty()) {
        r.content = std::string(text.substr(0, open));
        r.calls = std::move(calls);
      }
      break;
    }
  }
  // No call: the whole reply is text, as written; else the text around the calls.
  r.content = r.calls.empty() ? std::string(text) : std::string(trim(r.content));
  return r;
}

size_t tool_text_prefix(ToolSyntax s, std::string_view text) {
  switch (s) {
    case ToolSyntax::kHermes: {
      const size_t open = text.find(kHermesOpen);
      if (open != std::string_view::npos) return open;
      return text.size() - partial_marker(text, kHermesOpen);
    }
    case ToolSyntax::kMistral: {
      const size_t open = text.find(kMistralOpen);
      if (open != std::string_view::npos) return open;
      return text.size() - partial_marker(text, kMistralOpen);
    }
    case ToolSyntax::kLlama3: {
      // A call is the whole reply: hold a reply that opens like one.
      const std::string_view t = trim(text);
      if (t.empty() || t.starts_with("{") || t.starts_with(kPythonTag) || kPythonTag.starts_with(t))
        return 0;
      return text.size();
    }
  }
  return text.size();
}

std::string tool_call_gbnf(ToolSyntax s, const ojson& tools, const std::string* name) {
  // One object per allowed function: {"name": const, "arguments": its schema}.
  const char* args_key = s == ToolSyntax::kLlama3 ? "parameters" : "arguments";
  ojson any = ojson::array();
  for (const ojson& t : tools) {
    const ojson& f = t.at("function");
    const std::string fn = f.at("name").get<std::string>();
    if (name && fn != *name) continue;
    ojson params = f.contains("parameters") && !f["parameters"].is_null()
                       ? f["parameters"]
                       : ojson{{"type", "object"}};
    ojson props = ojson::object();
    props["name"] = {{"const", fn}};
    props[args_key] = std::move(params);
    any.push_back({{"type", "object"},
                   {"properties", std::move(props)},
                   {"required", {"name", args_key}},
                   {"additionalProperties", false}});
  }
  ojson schema = any.size() == 1 ? any[0] : ojson{{"anyOf", any}};
  std::string call = json_schema_to_gbnf(schema);
  // The converter's start rule becomes the call's; the syntax wraps it.
  call.replace(0, std::string_view("root ::= ").size(), "tool-call ::= ");
  switch (s) {
    case ToolSyntax::kHermes:
      return "root ::= \"<tool_call>\\n\" tool-call \"\\n</tool_call>\"\n" + call;
    case ToolSyntax::kLlama3:
      return "root ::= tool-call\n" + call;
    case ToolSyntax::kMistral:
      return "root ::= \"[TOOL_CALLS][\" tool-call \"]\"\n" + call;
  }
  return call;
}

}  // namespace barata::openai
