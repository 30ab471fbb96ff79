// barata serve's request parsing (openai_request.h).
#include "openai_request.h"

#include <algorithm>
#include <utility>

#include <fmt/core.h>

#include "barata/file_io.h"
#include "safe_text.h"

namespace barata::openai {

json error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return {{"error", err}};
}

[[noreturn]] void bad_request(std::string message, std::string param, std::string code) {
  throw ApiError{400, std::move(message), "invalid_request_error", std::move(param),
                 std::move(code)};
}

// The request body as JSON, or a 400 naming what is wrong with it. No
// recursion depends on the client: the nesting is measured by a flat scan
// first, and a body nested deeper than kMaxJsonDepth is refused unparsed.
json parse_body(const std::string& text) {
  constexpr size_t kMaxJsonDepth = 64;
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    bad_request(fmt::format("the body holds a NUL byte at offset {}", nul));
  if (net::json_depth(text, kMaxJsonDepth) > kMaxJsonDepth)
    bad_request(
        fmt::format("the body nests arrays and objects deeper than {} levels", kMaxJsonDepth));
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 8e888
    bad_request(fmt::format("the body is not valid JSON: {}", printable(e.what())));
  }
}

const json& field(const json& body, const char* name) {
  static const json kNull;
  auto it = body.find(name);
  return it == body.end() ? kNull : *it;
}

std::optional<double> number_in(const json& body, const char* name, double lo, double hi) {
  const json& v = field(body, name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number()) bad_request(fmt::format("'{}' must be a number", name), name);
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    bad_request(fmt::format("'{}' is {}, outside [{}, {}]", name, x, lo, hi), name);
  return x;
}

std::optional<int64_t> integer_in(const json& body, const char* name, int64_t lo, int64_t hi) {
  const json& v = field(body, name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) bad_request(fmt::format("'{}' must be an integer", name), name);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    bad_request(fmt::format("'{}' is {}, above {}", name, v.get<uint64_t>(), hi), name);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad_request(fmt::format("'{}' is {}, outside [{}, {}]", name, x, lo, hi), name);
  return x;
}

bool boolean(const json& body, const char* name, bool dflt) {
  const json& v = field(body, name);
  if (v.is_null()) return dflt;
  if (!v.is_boolean()) bad_request(fmt::format("'{}' must be a boolean", name), name);
  return v.get<bool>();
}

// Fields OpenAI defines that barata accepts only at their default (or null).
void only_default(const json& body, const char* name, const json& dflt) {
  const json& v = field(body, name);
  if (!v.is_null() && v != dflt)
    bad_request(fmt::format("'{}' = {} is not supported (only {})", name,
                            printable(v.dump(-1, ' ', false, json::error_handler_t::replace), 80),
                            dflt.dump()),
                name);
}

void check_known(const json& body, const std::vector<std::string>& known) {
  for (auto it = body.begin(); it != body.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      bad_request(
          fmt::format("Unrecognized request argument supplied: {}", printable(it.key(), 80)),
          printable(it.key(), 80));
}

std::vector<std::string> parse_stop(const json& body) {
  const json& v = field(body, "stop");
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > 4) bad_request("'stop' holds at most 4 strings", "stop");
    for (const json& s : v) {
      if (!s.is_string()) bad_request("'stop' must be a string or an array of strings", "stop");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad_request("'stop' must be a string or an array of strings", "stop");
  }
  for (const std::string& s : out)
    if (s.empty()) bad_request("'stop' strings must not be empty", "stop");
  return out;
}

namespace {

// A message's content: a string, or an array of {"type":"text","text":...} parts.
std::string message_content(const json& c, size_t i) {
  const std::string param = fmt::format("messages[{}].content", i);
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string out;
    for (const json& part : c) {
      if (!part.is_object() || field(part, "type") != "text" || !field(part, "text").is_string())
        bad_request(fmt::format("{}: only text parts are supported", param), param);
      out += part["text"].get<std::string>();
    }
    return out;
  }
  bad_request(fmt::format("{} must be a string or an array of text parts", param), param);
}

}  // namespace

std::vector<ChatMessage> parse_messages(const json& body) {
  const json& v = field(body, "messages");
  if (!v.is_array()) bad_request("'messages' must be an array", "messages");
  if (v.empty()) bad_request("'messages' must not be empty", "messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& m = v[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_request(fmt::format("{} must be an object", param), param);
    const json& role = field(m, "role");
    if (!role.is_string()) bad_request(fmt::format("{}.role must be a string", param), param);
    std::string r = role.get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      bad_request(fmt::format("{}.role '{}' is not one of system, developer, user, assistant, tool",
                              param, printable(r, 40)),
                  param + ".role");
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string& k = it.key();
      const bool ok = k == "role" || k == "content" || k == "name" ||
                      (r == "assistant" && (k == "tool_calls" || k == "refusal")) ||
                      (r == "tool" && k == "tool_call_id");
      if (!ok)
        bad_request(fmt::format("{}: unsupported field '{}'", param, printable(k, 80)),
                    param + "." + printable(k, 80));
    }
    ChatMessage msg{r, ""};
    const json& calls = field(m, "tool_calls");
    if (!calls.is_null()) {
      const std::string p = param + ".tool_calls";
      if (!calls.is_array()) bad_request(fmt::format("{} must be an array", p), p);
      for (const json& c : calls) {
        const json& f = c.is_object() ? field(c, "function") : c;
        if (!f.is_object() || !field(f, "name").is_string() || !field(f, "arguments").is_string())
          bad_request(fmt::format("{}: each call must be {{\"type\": \"function\", \"function\": "
                                  "{{\"name\": string, \"arguments\": string}}}}",
                                  p),
                      p);
      }
      msg.tool_calls = calls.dump();
    }
    // An assistant message that only calls tools has null content.
    const json& content = field(m, "content");
    if (!(content.is_null() && !msg.tool_calls.empty())) msg.content = message_content(content, i);
    if (r == "tool") {
      const json& id = field(m, "tool_call_id");
      if (!id.is_string())
        bad_request(fmt::format("{}.tool_call_id must be a string", param),
                    param + ".tool_call_id");
      msg.tool_call_id = id.get<std::string>();
    }
    const json& name = field(m, "name");
    if (r == "tool" && name.is_string()) msg.name = name.get<std::string>();
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace barata::openai
