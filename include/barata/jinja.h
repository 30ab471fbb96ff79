// A Jinja2 subset for chat templates (tokenizer.chat_template), rendered as
// Hugging Face transformers renders them: trim_blocks and lstrip_blocks on,
// `tojson` as json.dumps(ensure_ascii=False), `raise_exception(msg)` and
// `strftime_now(fmt)` given. What real templates use is here: text, {{ }},
// {% if/elif/else %}, {% for %} (with loop.*, else, a filter condition,
// break/continue), {% set %} (names, tuples, namespace attributes, blocks),
// {% macro %}, {% generation %}, comments, whitespace control; expressions
// with literals, lists, dicts, attributes, subscripts and slices, calls,
// filters, tests, `in`, `~`, arithmetic, comparisons, and/or/not and
// conditional expressions; the string, list and dict methods templates call.
// Anything else is an error naming the line, not a wrong rendering.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace barata::jinja {

struct Node;

class Template {
 public:
  // Throws barata::Error "template: line N: ..." on a syntax error.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with these variables (messages, tools, add_generation_prompt,
  // bos_token, ...). Throws barata::Error "template: ..." on an error, and
  // with the template's own message for raise_exception.
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::unique_ptr<Node> root_;
};

}  // namespace barata::jinja
