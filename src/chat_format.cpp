// ChatFormatter: a conversation to prompt text through the model's own Jinja
// template (barata/jinja.h) or a hand-written family format.
#include <algorithm>
#include <charconv>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/chat_template.h"
#include "barata/error.h"
#include "barata/jinja.h"

namespace barata {
namespace {

using ojson = nlohmann::ordered_json;

ojson parse_json(std::string_view text, const char* what) {
  try {
    return ojson::parse(text);
  } catch (const nlohmann::json::exception&) {
    fail("{} is not valid JSON", what);
  }
}

// The messages as a template sees them (transformers' convention): tool
// calls' arguments as objects when they are JSON object text, as OpenAI
// clients send them.
ojson messages_json(const std::vector<ChatMessage>& messages,
                    const std::vector<std::string>* contents) {
  ojson out = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    ojson j = {{"role", m.role}, {"content", contents ? (*contents)[i] : m.content}};
    if (!m.tool_calls.empty()) {
      ojson calls = parse_json(m.tool_calls, "a message's tool_calls");
      for (ojson& c : calls) {
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
        ojson& f = c["function"];
        if (f.contains("arguments") && f["arguments"].is_string()) {
          ojson args = ojson::parse(f["arguments"].get<std::string>(), nullptr, false);
          if (args.is_object()) f["arguments"] = std::move(args);
        }
      }
      j["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) j["name"] = m.name;
    out.push_back(std::move(j));
  }
  return out;
}

// A token's text, or "" when the vocabulary has no such token.
std::string text_of(const Tokenizer& tok, int32_t id) {
  return id >= 0 ? tok.token_text(id) : "";
}

// Sorted, disjoint ranges (overlapping or touching ones merged).
void normalize(std::vector<TextRange>& r) {
  std::sort(r.begin(), r.end(),
            [](const TextRange& a, const TextRange& b) { return a.begin < b.begin; });
  std::vector<TextRange> out;
  for (const TextRange& x : r) {
    if (!out.empty() && x.begin <= out.back().end)
      out.back().end = std::max(out.back().end, x.end);
    else
      out.push_back(x);
  }
  r = std::move(out);
}

}  // namespace

ChatFormatter::ChatFormatter(ChatFamily f) : family_(f) {}

ChatFormatter ChatFormatter::from_jinja(std::string_view source, std::string bos_token,
                                        std::string eos_token, bool strip_bos) {
  ChatFormatter c;
  c.tmpl_ = std::make_shared<const jinja::Template>(source);
  c.source_ = std::string(source);
  c.family_ = detect_chat_family(source);
  c.bos_ = std::move(bos_token);
  c.eos_ = std::move(eos_token);
  c.strip_bos_ = strip_bos && !c.bos_.empty();
  return c;
}

ChatFormatter ChatFormatter::from_jinja(std::string_view source, const Tokenizer& tok) {
  return from_jinja(source, text_of(tok, tok.bos_id()), text_of(tok, tok.eos_id()),
                    tok.add_bos_default());
}

std::optional<ChatFormatter> ChatFormatter::for_tokenizer(const Tokenizer& tok, std::string* why) {
  return for_template(tok.chat_template(), text_of(tok, tok.bos_id()), text_of(tok, tok.eos_id()),
                      tok.add_bos_default(), why);
}

std::optional<ChatFormatter> ChatFormatter::for_template(std::string_view src,
                                                         std::string bos_token,
                                                         std::string eos_token, bool strip_bos,
                                                         std::string* why) {
  if (why) why->clear();
  std::string reason;
  if (src.empty()) {
    reason = "the file has no chat template (tokenizer.chat_template)";
  } else {
    try {
      ChatFormatter c = from_jinja(src, std::move(bos_token), std::move(eos_token), strip_bos);
      if (c.apply({{"user", "Hello"}}, true).empty())
        fail("template: renders nothing for a one-message conversation");
      return c;
    } catch (const Error& e) {
      reason = fmt::format("tokenizer.chat_template: {}", e.what());
    }
    if (auto f = detect_chat_family(src)) {
      ChatFormatter c(*f);
      c.default_system_ = default_system_prompt(src);
      if (why)
        *why = fmt::format("{}; using the hand-written {} format", reason, chat_family_name(*f));
      return c;
    }
    reason += "; its markers name no format barata knows";
  }
  if (why) *why = reason;
  return std::nullopt;
}

std::string ChatFormatter::name() const {
  return tmpl_ ? "jinja" : chat_family_name(*family_);
}

std::string ChatFormatter::apply(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, std::vector<TextRange>* content,
                                 std::string_view tools_json) const {
  if (!tmpl_) {
    const bool calls = std::any_of(messages.begin(), messages.end(),
                                   [](const ChatMessage& m) { return !m.tool_calls.empty(); });
    if (!tools_json.empty() || calls)
      fail("tools need the model's own chat template; the {} format has no place for them", name());
    return apply_chat_template(*family_, messages, add_generation_prompt, content);
  }
  ojson ctx = {{"messages", messages_json(messages, nullptr)},
               {"add_generation_prompt", add_generation_prompt},
               {"bos_token", bos_},
               {"eos_token", eos_}};
  if (!tools_json.empty()) ctx["tools"] = parse_json(tools_json, "'tools'");
  auto render = [&](const ojson& c) {
    std::string out = tmpl_->render(c);
    if (strip_bos_ && out.starts_with(bos_)) out.erase(0, bos_.size());
    return out;
  };
  std::string out = render(ctx);
  if (!content) return out;
  content->clear();

  // Where the messages' text went: render again with a marker in place of
  // each message's text; when putting the texts back into that rendering
  // gives the same prompt, the ranges are exact. A template that changes the
  // text (trims it, splits it) falls back to finding each text in order.
  std::vector<std::string> marks(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) marks[i] = fmt::format("\x1b[barata-text-{}]", i);
  ojson marked = ctx;
  marked["messages"] = messages_json(messages, &marks);
  std::string rebuilt;
  bool exact = true;
  try {
    const std::string m = render(marked);
    size_t at = 0;
    while (at < m.size()) {
      const size_t k = m.find("\x1b[barata-text-", at);
      if (k == std::string::npos) {
        rebuilt.append(m, at);
        break;
      }
      rebuilt.append(m, at, k - at);
      const size_t e = m.find(']', k);
      size_t i = 0;
      const auto [p, ec] =
          std::from_chars(m.data() + k + 14, m.data() + (e == std::string::npos ? m.size() : e), i);
      if (e == std::string::npos || ec != std::errc() || p != m.data() + e || i >= marks.size()) {
        exact = false;
        break;
      }
      const std::string& text = messages[i].content;
      if (!text.empty()) content->push_back({rebuilt.size(), rebuilt.size() + text.size()});
      rebuilt += text;
      at = e + 1;
    }
  } catch (const Error&) {
    exact = false;
  }
  if (!exact || rebuilt != out) {
    content->clear();
    size_t at = 0;
    for (const ChatMessage& msg : messages) {
      std::string_view t = msg.content;
      size_t k = t.empty() ? std::string::npos : out.find(t, at);
      if (k == std::string::npos) {  // trimmed by the template
        const size_t b = t.find_first_not_of(" \t\r\n");
        t = b == std::string_view::npos ? std::string_view{}
                                        : t.substr(b, t.find_last_not_of(" \t\r\n") - b + 1);
        k = t.empty() ? std::string::npos : out.find(t, at);
      }
      if (k == std::string::npos) continue;
      content->push_back({k, k + t.size()});
      at = k + t.size();
    }
  }
  normalize(*content);
  return out;
}

}  // namespace barata
