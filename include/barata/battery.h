// A factual battery: short questions with known short answers (a capital, a
// chemical symbol, a number), one JSON object a line:
//   {"q": "What is the capital of France?", "a": ["Paris"]}
// "a" lists the accepted answers (["4", "four"]). Each question is asked
// greedily, in the model's chat template when its file has one; a question
// counts as right when one accepted answer appears, as whole words after
// normalization, in the first line of the reply. The committed set is
// tests/data/eval/battery.jsonl.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "barata/chat_template.h"
#include "barata/engine.h"
#include "barata/tokenizer.h"

namespace barata {

struct BatteryQuestion {
  std::string q;
  std::vector<std::string> answers;
  int line = 0;  // 1-based line in the file
};

// Parses the JSONL text; `name` (the file) starts every error message, which
// also gives the line: not JSON, not an object, a key other than "q" and "a",
// "q" not a non-empty string, "a" not a non-empty array of strings, an answer
// that normalizes to nothing. Blank lines are skipped; no question at all is
// an error.
std::vector<BatteryQuestion> parse_battery(std::string_view text, std::string_view name);
// Reads and parses a file (a regular file of bounded size).
std::vector<BatteryQuestion> load_battery(const std::filesystem::path& path);
// The committed battery: tests/data/eval/battery.jsonl in the first folder
// holding it, going up from the running executable, else that path under
// the working directory.
std::filesystem::path default_battery_path();

// Lower-case ASCII letters; every ASCII character that is not a letter or a
// digit, and the common non-ASCII punctuation and symbols (the degree sign,
// curly quotes, dashes, currency, arrows, math operators), separate words;
// words are joined by one space. Other UTF-8 characters (letters of any
// script, accented ones included) are kept as they are.
std::string normalize_answer(std::string_view s);
// True when some answer, normalized, appears in the normalized reply as whole
// words: "4" is found in "2 + 2 = 4." but not in "40".
bool answer_in(std::string_view reply, const std::vector<std::string>& answers);

struct BatteryOptions {
  int max_new_tokens = 24;
  // The chat template: unset = the family detected from the file's
  // tokenizer.chat_template (an error when the file has a template barata
  // cannot tell); ignored when plain.
  std::optional<ChatFamily> chat_family;
  // No template: the prompt is "Question: ...\nAnswer:". The default for a
  // file without a chat template.
  bool plain = false;
};

// The text a question is asked with, and whether its control tokens are
// parsed (true in a chat template).
struct BatteryPrompt {
  std::string text;
  bool parse_special = false;
};
BatteryPrompt battery_prompt(const Tokenizer& tok, std::string_view question,
                             const BatteryOptions& o);

struct BatteryRow {
  std::string question;
  std::vector<std::string> answers;
  std::string reply;  // the first line of the reply, trimmed
  std::vector<int32_t> generated;
  bool ok = false;
};

struct BatteryResult {
  std::vector<BatteryRow> rows;
  int correct = 0;
  int total() const { return static_cast<int>(rows.size()); }
};

// Asks every question greedily, each in a fresh sequence freed afterwards.
// Generation stops at an end-of-generation token, at a newline once the
// reply has some text (leading white space is skipped), after
// max_new_tokens, or at the end of the context.
BatteryResult run_battery(Engine& engine, const Tokenizer& tok,
                          const std::vector<BatteryQuestion>& questions,
                          const BatteryOptions& o = {});

}  // namespace barata
