// Chat templates of instruct models. A file's own `tokenizer.chat_template`
// (a Jinja string) is rendered by barata's interpreter (barata/jinja.h); the
// hand-written formats by family (detected from the template's markers, or
// named with --chat-template) are the fallback when a template cannot be used.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "barata/tokenizer.h"  // TextRange

namespace barata {

enum class ChatFamily { kChatML, kLlama3, kGemma, kLlama2, kPhi3 };

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}
  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  // An assistant's calls: OpenAI's `tool_calls` array as JSON text ("": none).
  std::string tool_calls;
  std::string tool_call_id;  // a "tool" message: the call it answers
  std::string name;          // a "tool" message: the function's name
};

const char* chat_family_name(ChatFamily f);  // "chatml", "llama3", "gemma", "llama2", "phi3"
const std::vector<std::string>& chat_family_names();
std::optional<ChatFamily> detect_chat_family(std::string_view jinja);
ChatFamily chat_family_from_name(std::string_view name);  // throws, listing the known names
// The system prompt a ChatML template inserts when the conversation has none
// (SmolLM2's does), or "".
std::string default_system_prompt(std::string_view jinja);
// The conversation as text, ending with the assistant's turn opened when
// add_generation_prompt. Special markers appear as text: encode with
// parse_special. The BOS token is left to the tokenizer.
// With `content`, the byte ranges of the messages' own text in the result
// (for Tokenizer::encode's `literal`: special tokens are the template's alone).
std::string apply_chat_template(ChatFamily f, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt,
                                std::vector<TextRange>* content = nullptr);
// One user message with the template's default system prompt (if any), the
// assistant's turn opened.
std::string single_turn_prompt(ChatFamily f, std::string_view jinja, std::string_view user);

namespace jinja {
class Template;
}

// A conversation to prompt text: either a Jinja template (the file's own, or
// one the user gives) or a hand-written family format.
class ChatFormatter {
 public:
  explicit ChatFormatter(ChatFamily f);
  // A Jinja template with the vocabulary's BOS and EOS texts (its
  // `bos_token` / `eos_token`). With strip_bos, a BOS text that opens the
  // rendering is removed (the tokenizer adds the BOS token itself).
  // Throws barata::Error "template: line N: ..." when it does not parse.
  static ChatFormatter from_jinja(std::string_view source, std::string bos_token,
                                  std::string eos_token, bool strip_bos);
  // The same with the vocabulary's BOS and EOS token texts, the BOS stripped
  // when the tokenizer adds it.
  static ChatFormatter from_jinja(std::string_view source, const Tokenizer& tok);
  // The file's own template, when barata's interpreter parses it and renders a
  // one-message conversation; otherwise the family its markers name, and
  // `*why` says why the template was not used. nullopt when neither works
  // (`*why` says why).
  static std::optional<ChatFormatter> for_tokenizer(const Tokenizer& tok, std::string* why);
  // The same for a template text ("": none) and the vocabulary's tokens.
  static std::optional<ChatFormatter> for_template(std::string_view source, std::string bos_token,
                                                   std::string eos_token, bool strip_bos,
                                                   std::string* why);

  // As apply_chat_template. `tools_json`: OpenAI's `tools` array as JSON text,
  // given to a Jinja template as `tools` ("" none; a hand-written format
  // throws when given tools). A template's raise_exception throws
  // barata::Error with its message.
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                    std::vector<TextRange>* content = nullptr,
                    std::string_view tools_json = {}) const;

  bool is_jinja() const { return tmpl_ != nullptr; }
  // "jinja" or the family's name.
  std::string name() const;
  // The family: the hand-written one, or the one a Jinja template's markers
  // name (the tool-call syntax of the replies); nullopt when none.
  std::optional<ChatFamily> family() const { return family_; }
  // The Jinja source ("" for a hand-written format).
  const std::string& source() const { return source_; }
  // The system prompt a hand-written format inserts when the conversation has
  // none ("" for a Jinja template, which inserts its own).
  const std::string& default_system() const { return default_system_; }

 private:
  ChatFormatter() = default;
  std::shared_ptr<const jinja::Template> tmpl_;
  std::optional<ChatFamily> family_;
  std::string source_, bos_, eos_, default_system_;
  bool strip_bos_ = false;
};

}  // namespace barata
