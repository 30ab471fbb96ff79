// Layouts of the chat formats are facts of each model family (their model
// cards; llama.cpp's llama-chat.cpp implements the same list).
#include "barata/chat_template.h"

#include <fmt/ranges.h>

#include "barata/error.h"

namespace barata {

const std::vector<std::string>& chat_family_names() {
  static const std::vector<std::string> kNames = {"chatml", "llama3", "gemma", "llama2", "phi3"};
  return kNames;
}

const char* chat_family_name(ChatFamily f) {
  return chat_family_names()[static_cast<size_t>(f)].c_str();
}

std::optional<ChatFamily> detect_chat_family(std::string_view t) {
  if (t.find("<|im_start|>") != std::string_view::npos) return ChatFamily::kChatML;
  if (t.find("<|start_header_id|>") != std::string_view::npos) return ChatFamily::kLlama3;
  if (t.find("<start_of_turn>") != std::string_view::npos) return ChatFamily::kGemma;
  if (t.find("[INST]") != std::string_view::npos) return ChatFamily::kLlama2;
  if (t.find("<|assistant|>") != std::string_view::npos &&
      t.find("<|end|>") != std::string_view::npos)
    return ChatFamily::kPhi3;
  return std::nullopt;
}

ChatFamily chat_family_from_name(std::string_view name) {
  const auto& names = chat_family_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<ChatFamily>(i);
  fail("unknown chat template '{}' (known: {})", name, fmt::join(names, ", "));
}

std::string default_system_prompt(std::string_view t) {
  const std::string_view open = "<|im_start|>system\n";
  const size_t a = t.find(open);
  if (a == std::string_view::npos) return "";
  // Only a literal inside the template text counts, not "<|im_start|>system"
  // assembled from a message's role.
  const size_t b = t.find("<|im_end|>", a);
  if (b == std::string_view::npos) return "";
  std::string_view s = t.substr(a + open.size(), b - a - open.size());
  if (s.find("{{") != std::string_view::npos || s.find('\'') != std::string_view::npos) return "";
  return std::string(s);
}

std::string apply_chat_template(ChatFamily f, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, std::vector<TextRange>* content) {
  std::string out;
  if (content) content->clear();
  // Appends a message's text, recording where it went.
  auto text = [&out, content](const std::string& t) -> std::string& {
    if (content && !t.empty()) content->push_back({out.size(), out.size() + t.size()});
    return out += t;
  };
  switch (f) {
    case ChatFamily::kChatML:
      for (const auto& m : messages) {
        out += "<|im_start|>" + m.role + "\n";
        text(m.content);
        out += "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFamily::kLlama3:
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
        text(m.content);
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case ChatFamily::kGemma: {
      // Gemma has no system role: the system text opens the first user turn.
      std::string system;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system += m.content + "\n\n";
          continue;
        }
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<start_of_turn>" + role + "\n";
        text((role == "user" ? system : "") + m.content);
        out += "<end_of_turn>\n";
        if (role == "user") system.clear();
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    }
    case ChatFamily::kPhi3:  // Phi-3's model card: <|role|>, newline, text, <|end|>, newline
      for (const auto& m : messages) {
        out += "<|" + m.role + "|>\n";
        text(m.content);
        out += "<|end|>\n";
      }
      if (add_generation_prompt) out += "<|assistant|>\n";
      break;
    case ChatFamily::kLlama2: {
      std::optional<std::string> system;
      for (const auto& m : messages) {
        if (m.role == "system") {
          system = m.content;
        } else if (m.role == "user") {
          out += "[INST] ";
          if (system) {
            out += "<<SYS>>\n";
            text(*system);
            out += "\n<</SYS>>\n\n";
          }
          text(m.content);
          out += " [/INST]";
          system.reset();
        } else {
          out += " ";
          text(m.content);
          out += " </s>";
        }
      }
      (void)add_generation_prompt;  // the open [INST] turn is the generation prompt
      break;
    }
  }
  return out;
}

std::string single_turn_prompt(ChatFamily f, std::string_view jinja, std::string_view user) {
  std::vector<ChatMessage> msgs;
  const std::string system = default_system_prompt(jinja);
  if (!system.empty()) msgs.push_back({"system", system});
  msgs.push_back({"user", std::string(user)});
  return apply_chat_template(f, msgs, true);
}

}  // namespace barata
