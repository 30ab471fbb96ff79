// ChatFormatter: the chat paths (run --chat, chat, serve) render a file's own
// tokenizer.chat_template with the Jinja interpreter. On the instruct models
// here the rendering (after the BOS the tokenizer adds itself) equals the
// hand-written format of the template's family with the template's default
// system prompt. One prompt changed when the interpreter was wired in: Qwen2.5
// templates insert "You are Qwen, ..." when a conversation has no system
// message, which the hand-written path could not read out of the template.
// Also: where the messages' text lies in the prompt (the ranges encoded as
// text, never as control tokens), the fallback with its reason, a template
// that raises, and tools given to a template.
#include <filesystem>

#include <gtest/gtest.h>

#include "barata/chat_template.h"
#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;

std::vector<std::vector<ChatMessage>> conversations() {
  return {
      {{"user", "Hello"}},
      {{"system", "Be brief."}, {"user", "What is 2+2?"}},
      {{"system", "You answer in French."},
       {"user", "Hi <|im_end|> there"},
       {"assistant", "Bonjour !"},
       {"user", "  spaced  "}},
      {{"user", "one"}, {"assistant", "two"}, {"user", "three"}},
  };
}

// The texts at `ranges` of `text`, joined with '|'.
std::string at(const std::string& text, const std::vector<TextRange>& ranges) {
  std::string out;
  for (const TextRange& r : ranges)
    out += (out.empty() ? "" : "|") + text.substr(r.begin, r.end - r.begin);
  return out;
}

constexpr const char* kQwenSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

struct ModelCase {
  const char* file;
  const char* system;  // the template's default system prompt
};

class ChatFormatModels : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ChatFormatModels, JinjaEqualsTheHandWrittenFormat) {
  const fs::path path = test::model_path(GetParam().file);
  BARATA_NEED_FETCHED(path, test::fetch_script_for(path));
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile::open(path));
  std::string why;
  const auto jinja = ChatFormatter::for_tokenizer(tok, &why);
  ASSERT_TRUE(jinja) << why;
  EXPECT_TRUE(why.empty()) << why;
  ASSERT_TRUE(jinja->is_jinja());
  EXPECT_EQ(jinja->name(), "jinja");
  EXPECT_TRUE(jinja->default_system().empty());
  ASSERT_TRUE(jinja->family());
  const ChatFamily family = *jinja->family();
  const std::string system = GetParam().system;
  for (const auto& conv : conversations()) {
    std::vector<ChatMessage> hand = conv;
    if (conv[0].role != "system" && !system.empty()) hand.insert(hand.begin(), {"system", system});
    std::vector<TextRange> jr, hr;
    const std::string j = jinja->apply(conv, true, &jr);
    const std::string h = apply_chat_template(family, hand, true, &hr);
    EXPECT_EQ(j, h) << GetParam().file << " (" << chat_family_name(family) << ")";
    // The messages' text, where the template put it: the template's own
    // default system prompt is markup, the rest is what was sent.
    std::vector<TextRange> hr_sent;
    for (const TextRange& r : hr)
      if (system.empty() || conv[0].role == "system" || h.substr(r.begin, system.size()) != system)
        hr_sent.push_back(r);
    EXPECT_EQ(at(j, jr), at(h, hr_sent)) << GetParam().file;
    // Without the generation prompt too.
    EXPECT_EQ(jinja->apply(conv, false), apply_chat_template(family, hand, false))
        << GetParam().file;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, ChatFormatModels,
    ::testing::Values(ModelCase{"SmolLM2-135M-Instruct.Q4_1.gguf",
                                "You are a helpful AI assistant named SmolLM, trained by "
                                "Hugging Face"},
                      ModelCase{"Qwen2.5-Coder-0.5B-Instruct.gguf", kQwenSystem},
                      // (gemma-3-270m-q4_k_m.gguf has no template: the
                      // architecture's own format serves it.)
                      ModelCase{"Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", kQwenSystem}),
    [](const auto& info) {
      std::string n = info.param.file;
      n = n.substr(0, n.find(".gguf"));
      for (char& c : n)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return n;
    });

TEST(ChatFormat, ContentRangesAreExactOrFound) {
  // A template that keeps the text: exact ranges, also where it repeats
  // markup-like text.
  const auto plain = ChatFormatter::from_jinja(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
      "<s>", "</s>", true);
  std::vector<TextRange> r;
  const std::string t = plain.apply({{"user", "<|im_start|>"}, {"assistant", "user"}}, false, &r);
  EXPECT_EQ(t, "<|im_start|>user\n<|im_start|><|im_end|>\n<|im_start|>assistant\nuser<|im_end|>\n");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].begin, 17u);  // the sent "<|im_start|>", not the template's first
  EXPECT_EQ(at(t, r), "<|im_start|>|user");
  // A template that trims: the trimmed text is found in order.
  const auto trims = ChatFormatter::from_jinja(
      "{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}{% endfor %}", "", "", false);
  const std::string u = trims.apply({{"user", "  a b  "}, {"assistant", "\nc\n"}}, false, &r);
  EXPECT_EQ(u, "[user]a b[assistant]c");
  EXPECT_EQ(at(u, r), "a b|c");
  // BOS: removed when the template opens with it (the tokenizer adds it).
  const auto bos = ChatFormatter::from_jinja(
      "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}", "<s>", "</s>", true);
  EXPECT_EQ(bos.apply({{"user", "x"}}, false, &r), "x</s>");
  EXPECT_EQ(at("x</s>", r), "x");
  const auto keep =
      ChatFormatter::from_jinja("{{ bos_token }}{{ messages[0].content }}", "<s>", "</s>", false);
  EXPECT_EQ(keep.apply({{"user", "x"}}, false), "<s>x");
}

TEST(ChatFormat, RaisesWithTheTemplatesMessage) {
  const auto f = ChatFormatter::from_jinja(
      "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}{{ messages[0].content }}",
      "", "", false);
  EXPECT_EQ(f.apply({{"user", "hi"}}, true), "hi");
  try {
    f.apply({{"system", "x"}, {"user", "hi"}}, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("System role not supported"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ChatFormatter::from_jinja("{% if %}", "", "", false), Error);
}

TEST(ChatFormat, ToolsAndToolMessagesReachTheTemplate) {
  const auto f = ChatFormatter::from_jinja(
      "{% for t in tools %}T:{{ t.function.name }};{% endfor %}"
      "{% for m in messages %}{{ m.role }}:{{ m.content }}"
      "{% for c in m.tool_calls %}<{{ c.function.name }} {{ c.function.arguments | tojson }} "
      "{{ c.function.arguments.city }}>{% endfor %}"
      "{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %};{% endfor %}",
      "", "", false);
  ChatMessage call{"assistant", ""};
  call.tool_calls =
      R"([{"id":"c1","type":"function","function":{"name":"weather","arguments":"{\"city\": \"Oslo\"}"}}])";
  ChatMessage result{"tool", "12 C"};
  result.tool_call_id = "c1";
  result.name = "weather";
  EXPECT_EQ(f.apply({{"user", "w?"}, call, result}, false, nullptr,
                    R"([{"type":"function","function":{"name":"weather","parameters":{}}}])"),
            R"(T:weather;user:w?;assistant:<weather {"city": "Oslo"} Oslo>;tool:12 C(c1);)");
  // A hand-written format has no place for tools: an error, not silence.
  EXPECT_THROW(ChatFormatter(ChatFamily::kChatML).apply({{"user", "x"}}, true, nullptr, "[]"),
               Error);
}

TEST(ChatFormat, FallsBackToTheFamilyWithAReason) {
  std::string why;
  // A template the interpreter cannot parse, whose markers name ChatML (and
  // a default system prompt): the hand-written format, and why.
  const std::string bad =
      "{% for m in messages %}{% if loop.first and m.role != 'system' %}<|im_start|>system\nBe "
      "kind.<|im_end|>\n{% endif %}{% weird %}<|im_start|>{{ m.role }}{% endfor %}";
  auto f = ChatFormatter::for_template(bad, "", "", false, &why);
  ASSERT_TRUE(f);
  EXPECT_FALSE(f->is_jinja());
  EXPECT_EQ(f->name(), "chatml");
  EXPECT_EQ(f->default_system(), "Be kind.");
  EXPECT_NE(why.find("tokenizer.chat_template: template: line 3: unknown tag 'weird'"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("using the hand-written chatml format"), std::string::npos) << why;
  // One that parses but raises on a one-message conversation: the same.
  f = ChatFormatter::for_template("{{ raise_exception('no') }}<|start_header_id|>", "", "", false,
                                  &why);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->name(), "llama3");
  EXPECT_NE(why.find("raise_exception: no"), std::string::npos) << why;
  // Neither usable nor known: none, and why.
  EXPECT_FALSE(ChatFormatter::for_template("{% weird %}", "", "", false, &why));
  EXPECT_NE(why.find("its markers name no format barata knows"), std::string::npos) << why;
  EXPECT_FALSE(ChatFormatter::for_template("", "", "", false, &why));
  EXPECT_NE(why.find("no chat template"), std::string::npos) << why;
  // A usable template: no reason.
  why.clear();
  f = ChatFormatter::for_template("{{ messages[0].content }}", "", "", false, &why);
  ASSERT_TRUE(f);
  EXPECT_TRUE(f->is_jinja());
  EXPECT_TRUE(why.empty()) << why;
}

}  // namespace
}  // namespace barata
