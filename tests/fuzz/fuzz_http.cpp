// libFuzzer target for barata serve's request path without a model: the
// bytes of one HTTP request are framed (net::frame_request: the request line,
// header fields, Content-Length or chunked body, every limit), then the body
// is read as JSON (openai::parse_body: NUL, nesting and UTF-8 checks) and
// validated by the model-free field checks (messages, stop), and whatever is
// refused becomes the JSON error body a client would get. Nothing may crash,
// throw anything but the ApiError of a refusal, or produce an error body that
// is not valid UTF-8 JSON. Each message's text is also read as a reply in
// every tool-call syntax (the calls found must be JSON text with a name; the
// streamable prefix within the text), and "tools" become the grammar of a
// call, which must parse wherever the schema converter accepts the tools.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/grammar.h"
#include "server/http_front.h"
#include "server/openai_request.h"
#include "barata/file_io.h"
#include "server/safe_text.h"
#include "server/tool_calls.h"

namespace {

// A message's text as a model's reply, in each syntax.
void check_tool_reply(std::string_view text) {
  using barata::openai::ToolSyntax;
  for (ToolSyntax s : {ToolSyntax::kHermes, ToolSyntax::kLlama3, ToolSyntax::kMistral}) {
    if (barata::openai::tool_text_prefix(s, text) > text.size()) std::abort();
    const auto r = barata::openai::parse_tool_calls(s, text, "c");
    for (const auto& c : r.calls) {
      if (!c.at("function").at("name").is_string()) std::abort();
      (void)nlohmann::json::parse(c["function"].at("arguments").get<std::string>());
    }
  }
}

void check_error_body(const std::string& body) {
  if (!barata::net::valid_utf8(body)) std::abort();
  const auto j = nlohmann::json::parse(body);  // throws (and so fails) when not JSON
  if (!j.at("error").at("message").is_string()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barata;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  net::FrontOptions o;
  o.max_body_bytes = 4096;
  o.max_head_bytes = 2048;
  o.max_target_bytes = 512;
  const net::Framing f = net::frame_request(bytes, o);
  if (f.state == net::Framing::kReject) {
    if (f.status < 400 || f.status > 599) std::abort();
    check_error_body(net::error_json(f.status, f.message, ""));
    return 0;
  }
  if (f.state != net::Framing::kComplete) return 0;
  if (f.size > size || f.head_size > f.size) std::abort();
  // The body as the router would see it (a chunked one is fed whole: the
  // JSON checks are what is exercised).
  const std::string body(bytes.substr(f.head_size, f.size - f.head_size));
  try {
    const auto j = openai::parse_body(body);
    if (j.is_object()) {
      openai::check_known(j, {"messages", "stop", "max_tokens", "temperature", "n", "tools"});
      openai::parse_stop(j);
      if (j.contains("messages"))
        for (const ChatMessage& m : openai::parse_messages(j)) check_tool_reply(m.content);
      const auto& tools = openai::field(j, "tools");
      if (tools.is_array() && !tools.empty() && tools.size() <= 4) {
        bool shaped = true;
        for (const auto& t : tools)
          shaped =
              shaped && t.is_object() && t.contains("function") && t["function"].is_object() &&
              t["function"].contains("name") && t["function"]["name"].is_string() &&
              (!t["function"].contains("parameters") || t["function"]["parameters"].is_object());
        if (shaped) {
          std::string gbnf;
          try {
            gbnf = openai::tool_call_gbnf(openai::ToolSyntax::kHermes,
                                          nlohmann::ordered_json::parse(tools.dump()), nullptr);
          } catch (const Error&) {  // a schema keyword the converter refuses
          }
          if (!gbnf.empty()) (void)Grammar::parse(gbnf);  // throws (and so fails) when invalid
        }
      }
      openai::integer_in(j, "max_tokens", 1, 1 << 20);
      openai::number_in(j, "temperature", 0, 2);
      openai::integer_in(j, "n", 1, 16);
    }
  } catch (const openai::ApiError& e) {
    check_error_body(
        openai::error_body(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict));
  }
  return 0;
}
