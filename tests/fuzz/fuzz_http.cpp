// libFuzzer target for barata serve's request path without a model: the
// bytes of one HTTP request are framed (net::frame_request: the request line,
// header fields, Content-Length or chunked body, every limit), then the body
// is read as JSON (openai::parse_body: NUL, nesting and UTF-8 checks) and
// validated by the model-free field checks (messages, stop), and whatever is
// refused becomes the JSON error body a client would get. Nothing may crash,
// throw anything but the ApiError of a refusal, or produce an error body that
// is not valid UTF-8 JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/http_front.h"
#include "server/openai_request.h"
#include "barata/file_io.h"
#include "server/safe_text.h"

namespace {

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
      openai::check_known(j, {"messages", "stop", "max_tokens", "temperature", "n"});
      openai::parse_stop(j);
      if (j.contains("messages")) openai::parse_messages(j);
      openai::integer_in(j, "max_tokens", 1, 1 << 20);
      openai::number_in(j, "temperature", 0, 2);
      openai::only_default(j, "n", 1);
    }
  } catch (const openai::ApiError& e) {
    check_error_body(
        openai::error_body(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict));
  }
  return 0;
}
