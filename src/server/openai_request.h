// barata serve's request side: OpenAI's error shape and the checks that
// read a request body's fields (src/server/server.cpp). Internal to
// barata_server.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "barata/chat_template.h"

namespace barata::openai {

using nlohmann::json;

// An error reply: HTTP status and OpenAI's {"error": {...}} fields.
struct ApiError {
  int status;
  std::string message, type, param, code;
};
json error_body(const ApiError& e);
// Throws a 400 invalid_request_error.
[[noreturn]] void bad_request(std::string message, std::string param = "", std::string code = "");

// A request body as JSON, or bad_request naming what is wrong with it: a NUL
// byte, nesting deeper than 64 (measured by a flat scan before parsing, so no
// recursion depends on the client), invalid JSON or UTF-8.
json parse_body(const std::string& text);

// A field of `body`, null when absent.
const json& field(const json& body, const char* name);
// Typed fields, nullopt when absent or null; a wrong type or a value out of
// [lo, hi] is a bad_request naming the field.
std::optional<double> number_in(const json& body, const char* name, double lo, double hi);
std::optional<int64_t> integer_in(const json& body, const char* name, int64_t lo, int64_t hi);
bool boolean(const json& body, const char* name, bool dflt);
// A field OpenAI defines that barata accepts only at its default (or null).
void only_default(const json& body, const char* name, const json& dflt);
// Every key of `body` is in `known`, else OpenAI's "Unrecognized request argument".
void check_known(const json& body, const std::vector<std::string>& known);
// "stop": a string or up to 4, none empty.
std::vector<std::string> parse_stop(const json& body);
// "messages": roles system/developer/user/assistant, content a string or text parts.
std::vector<ChatMessage> parse_messages(const json& body);

}  // namespace barata::openai
