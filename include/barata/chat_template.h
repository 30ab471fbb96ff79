// Chat templates of instruct models, by family. The family is detected from
// the markers in `tokenizer.chat_template` (a Jinja string barata does not
// execute) or named with --chat-template.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "barata/tokenizer.h"  // TextRange

namespace barata {

enum class ChatFamily { kChatML, kLlama3, kGemma, kLlama2, kPhi3 };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
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

}  // namespace barata
