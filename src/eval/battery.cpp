#include "barata/battery.h"
#include "barata/scheduler.h"

#include <cstdint>
#include <span>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/sampler.h"

namespace barata {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Bytes of the UTF-8 character starting at s[i]: its lead byte's length
// when the continuation bytes are there, else 1 (an invalid byte).
size_t utf8_length(std::string_view s, size_t i) {
  const unsigned char u = static_cast<unsigned char>(s[i]);
  const size_t n = u >= 0xF0 && u < 0xF8 ? 4 : u >= 0xE0 ? 3 : u >= 0xC0 ? 2 : 1;
  if (n == 1 || i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

// The code point of one character from utf8_length (a lone byte: itself).
uint32_t utf8_decode(std::string_view c) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(c[k])); };
  switch (c.size()) {
    case 2:
      return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3:
      return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    case 4:
      return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
    default:
      return b(0);
  }
}

// Punctuation and symbols outside ASCII, which separate words as ASCII
// punctuation does ("0°C" is "0 c"): the Latin-1 signs (no-break space to
// the inverted question mark, x and division signs), general punctuation
// (dashes, curly quotes, ellipsis), currency, letterlike symbols (degree
// Celsius), arrows and mathematical operators, CJK and full-width
// punctuation. Letters of every script are kept.
bool is_symbol(uint32_t cp) {
  return (cp >= 0xA0 && cp <= 0xBF) || cp == 0xD7 || cp == 0xF7 || (cp >= 0x2000 && cp <= 0x206F) ||
         (cp >= 0x20A0 && cp <= 0x20CF) || (cp >= 0x2100 && cp <= 0x214F) ||
         (cp >= 0x2190 && cp <= 0x22FF) || (cp >= 0x3000 && cp <= 0x303F) ||
         (cp >= 0xFF01 && cp <= 0xFF0F);
}

BatteryQuestion parse_line(std::string_view line, std::string_view name, int lineno) {
  const std::string where = fmt::format("{}:{}", printable(name), lineno);
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded()) fail("{}: not valid JSON", where);
  if (!j.is_object()) fail("{}: expected an object {{\"q\": ..., \"a\": [...]}}", where);
  for (const auto& [k, v] : j.items()) {
    (void)v;
    if (k != "q" && k != "a")
      fail("{}: unknown key \"{}\" (the keys are \"q\" and \"a\")", where, printable(k));
  }
  BatteryQuestion q;
  q.line = lineno;
  if (!j.contains("q") || !j["q"].is_string() || trim(j["q"].get<std::string>()).empty())
    fail("{}: \"q\" must be a non-empty string (the question)", where);
  q.q = std::string(trim(j["q"].get<std::string>()));
  if (!j.contains("a") || !j["a"].is_array() || j["a"].empty())
    fail("{}: \"a\" must be a non-empty array of accepted answers", where);
  for (const auto& a : j["a"]) {
    if (!a.is_string()) fail("{}: every answer in \"a\" must be a string", where);
    const std::string s = a.get<std::string>();
    if (normalize_answer(s).empty())
      fail("{}: the answer \"{}\" has no letter or digit, so it could never match", where,
           printable(s));
    q.answers.push_back(s);
  }
  return q;
}

}  // namespace

std::vector<BatteryQuestion> parse_battery(std::string_view text, std::string_view name) {
  std::vector<BatteryQuestion> out;
  int lineno = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++lineno;
    if (trim(line).empty()) continue;
    out.push_back(parse_line(line, name, lineno));
  }
  if (out.empty()) fail("{}: no questions (one JSON object a line)", printable(name));
  return out;
}

std::vector<BatteryQuestion> load_battery(const std::filesystem::path& path) {
  return parse_battery(read_regular_file(path, "battery file"), path.string());
}

std::filesystem::path default_battery_path() {
  namespace fs = std::filesystem;
  const fs::path rel = fs::path("tests") / "data" / "eval" / "battery.jsonl";
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.parent_path();
         dir = dir.parent_path()) {
      if (fs::exists(dir / rel, ec)) return dir / rel;
    }
  }
  return rel;
}

std::string normalize_answer(std::string_view s) {
  std::string out;
  bool pending_space = false;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char u = static_cast<unsigned char>(s[i]);
    size_t len = 1;
    bool keep = false;
    char c = s[i];
    if (u < 0x80) {
      keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    } else {
      len = utf8_length(s, i);
      keep = !is_symbol(utf8_decode(s.substr(i, len)));
    }
    if (!keep) {
      pending_space = true;
      i += len;
      continue;
    }
    if (pending_space && !out.empty()) out += ' ';
    pending_space = false;
    if (u < 0x80)
      out += c;
    else
      out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

bool answer_in(std::string_view reply, const std::vector<std::string>& answers) {
  // Padded with spaces, so that a match is found only between word boundaries.
  const auto padded = [](std::string_view t) {
    std::string p(1, ' ');
    p += normalize_answer(t);
    p += ' ';
    return p;
  };
  const std::string r = padded(reply);
  for (const std::string& a : answers) {
    const std::string n = padded(a);
    if (n.size() > 2 && r.find(n) != std::string::npos) return true;
  }
  return false;
}

BatteryPrompt battery_prompt(const Tokenizer& tok, std::string_view question,
                             const BatteryOptions& o) {
  const std::string& jinja = tok.chat_template();
  if (o.plain || (!o.chat_family && jinja.empty()))
    return {fmt::format("Question: {}\nAnswer:", question), false};
  std::optional<ChatFamily> family = o.chat_family;
  if (!family) family = detect_chat_family(jinja);
  if (!family)
    fail(
        "cannot tell the chat template family from tokenizer.chat_template; name one ({}) or ask "
        "without a template",
        fmt::join(chat_family_names(), ", "));
  return {single_turn_prompt(*family, jinja, question), true};
}

BatteryResult run_battery(Engine& engine, const Tokenizer& tok,
                          const std::vector<BatteryQuestion>& questions, const BatteryOptions& o) {
  if (o.max_new_tokens < 1) fail("max_new_tokens must be at least 1 (got {})", o.max_new_tokens);
  const int64_t n_vocab = engine.model().config().n_vocab;
  if (tok.n_vocab() != n_vocab)
    fail("the tokenizer has {} tokens but the model's vocabulary has {}", tok.n_vocab(), n_vocab);
  // Every question's prompt first: a bad one stops the run before any runs.
  std::vector<std::vector<int32_t>> prompts;
  for (const BatteryQuestion& q : questions) {
    const BatteryPrompt p = battery_prompt(tok, q.q, o);
    std::vector<int32_t> ids = tok.encode(p.text, tok.add_bos_default(), p.parse_special);
    if (ids.empty()) fail("line {}: the question encodes to no tokens", q.line);
    if (static_cast<int64_t>(ids.size()) >= engine.n_ctx())
      fail(
          "line {}: the question has {} tokens but the context holds {} (and the answer needs "
          "more)",
          q.line, ids.size(), engine.n_ctx());
    prompts.push_back(std::move(ids));
  }

  // One scheduler batch, greedy, each reply ending at its first line (the
  // stop string "\n" after the reply's first visible byte). Several at once
  // on the CPU, whose rows are bit-identical in any batch; one at a time
  // elsewhere, so that a reply never depends on its neighbours.
  EngineSteps steps(engine);
  SchedulerOptions so;
  so.slots = engine.backend().kind() == DeviceKind::kCpu ? 4 : 1;
  so.prefix_cache = false;
  so.tokenizer = &tok;
  so.is_eog = [&tok](int32_t t) { return tok.is_eog(t); };
  Scheduler sch(steps, so);
  std::vector<int> ids;
  for (const std::vector<int32_t>& p : prompts) {
    Request r;
    r.prompt = p;
    r.sampling.temperature = 0;
    r.sampling.repeat_penalty = 1;
    r.max_tokens = o.max_new_tokens;
    r.stop = {"\n"};
    r.stop_after_text = true;
    ids.push_back(sch.submit(std::move(r)));
  }
  sch.run();

  BatteryResult res;
  for (size_t i = 0; i < questions.size(); ++i) {
    const BatteryQuestion& q = questions[i];
    const Sequence& s = sch.sequence(ids[i]);
    if (s.status == SeqStatus::kFailed) fail("line {}: {}", q.line, s.error);
    BatteryRow row{q.q, q.answers, "", {}, false};
    row.generated.assign(s.output().begin(), s.output().end());
    std::string_view reply = trim(s.text);
    reply = reply.substr(0, reply.find('\n'));
    row.reply = std::string(trim(reply));
    row.ok = answer_in(row.reply, row.answers);
    res.correct += row.ok ? 1 : 0;
    res.rows.push_back(std::move(row));
  }
  return res;
}

}  // namespace barata
