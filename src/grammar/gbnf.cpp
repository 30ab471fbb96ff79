// GBNF text to Grammar: the syntax of llama.cpp's grammars/README.md (rules
// `name ::= alternatives`, literals with \n \t \r \\ \" \xHH \uHHHH
// \UHHHHHHHH escapes, [classes] with ranges and ^, ".", groups, * + ? {m}
// {m,} {m,n} {,n}, # comments; newlines end a rule except inside groups and
// after ::= and |). Code-point classes become the UTF-8 byte sequences they
// stand for (surrogates excluded); repetitions become rules of their own.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "barata/error.h"
#include "barata/grammar.h"

namespace barata {
namespace {

using Elem = Grammar::Elem;
using Kind = Grammar::Kind;
using ByteSet = Grammar::ByteSet;
using Seq = std::vector<Elem>;

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxRepeat = 10000;              // {m,n} bounds beyond this are refused
constexpr int kMaxNesting = 200;               // groups inside groups
constexpr size_t kMaxElems = size_t{1} << 21;  // repetitions written out, in all

struct Builder {
  std::vector<std::vector<Seq>> rules;  // per rule, its alternatives
  std::vector<std::string> names;
  std::vector<int> defined_at;  // offset of the definition, -1 if none yet
  std::vector<int> used_at;     // first reference
  std::map<std::string, uint32_t, std::less<>> by_name;
  std::vector<ByteSet> sets;
  std::map<ByteSet, uint32_t> set_ids;

  uint32_t rule(std::string_view name, int at) {
    auto it = by_name.find(name);
    if (it != by_name.end()) return it->second;
    const uint32_t id = static_cast<uint32_t>(rules.size());
    rules.emplace_back();
    names.emplace_back(name);
    defined_at.push_back(-1);
    used_at.push_back(at);
    by_name.emplace(std::string(name), id);
    return id;
  }
  uint32_t generated(const std::string& base, int at) {
    std::string n;
    for (int i = static_cast<int>(rules.size());; ++i) {
      n = base + "_" + std::to_string(i);
      if (by_name.find(n) == by_name.end()) break;
    }
    const uint32_t id = rule(n, at);
    defined_at[id] = at;
    return id;
  }
  Elem bytes(const ByteSet& s) {
    auto [it, fresh] = set_ids.emplace(s, static_cast<uint32_t>(sets.size()));
    if (fresh) sets.push_back(s);
    return Elem{Kind::kBytes, it->second};
  }
  Elem byte(unsigned char b) {
    ByteSet s{};
    s[b >> 6] |= uint64_t{1} << (b & 63);
    return bytes(s);
  }
  Elem byte_range(unsigned lo, unsigned hi) {
    ByteSet s{};
    for (unsigned b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
    return bytes(s);
  }
};

int utf8_len(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}
void utf8_encode(uint32_t cp, unsigned char* out) {
  const int n = utf8_len(cp);
  if (n == 1) {
    out[0] = static_cast<unsigned char>(cp);
    return;
  }
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<unsigned char>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  static constexpr unsigned char lead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
  out[0] = static_cast<unsigned char>(lead[n] | cp);
}

// [lo, hi] (one encoded length) as byte-range sequences: splits until every
// byte position of the range is an independent range.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<int, int>>>& out) {
  const int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  unsigned char a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<std::pair<int, int>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

class Parser {
 public:
  Parser(std::string_view src, Builder& b) : s_(src), b_(b) {}

  void parse_all() {
    skip_space(true);
    while (pos_ < s_.size()) {
      parse_rule();
      skip_space(true);
    }
  }

  [[noreturn]] void error(size_t at, std::string_view what) const {
    fail("grammar: {}: {}", line_col(at), what);
  }
  std::string line_col(size_t at) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return fmt::format("line {}, column {}", line, col);
  }

 private:
  static bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }

  // Spaces, tabs and comments; newlines too when newline_ok.
  void skip_space(bool newline_ok) {
    while (pos_ < s_.size()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string_view name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && word_char(s_[pos_])) ++pos_;
    if (pos_ == start) error(start, "expected a rule name");
    return s_.substr(start, pos_ - start);
  }

  void parse_rule() {
    const size_t at = pos_;
    const std::string_view n = name();
    skip_space(false);
    if (s_.substr(pos_, 3) != "::=") error(pos_, fmt::format("expected ::= after '{}'", n));
    pos_ += 3;
    skip_space(true);
    const uint32_t id = b_.rule(n, static_cast<int>(at));
    if (b_.defined_at[id] >= 0)
      error(at, fmt::format("rule '{}' is defined twice (first at {})", n,
                            line_col(static_cast<size_t>(b_.defined_at[id]))));
    b_.defined_at[id] = static_cast<int>(at);
    b_.rules[id] = alternatives(n, false);
    if (!at_end()) {
      if (peek() == '\r') ++pos_;
      if (peek() != '\n') error(pos_, fmt::format("unexpected '{}' in rule '{}'", peek(), n));
      ++pos_;
    }
  }

  std::vector<Seq> alternatives(std::string_view rule, bool nested) {
    std::vector<Seq> alts;
    alts.push_back(sequence(rule, nested));
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      alts.push_back(sequence(rule, nested));
    }
    return alts;
  }

  uint32_t hex(size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      const char c = peek();
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        error(pos_, fmt::format("expected {} hex digits", n));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // One code point of a literal or class (UTF-8 decoded, escapes read).
  uint32_t code_point() {
    const size_t at = pos_;
    if (at_end()) error(at, "unexpected end of the grammar");
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '\\':
          return '\\';
        case '"':
          return '"';
        case '\'':
          return '\'';
        case '[':
          return '[';
        case ']':
          return ']';
        case '-':
          return '-';
        case '^':
          return '^';
        case '/':
          return '/';
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U': {
          const uint32_t v = hex(8);
          if (v > kMaxCodePoint) error(at, "a code point above U+10FFFF");
          return v;
        }
        default:
          error(at, fmt::format("unknown escape '\\{}'", e));
      }
    }
    // UTF-8 in the grammar's own text.
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0) error(at, "invalid UTF-8 in the grammar");
    uint32_t v = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    ++pos_;
    for (int i = 1; i < n; ++i) {
      const unsigned char d = static_cast<unsigned char>(peek());
      if ((d & 0xC0) != 0x80) error(at, "invalid UTF-8 in the grammar");
      v = (v << 6) | (d & 0x3F);
      ++pos_;
    }
    return v;
  }

  void literal(Seq& out, char quote) {
    ++pos_;  // the opening quote
    while (true) {
      if (at_end() || peek() == '\n') error(pos_, "unterminated string literal");
      if (peek() == quote) break;
      const uint32_t cp = code_point();
      if (cp >= 0xD800 && cp <= 0xDFFF) error(pos_, "a surrogate code point in a literal");
      unsigned char buf[4];
      utf8_encode(cp, buf);
      for (int i = 0; i < utf8_len(cp); ++i) out.push_back(b_.byte(buf[i]));
    }
    ++pos_;
  }

  // Code-point ranges, sorted and merged, surrogates removed.
  static std::vector<std::pair<uint32_t, uint32_t>> normalize(
      std::vector<std::pair<uint32_t, uint32_t>> r, bool negate) {
    std::sort(r.begin(), r.end());
    std::vector<std::pair<uint32_t, uint32_t>> m;
    for (auto [lo, hi] : r) {
      if (!m.empty() && lo <= m.back().second + 1)
        m.back().second = std::max(m.back().second, hi);
      else
        m.emplace_back(lo, hi);
    }
    if (negate) {
      std::vector<std::pair<uint32_t, uint32_t>> c;
      uint32_t next = 0;
      for (auto [lo, hi] : m) {
        if (lo > next) c.emplace_back(next, lo - 1);
        next = hi + 1;
      }
      if (next <= kMaxCodePoint) c.emplace_back(next, kMaxCodePoint);
      m = std::move(c);
    }
    std::vector<std::pair<uint32_t, uint32_t>> out;
    for (auto [lo, hi] : m) {
      if (hi < 0xD800 || lo > 0xDFFF) {
        out.emplace_back(lo, hi);
        continue;
      }
      if (lo < 0xD800) out.emplace_back(lo, 0xD7FF);
      if (hi > 0xDFFF) out.emplace_back(0xE000, hi);
    }
    return out;
  }

  // A class of code points as one byte set (ASCII only) or a rule of its
  // UTF-8 sequences.
  Elem code_points(std::string_view rule, const std::vector<std::pair<uint32_t, uint32_t>>& r,
                   size_t at) {
    if (r.empty()) error(at, "a character class that matches nothing");
    ByteSet ascii{};
    bool any_ascii = false;
    std::vector<std::vector<std::pair<int, int>>> seqs;
    for (auto [lo, hi] : r) {
      for (uint32_t cp = lo; cp <= std::min(hi, uint32_t{0x7F}); ++cp) {
        ascii[cp >> 6] |= uint64_t{1} << (cp & 63);
        any_ascii = true;
      }
      // Split at the encoded-length boundaries, then into byte ranges.
      uint32_t a = std::max(lo, uint32_t{0x80});
      for (uint32_t bound : {0x7FFu, 0xFFFFu, kMaxCodePoint}) {
        if (a > hi) break;
        if (a > bound) continue;
        const uint32_t b = std::min(hi, bound);
        utf8_sequences(a, b, seqs);
        a = b + 1;
      }
    }
    if (seqs.empty()) return b_.bytes(ascii);
    const uint32_t id = b_.generated(std::string(rule), static_cast<int>(at));
    if (any_ascii) b_.rules[id].push_back(Seq{b_.bytes(ascii)});
    for (const auto& sq : seqs) {
      Seq alt;
      for (auto [lo, hi] : sq)
        alt.push_back(b_.byte_range(static_cast<unsigned>(lo), static_cast<unsigned>(hi)));
      b_.rules[id].push_back(std::move(alt));
    }
    return Elem{Kind::kRef, id};
  }

  Elem char_class(std::string_view rule) {
    const size_t at = pos_;
    ++pos_;  // [
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++pos_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> r;
    while (true) {
      if (at_end()) error(at, "unterminated character class");
      if (peek() == ']') break;
      const uint32_t lo = code_point();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < s_.size()) {
        ++pos_;
        hi = code_point();
        if (hi < lo) error(at, "a character range whose end is below its start");
      }
      r.emplace_back(lo, hi);
    }
    ++pos_;
    return code_points(rule, normalize(std::move(r), negate), at);
  }

  // The last element (or the group it stands for) repeated.
  void repeat(std::string_view rule, Seq& out, size_t last_start, int mn, int mx, size_t at) {
    if (last_start >= out.size()) error(at, "a repetition with nothing before it");
    const Seq item(out.begin() + static_cast<std::ptrdiff_t>(last_start), out.end());
    written_ += item.size() * static_cast<size_t>(std::max(mn, mx) + 1);
    if (written_ > kMaxElems)
      error(at, fmt::format("the repetitions write out more than {} elements", kMaxElems));
    out.resize(last_start);
    for (int i = 0; i < mn; ++i) out.insert(out.end(), item.begin(), item.end());
    if (mx < 0) {
      // item*: r ::= item r |
      const uint32_t r = b_.generated(std::string(rule), static_cast<int>(at));
      Seq a = item;
      a.push_back(Elem{Kind::kRef, r});
      b_.rules[r] = {a, Seq{}};
      out.push_back(Elem{Kind::kRef, r});
      return;
    }
    // (item (item (...)?)?)? for the mx - mn optional copies.
    uint32_t prev = UINT32_MAX;
    for (int i = 0; i < mx - mn; ++i) {
      const uint32_t r = b_.generated(std::string(rule), static_cast<int>(at));
      Seq a = item;
      if (prev != UINT32_MAX) a.push_back(Elem{Kind::kRef, prev});
      b_.rules[r] = {a, Seq{}};
      prev = r;
    }
    if (prev != UINT32_MAX) out.push_back(Elem{Kind::kRef, prev});
  }

  int number() {
    const size_t at = pos_;
    long v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) error(at, fmt::format("a repetition count above {}", kMaxRepeat));
      ++pos_;
    }
    if (pos_ == at) error(at, "expected a number");
    return static_cast<int>(v);
  }

  Seq sequence(std::string_view rule, bool nested) {
    Seq out;
    size_t last = SIZE_MAX;  // where the last element (or group) starts in out
    while (!at_end()) {
      const size_t at = pos_;
      const char c = peek();
      if (c == '"' || c == '\'') {
        last = out.size();
        literal(out, c);
        if (last == out.size()) last = SIZE_MAX;  // "" is nothing to repeat
      } else if (c == '[') {
        last = out.size();
        out.push_back(char_class(rule));
      } else if (c == '.') {
        ++pos_;
        last = out.size();
        out.push_back(code_points(rule, normalize({{0, kMaxCodePoint}}, false), at));
      } else if (word_char(c)) {
        const std::string_view n = name();
        last = out.size();
        out.push_back(Elem{Kind::kRef, b_.rule(n, static_cast<int>(at))});
      } else if (c == '(') {
        ++pos_;
        skip_space(true);
        if (++depth_ > kMaxNesting)
          error(at, fmt::format("groups nest deeper than {}", kMaxNesting));
        const uint32_t g = b_.generated(std::string(rule), static_cast<int>(at));
        b_.rules[g] = alternatives(rule, true);
        --depth_;
        if (peek() != ')') error(at, "unclosed '('");
        ++pos_;
        last = out.size();
        out.push_back(Elem{Kind::kRef, g});
      } else if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        if (last == SIZE_MAX) error(at, fmt::format("'{}' with nothing before it", c));
        repeat(rule, out, last, c == '+' ? 1 : 0, c == '?' ? 1 : -1, at);
        last = SIZE_MAX;
      } else if (c == '{') {
        ++pos_;
        if (last == SIZE_MAX) error(at, "'{' with nothing before it");
        skip_space(false);
        int mn = 0, mx = -1;
        if (peek() != ',') mn = number();
        skip_space(false);
        if (peek() == ',') {
          ++pos_;
          skip_space(false);
          if (peek() != '}') mx = number();
        } else {
          mx = mn;
        }
        skip_space(false);
        if (peek() != '}') error(pos_, "expected '}'");
        ++pos_;
        if (mx >= 0 && mx < mn) error(at, "a repetition {m,n} with n below m");
        repeat(rule, out, last, mn, mx, at);
        last = SIZE_MAX;
      } else if (c == '<') {
        error(at, "token references (<...>) are not supported");
      } else {
        break;  // | ) newline: the caller's
      }
      skip_space(nested);
    }
    return out;
  }

  std::string_view s_;
  Builder& b_;
  size_t pos_ = 0;
  int depth_ = 0;
  size_t written_ = 0;
};

}  // namespace

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, std::string_view root) {
  Builder b;
  Parser p(gbnf, b);
  p.parse_all();
  for (size_t r = 0; r < b.rules.size(); ++r)
    if (b.defined_at[r] < 0)
      p.error(static_cast<size_t>(b.used_at[r]),
              fmt::format("rule '{}' is not defined", b.names[r]));
  auto it = b.by_name.find(root);
  if (it == b.by_name.end()) fail("grammar: no rule named '{}' (the start rule)", root);

  // Left recursion would expand forever: refuse it, naming the rule.
  const size_t n = b.rules.size();
  std::vector<char> nullable(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Seq& a : b.rules[r]) {
        bool all = true;
        for (const Elem& e : a)
          if (e.kind != Kind::kRef || !nullable[e.arg]) {
            all = false;
            break;
          }
        if (all) {
          nullable[r] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<uint32_t>> left(n);  // rules reachable with nothing consumed
  for (size_t r = 0; r < n; ++r)
    for (const Seq& a : b.rules[r])
      for (const Elem& e : a) {
        if (e.kind != Kind::kRef) break;
        left[r].push_back(e.arg);
        if (!nullable[e.arg]) break;
      }
  std::vector<int> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> dfs;
  for (size_t s = 0; s < n; ++s) {
    if (color[s]) continue;
    dfs.emplace_back(static_cast<uint32_t>(s), 0);
    color[s] = 1;
    while (!dfs.empty()) {
      auto& [r, i] = dfs.back();
      if (i < left[r].size()) {
        const uint32_t t = left[r][i++];
        if (color[t] == 1) {
          const std::string& who = b.names[t];
          fail("grammar: rule '{}' is left-recursive (it can reach itself before taking a byte)",
               who);
        }
        if (color[t] == 0) {
          color[t] = 1;
          dfs.emplace_back(t, 0);
        }
      } else {
        color[r] = 2;
        dfs.pop_back();
      }
    }
  }

  auto g = std::make_shared<Grammar>();
  g->elems.push_back(Elem{Kind::kEscape, 0});
  g->alts.resize(n);
  for (size_t r = 0; r < n; ++r)
    for (const Seq& a : b.rules[r]) {
      g->alts[r].push_back(static_cast<uint32_t>(g->elems.size()));
      g->elems.insert(g->elems.end(), a.begin(), a.end());
      g->elems.push_back(Elem{Kind::kEnd, 0});
    }
  g->sets = std::move(b.sets);
  g->rule_names = std::move(b.names);
  g->root = it->second;
  g->source = std::string(gbnf);
  return g;
}

}  // namespace barata
