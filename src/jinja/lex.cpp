// Jinja lexing: the template into text and tags, a tag into tokens.
#include "value.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"

namespace barata::jinja {

// ---- lexing the template ---------------------------------------------------

std::vector<Piece> lex(std::string_view src) {
  std::vector<Piece> out;
  size_t pos = 0;
  int line = 1;
  bool trim_next = false;  // '-' on the previous tag: strip the text's leading whitespace
  bool nl_next = false;    // trim_blocks: drop one newline after a block tag
  auto count_lines = [](std::string_view s) {
    return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
  };
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open != std::string_view::npos && open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(
        src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    const int text_line = line;
    line += count_lines(text);
    if (nl_next) {
      if (text.rfind("\r\n", 0) == 0)
        text.erase(0, 2);
      else if (!text.empty() && text[0] == '\n')
        text.erase(0, 1);
    }
    if (trim_next) text = strip_chars(text, kSpace, true, false);
    trim_next = nl_next = false;
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Piece::kText, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t inner = open + 2;
    bool strip_before = false, no_lstrip = false;
    if (inner < src.size() && src[inner] == '-') {
      strip_before = true;
      ++inner;
    } else if (inner < src.size() && src[inner] == '+') {
      no_lstrip = true;
      ++inner;
    }
    // The tag ends at its closer outside string literals ({{ "}}" }}).
    size_t end = std::string_view::npos;
    for (size_t q = inner; q + 1 < src.size(); ++q) {
      const char ch = src[q];
      if (kind != '#' && (ch == '"' || ch == '\'')) {
        size_t e = q + 1;
        while (e < src.size() && src[e] != ch) e += src[e] == '\\' ? 2 : 1;
        if (e >= src.size()) break;
        q = e;
        continue;
      }
      if (ch == close[0] && src[q + 1] == close[1]) {
        end = q;
        break;
      }
    }
    if (end == std::string_view::npos) err(line, fmt::format("'{{{}' is not closed", kind));
    size_t body_end = end;
    bool strip_after = false, no_trim = false;
    if (body_end > inner && src[body_end - 1] == '-') {
      strip_after = true;
      --body_end;
    } else if (body_end > inner && src[body_end - 1] == '+') {
      no_trim = true;
      --body_end;
    }
    if (strip_before) {
      text = strip_chars(text, kSpace, false, true);
    } else if (kind != '{' && !no_lstrip) {
      // lstrip_blocks: the spaces and tabs between the line's start (in the
      // source) and the tag.
      size_t q = open;
      while (q > pos && (src[q - 1] == ' ' || src[q - 1] == '\t')) --q;
      if (q == 0 || src[q - 1] == '\n') {
        const size_t run = open - q;
        size_t k = text.size();
        while (k > 0 && text.size() - k < run && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
        text.erase(k);
      }
    }
    if (!text.empty()) out.push_back({Piece::kText, text, text_line});
    const std::string body(src.substr(inner, body_end - inner));
    if (kind == '{') out.push_back({Piece::kVar, body, line});
    if (kind == '%') {
      // {% raw %} ... {% endraw %}: the text between, untouched.
      const std::string b = strip_chars(body, kSpace, true, true);
      if (b == "raw") {
        const size_t r = src.find("endraw", end + 2);
        const size_t r_open = r == std::string_view::npos ? r : src.rfind("{%", r);
        const size_t r_close = r == std::string_view::npos ? r : src.find("%}", r);
        if (r_close == std::string_view::npos) err(line, "{% raw %} without {% endraw %}");
        std::string raw(src.substr(end + 2, r_open - end - 2));
        if (src[r_open + 2] == '-') raw = strip_chars(raw, kSpace, false, true);
        out.push_back({Piece::kText, raw, line});
        line += count_lines(src.substr(open, r_close + 2 - open));
        pos = r_close + 2;
        strip_after = src[r_close - 1] == '-';
        trim_next = strip_after;
        nl_next = !strip_after;
        continue;
      }
      out.push_back({Piece::kBlock, body, line});
    }
    line += count_lines(src.substr(open, end + 2 - open));
    pos = end + 2;
    trim_next = strip_after;
    nl_next = kind != '{' && !no_trim && !strip_after;
  }
  return out;
}

// ---- expressions -----------------------------------------------------------

std::vector<Tok> tokenize(const std::string& s, int line) {
  std::vector<Tok> out;
  size_t k = 0;
  while (k < s.size()) {
    const char c = s[k];
    if (kSpace.find(c) != std::string::npos) {
      ++k;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = k;
      while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      out.push_back({Tok::kName, s.substr(k, e - k), {}});
      k = e;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = k;
      bool fl = false;
      while (e < s.size() && (std::isdigit(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      if (e + 1 < s.size() && s[e] == '.' && std::isdigit(static_cast<unsigned char>(s[e + 1]))) {
        fl = true;
        ++e;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
      }
      if (e < s.size() && (s[e] == 'e' || s[e] == 'E')) {
        size_t x = e + 1;
        if (x < s.size() && (s[x] == '+' || s[x] == '-')) ++x;
        if (x < s.size() && std::isdigit(static_cast<unsigned char>(s[x]))) {
          fl = true;
          e = x;
          while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
        }
      }
      std::string t = s.substr(k, e - k);
      t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      Tok tok{Tok::kNum, t, {}};
      try {
        tok.num = fl ? Value(std::stod(t)) : Value(static_cast<int64_t>(std::stoll(t)));
      } catch (const std::exception&) {
        err(line, fmt::format("a number out of range: {}", t));
      }
      out.push_back(tok);
      k = e;
      continue;
    }
    if (c == '"' || c == '\'') {
      std::string v;
      size_t e = k + 1;
      while (e < s.size() && s[e] != c) {
        if (s[e] == '\\' && e + 1 < s.size()) {
          const char x = s[++e];
          switch (x) {
            case 'n':
              v += '\n';
              break;
            case 't':
              v += '\t';
              break;
            case 'r':
              v += '\r';
              break;
            case '\\':
              v += '\\';
              break;
            case '\'':
              v += '\'';
              break;
            case '"':
              v += '"';
              break;
            default:
              v += '\\';
              v += x;
          }
          ++e;
          continue;
        }
        v += s[e++];
      }
      if (e >= s.size()) err(line, "an unterminated string");
      out.push_back({Tok::kStr, v, {}});
      k = e + 1;
      continue;
    }
    static const char* ops[] = {"//", "**", "==", "!=", "<=", ">="};
    bool two = false;
    for (const char* op : ops)
      if (s.compare(k, 2, op) == 0) {
        out.push_back({Tok::kOp, op, {}});
        k += 2;
        two = true;
        break;
      }
    if (two) continue;
    if (std::string("()[]{},.:|~+-*/%<>=!").find(c) == std::string::npos)
      err(line, fmt::format("unexpected character '{}'", c));
    out.push_back({Tok::kOp, std::string(1, c), {}});
    ++k;
  }
  out.push_back({Tok::kEnd, "", {}});
  return out;
}

}  // namespace barata::jinja
