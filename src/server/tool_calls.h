// Tool calls in barata serve's chat: which syntax a template's model writes
// its calls in, the calls read back out of a reply into OpenAI's `tool_calls`,
// how much of a streamed reply is surely not a call, and the grammar that
// forces a call (tool_choice "required" or a named function). Internal to
// barata_server. The syntaxes are facts of the model families' templates:
//  - Hermes (Qwen2.5, Qwen3, Hermes, SmolLM3): <tool_call>\n{"name": ...,
//    "arguments": {...}}\n</tool_call>, one block per call;
//  - Llama 3.x: a bare JSON object {"name": ..., "parameters": {...}},
//    optionally after <|python_tag|>;
//  - Mistral: [TOOL_CALLS] then a JSON array of {"name", "arguments"}.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace barata {
class ChatFormatter;
}

namespace barata::openai {

enum class ToolSyntax { kHermes, kLlama3, kMistral };

const char* tool_syntax_name(ToolSyntax s);
// The syntax a Jinja template's model uses, from its markers; nullopt when
// it shows none (or the format is a hand-written one).
std::optional<ToolSyntax> tool_syntax_of(const ChatFormatter& f);

struct ToolReply {
  std::string content;                             // the text outside the calls
  nlohmann::json calls = nlohmann::json::array();  // OpenAI's tool_calls
};
// The calls in a whole reply; a call that is not valid JSON with a name stays
// text. Each call's id is id_prefix + its index.
ToolReply parse_tool_calls(ToolSyntax s, std::string_view text, std::string_view id_prefix);

// How many bytes of the reply so far can be streamed as content: the text
// before anything that is, or may become, a call.
size_t tool_text_prefix(ToolSyntax s, std::string_view text);

// A GBNF grammar that admits exactly one call of one of `tools` (OpenAI's
// array, already checked; ordered: properties are written in their order) whose arguments follow
// the function's parameter schema; only `name` when given. Throws barata::Error naming the schema
// keyword it cannot express.
std::string tool_call_gbnf(ToolSyntax s, const nlohmann::ordered_json& tools,
                           const std::string* name);

}  // namespace barata::openai
