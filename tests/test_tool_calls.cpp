// barata serve's tool calls (src/server/tool_calls.cpp): each family's reply
// syntax read into OpenAI's tool_calls, the streamed text held back where a
// call may begin, and the grammar that forces one call of the named tools.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/chat_template.h"
#include "barata/error.h"
#include "barata/grammar.h"
#include "server/tool_calls.h"

namespace barata::openai {
namespace {

using nlohmann::json;

TEST(ToolCalls, HermesBlocksBecomeCalls) {
  const ToolReply r = parse_tool_calls(
      ToolSyntax::kHermes,
      "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\", "
      "\"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n"
      "</tool_call>",
      "call_7_");
  EXPECT_EQ(r.content, "Let me look.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0]["id"], "call_7_0");
  EXPECT_EQ(r.calls[0]["type"], "function");
  EXPECT_EQ(r.calls[0]["function"]["name"], "weather");
  EXPECT_EQ(json::parse(r.calls[0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Oslo"}, {"days", 2}}));
  EXPECT_EQ(r.calls[1]["id"], "call_7_1");
  EXPECT_EQ(r.calls[1]["function"]["arguments"], "{}");
  // A block cut off by max_tokens after a whole object still counts; one
  // that is not JSON with a name stays text.
  EXPECT_EQ(parse_tool_calls(ToolSyntax::kHermes,
                             "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}", "c")
                .calls.size(),
            1u);
  const ToolReply bad =
      parse_tool_calls(ToolSyntax::kHermes, "Hi <tool_call>{oops}</tool_call>", "c");
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "Hi <tool_call>{oops}</tool_call>");
  EXPECT_TRUE(parse_tool_calls(ToolSyntax::kHermes, "plain text", "c").calls.empty());
}

TEST(ToolCalls, Llama3AndMistral) {
  ToolReply r = parse_tool_calls(ToolSyntax::kLlama3,
                                 " {\"name\": \"f\", \"parameters\": {\"x\": \"y\"}}", "c_");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0]["function"]["arguments"], "{\"x\":\"y\"}");
  EXPECT_EQ(r.content, "");
  r = parse_tool_calls(ToolSyntax::kLlama3, "<|python_tag|>{\"name\": \"g\", \"arguments\": {}}",
                       "c_");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0]["function"]["name"], "g");
  EXPECT_TRUE(parse_tool_calls(ToolSyntax::kLlama3, "{\"a\": 1}", "c").calls.empty());
  EXPECT_TRUE(parse_tool_calls(ToolSyntax::kLlama3, "Sure: {\"name\": \"f\"}", "c").calls.empty());

  r = parse_tool_calls(ToolSyntax::kMistral,
                       "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"n\": 1}}, {\"name\": "
                       "\"b\", \"arguments\": \"{}\"}]",
                       "c_");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0]["function"]["arguments"], "{\"n\":1}");
  EXPECT_EQ(r.calls[1]["function"]["arguments"], "{}");  // a string is kept as written
  EXPECT_TRUE(parse_tool_calls(ToolSyntax::kMistral, "[TOOL_CALLS] nope", "c").calls.empty());
}

TEST(ToolCalls, StreamedTextStopsWhereACallMayBegin) {
  EXPECT_EQ(tool_text_prefix(ToolSyntax::kHermes, "Hello"), 5u);
  EXPECT_EQ(tool_text_prefix(ToolSyntax::kHermes, "Hello <tool"), 6u);
  EXPECT_EQ(tool_text_prefix(ToolSyntax::kHermes, "Hello <tool_call>\n{\"na"), 6u);
  EXPECT_EQ(tool_text_prefix(ToolSyntax::kHermes, "a < b"), 5u);
  EXPECT_EQ(tool_text_prefix(ToolSyntax::kMistral, "x [TOOL"), 2u);
  EXPECT_EQ(tool_text_prefix(ToolSyntax::kLlama3, " {\"name\""), 0u);
  EXPECT_EQ(tool_text_prefix(ToolSyntax::kLlama3, "<|py"), 0u);
  EXPECT_EQ(tool_text_prefix(ToolSyntax::kLlama3, "Paris is"), 8u);
}

TEST(ToolCalls, TheGrammarAdmitsOneCallOfTheNamedTools) {
  const auto tools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "weather", "parameters": {
      "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "time"}}])");
  const GrammarIndex any(Grammar::parse(tool_call_gbnf(ToolSyntax::kHermes, tools, nullptr)),
                         nullptr);
  EXPECT_TRUE(any.matches(
      "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));
  EXPECT_TRUE(any.matches("<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(any.matches(
      "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"days\": 1}}\n</tool_call>"));
  EXPECT_FALSE(any.matches("<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(any.matches("Sure!"));
  // Each parse of an accepted call gives the call back.
  const ToolReply r = parse_tool_calls(
      ToolSyntax::kHermes,
      "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
      "c");
  ASSERT_EQ(r.calls.size(), 1u);

  const std::string name = "time";
  const GrammarIndex one(Grammar::parse(tool_call_gbnf(ToolSyntax::kHermes, tools, &name)),
                         nullptr);
  EXPECT_TRUE(one.matches("<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(one.matches(
      "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"));

  const GrammarIndex llama(Grammar::parse(tool_call_gbnf(ToolSyntax::kLlama3, tools, &name)),
                           nullptr);
  EXPECT_TRUE(llama.matches("{\"name\": \"time\", \"parameters\": {}}"));
  // A parameter schema the converter cannot express: its keyword, named.
  const auto odd = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}])");
  try {
    (void)tool_call_gbnf(ToolSyntax::kHermes, odd, nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not"), std::string::npos) << e.what();
  }
}

TEST(ToolCalls, SyntaxFromTheTemplate) {
  auto syntax = [](const char* src) {
    return tool_syntax_of(ChatFormatter::from_jinja(src, "", "", false));
  };
  EXPECT_EQ(syntax("{{ '<|im_start|>' }}{% if tools %}<tool_call>{% endif %}"),
            ToolSyntax::kHermes);
  EXPECT_EQ(syntax("[INST]{% if tools %}[TOOL_CALLS]{% endif %}"), ToolSyntax::kMistral);
  EXPECT_EQ(syntax("<|start_header_id|>{% if tools %}<|python_tag|>{% endif %}"),
            ToolSyntax::kLlama3);
  EXPECT_EQ(syntax("<|im_start|>{{ messages[0].content }}"), std::nullopt);
  EXPECT_EQ(tool_syntax_of(ChatFormatter(ChatFamily::kChatML)), std::nullopt);
}

}  // namespace
}  // namespace barata::openai
