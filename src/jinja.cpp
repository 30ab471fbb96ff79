// The Jinja2 subset of chat templates (see jinja.h): a lexer for the
// template's text and tags, a recursive-descent parser to statement and
// expression trees, and a tree-walking evaluator over Python-like values.
#include "barata/jinja.h"

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

// ---- values ----------------------------------------------------------------

struct Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};
using Func = std::function<Value(Args&)>;

struct Value {
  enum class T { kUndef, kNone, kBool, kInt, kFloat, kStr, kArr, kObj, kFunc };
  T t = T::kUndef;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> a;
  std::shared_ptr<Object> o;
  std::shared_ptr<Func> fn;
  bool tuple = false;  // an array Python would print as a tuple: (a, b)

  Value() = default;
  static Value none() {
    Value v;
    v.t = T::kNone;
    return v;
  }
  Value(bool x) : t(T::kBool), b(x) {}                                        // NOLINT
  Value(int64_t x) : t(T::kInt), i(x) {}                                      // NOLINT
  Value(int x) : t(T::kInt), i(x) {}                                          // NOLINT
  Value(double x) : t(T::kFloat), f(x) {}                                     // NOLINT
  Value(std::string x) : t(T::kStr), s(std::move(x)) {}                       // NOLINT
  Value(const char* x) : t(T::kStr), s(x) {}                                  // NOLINT
  Value(Array x) : t(T::kArr), a(std::make_shared<Array>(std::move(x))) {}    // NOLINT
  Value(Object x) : t(T::kObj), o(std::make_shared<Object>(std::move(x))) {}  // NOLINT
  static Value func(Func f) {
    Value v;
    v.t = T::kFunc;
    v.fn = std::make_shared<Func>(std::move(f));
    return v;
  }
  bool undef() const { return t == T::kUndef; }
  bool is_num() const { return t == T::kInt || t == T::kFloat || t == T::kBool; }
  double num() const {
    return t == T::kFloat ? f : t == T::kBool ? (b ? 1 : 0) : static_cast<double>(i);
  }
  const Value* get(std::string_view k) const {
    if (t != T::kObj) return nullptr;
    for (const auto& [key, v] : *o)
      if (key == k) return &v;
    return nullptr;
  }
};

using T = Value::T;

[[noreturn]] void err(int line, std::string_view what) {
  if (line > 0) fail("template: line {}: {}", line, what);
  fail("template: {}", what);
}

bool truthy(const Value& v) {
  switch (v.t) {
    case T::kUndef:
    case T::kNone:
      return false;
    case T::kBool:
      return v.b;
    case T::kInt:
      return v.i != 0;
    case T::kFloat:
      return v.f != 0;
    case T::kStr:
      return !v.s.empty();
    case T::kArr:
      return !v.a->empty();
    case T::kObj:
      return !v.o->empty();
    case T::kFunc:
      return true;
  }
  return false;
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\r':
        o += "\\r";
        break;
      case '\t':
        o += "\\t";
        break;
      case '\b':
        o += "\\b";
        break;
      case '\f':
        o += "\\f";
        break;
      default:
        if (c < 0x20)
          o += fmt::format("\\u{:04x}", c);
        else
          o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

// json.dumps(v, ensure_ascii=False, indent=indent) as transformers' tojson.
void dump_json(const Value& v, int indent, int level, std::string& o) {
  const std::string nl =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * (level + 1)), ' ') : "";
  const std::string close =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * level), ' ') : "";
  const std::string sep = indent >= 0 ? "," : ", ";
  switch (v.t) {
    case T::kUndef:
    case T::kNone:
      o += "null";
      return;
    case T::kBool:
      o += v.b ? "true" : "false";
      return;
    case T::kInt:
      o += std::to_string(v.i);
      return;
    case T::kFloat:
      o += std::isnan(v.f)   ? "NaN"
           : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                             : py_float(v.f);
      return;
    case T::kStr:
      o += json_str(v.s);
      return;
    case T::kArr:
      if (v.a->empty()) {
        o += "[]";
        return;
      }
      o += "[";
      for (size_t k = 0; k < v.a->size(); ++k) {
        if (k) o += sep;
        o += nl;
        dump_json((*v.a)[k], indent, level + 1, o);
      }
      o += close + "]";
      return;
    case T::kObj:
      if (v.o->empty()) {
        o += "{}";
        return;
      }
      o += "{";
      for (size_t k = 0; k < v.o->size(); ++k) {
        if (k) o += sep;
        o += nl + json_str((*v.o)[k].first) + ": ";
        dump_json((*v.o)[k].second, indent, level + 1, o);
      }
      o += close + "}";
      return;
    case T::kFunc:
      o += "null";
      return;
  }
}

std::string py_repr_str(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string o(1, q);
  for (char c : s) {
    if (c == '\\')
      o += "\\\\";
    else if (c == q)
      o += std::string("\\") + q;
    else if (c == '\n')
      o += "\\n";
    else if (c == '\t')
      o += "\\t";
    else if (c == '\r')
      o += "\\r";
    else
      o += c;
  }
  return o + q;
}

std::string str(const Value& v, bool repr = false) {
  switch (v.t) {
    case T::kUndef:
      return "";
    case T::kNone:
      return "None";
    case T::kBool:
      return v.b ? "True" : "False";
    case T::kInt:
      return std::to_string(v.i);
    case T::kFloat:
      return py_float(v.f);
    case T::kStr:
      return repr ? py_repr_str(v.s) : v.s;
    case T::kArr: {
      std::string o = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.a->size(); ++k) o += (k ? ", " : "") + str((*v.a)[k], true);
      if (v.tuple) return o + (v.a->size() == 1 ? ",)" : ")");
      return o + "]";
    }
    case T::kObj: {
      std::string o = "{";
      for (size_t k = 0; k < v.o->size(); ++k)
        o += (k ? ", " : "") + py_repr_str((*v.o)[k].first) + ": " + str((*v.o)[k].second, true);
      return o + "}";
    }
    case T::kFunc:
      return "<function>";
  }
  return "";
}

bool equal(const Value& x, const Value& y) {
  if (x.is_num() && y.is_num()) {
    if (x.t == T::kBool || y.t == T::kBool) return x.t == y.t ? x.b == y.b : x.num() == y.num();
    return x.num() == y.num();
  }
  if (x.t != y.t)
    return (x.undef() || x.t == T::kNone) && (y.undef() || y.t == T::kNone) && x.t == y.t;
  switch (x.t) {
    case T::kUndef:
    case T::kNone:
      return true;
    case T::kStr:
      return x.s == y.s;
    case T::kArr:
      if (x.a->size() != y.a->size()) return false;
      for (size_t k = 0; k < x.a->size(); ++k)
        if (!equal((*x.a)[k], (*y.a)[k])) return false;
      return true;
    case T::kObj:
      if (x.o->size() != y.o->size()) return false;
      for (const auto& [k, v] : *x.o) {
        const Value* w = y.get(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    case T::kFunc:
      return x.fn == y.fn;
    default:
      return false;
  }
}

Value pair(Value k, Value v) {
  Value p(Array{std::move(k), std::move(v)});
  p.tuple = true;
  return p;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (const auto& x : j) a.push_back(from_json(x));
      return Value(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (const auto& [k, x] : j.items()) o.emplace_back(k, from_json(x));
      return Value(std::move(o));
    }
    default:
      return Value();
  }
}

// UTF-8 code point starts of s (and s.size() at the end).
std::vector<size_t> cp_starts(const std::string& s) {
  std::vector<size_t> at;
  for (size_t k = 0; k < s.size(); ++k)
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) at.push_back(k);
  at.push_back(s.size());
  return at;
}
int64_t length(const Value& v) {
  switch (v.t) {
    case T::kStr:
      return static_cast<int64_t>(cp_starts(v.s).size()) - 1;
    case T::kArr:
      return static_cast<int64_t>(v.a->size());
    case T::kObj:
      return static_cast<int64_t>(v.o->size());
    default:
      return 0;
  }
}

// Items to iterate: a list's, a dict's keys, a string's characters.
Array iter_items(const Value& v, int line) {
  switch (v.t) {
    case T::kUndef:
    case T::kNone:
      return {};
    case T::kArr:
      return *v.a;
    case T::kObj: {
      Array a;
      for (const auto& [k, x] : *v.o) a.emplace_back(k);
      return a;
    }
    case T::kStr: {
      Array a;
      const auto at = cp_starts(v.s);
      for (size_t k = 0; k + 1 < at.size(); ++k)
        a.emplace_back(v.s.substr(at[k], at[k + 1] - at[k]));
      return a;
    }
    default:
      err(line, fmt::format("cannot iterate over {}", str(v, true)));
  }
}

Value arg(Args& a, size_t k, std::string_view name, const Value& dflt) {
  for (const auto& [n, v] : a.kw)
    if (n == name) return v;
  return k < a.pos.size() ? a.pos[k] : dflt;
}

std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && chars.find(s[b]) != std::string::npos) ++b;
  if (right)
    while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}
const std::string kSpace = " \t\n\r\f\v";

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string title(std::string s) {
  bool start = true;
  for (char& c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = true;
    }
  }
  return s;
}
std::string replace_all(std::string s, const std::string& a, const std::string& b,
                        int64_t count = -1) {
  if (a.empty()) return s;
  std::string o;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t at = s.find(a, pos);
    if (at == std::string::npos) break;
    o += s.substr(pos, at - pos) + b;
    pos = at + a.size();
  }
  return o + s.substr(pos);
}

// A bound method of a string, dict or list, or undefined.
Value method(const Value& self, const std::string& name, int line) {
  if (self.t == T::kStr) {
    const std::string s = self.s;
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value::func([s, name](Args& a) {
        const Value& c = arg(a, 0, "chars", Value());
        const std::string chars = c.t == T::kStr ? c.s : kSpace;
        return Value(strip_chars(s, chars, name != "rstrip", name != "lstrip"));
      });
    if (name == "upper") return Value::func([s](Args&) { return Value(upper(s)); });
    if (name == "lower") return Value::func([s](Args&) { return Value(lower(s)); });
    if (name == "title") return Value::func([s](Args&) { return Value(title(s)); });
    if (name == "capitalize")
      return Value::func([s](Args&) {
        std::string o = lower(s);
        if (!o.empty()) o[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(o[0])));
        return Value(o);
      });
    if (name == "startswith" || name == "endswith")
      return Value::func([s, name](Args& a) {
        const Value& p = arg(a, 0, "prefix", Value(""));
        auto one = [&](const std::string& x) {
          return name == "startswith"
                     ? s.rfind(x, 0) == 0
                     : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
        };
        if (p.t == T::kArr) {
          for (const Value& x : *p.a)
            if (x.t == T::kStr && one(x.s)) return Value(true);
          return Value(false);
        }
        return Value(one(str(p)));
      });
    if (name == "split")
      return Value::func([s](Args& a) {
        const Value& sep = arg(a, 0, "sep", Value());
        const Value& mx = arg(a, 1, "maxsplit", Value(int64_t{-1}));
        int64_t left = mx.t == T::kInt ? mx.i : -1;
        Array out;
        if (sep.t != T::kStr) {  // runs of whitespace
          size_t k = 0;
          while (true) {
            while (k < s.size() && kSpace.find(s[k]) != std::string::npos) ++k;
            if (k >= s.size()) break;
            if (left == 0) {
              out.emplace_back(strip_chars(s.substr(k), kSpace, false, true));
              break;
            }
            size_t e = k;
            while (e < s.size() && kSpace.find(s[e]) == std::string::npos) ++e;
            out.emplace_back(s.substr(k, e - k));
            k = e;
            --left;
          }
          return Value(std::move(out));
        }
        size_t pos = 0;
        while (left != 0) {
          const size_t at = sep.s.empty() ? std::string::npos : s.find(sep.s, pos);
          if (at == std::string::npos) break;
          out.emplace_back(s.substr(pos, at - pos));
          pos = at + sep.s.size();
          --left;
        }
        out.emplace_back(s.substr(pos));
        return Value(std::move(out));
      });
    if (name == "replace")
      return Value::func([s](Args& a) {
        const Value& n = arg(a, 2, "count", Value(int64_t{-1}));
        return Value(replace_all(s, str(arg(a, 0, "old", Value(""))),
                                 str(arg(a, 1, "new", Value(""))), n.t == T::kInt ? n.i : -1));
      });
    if (name == "find")
      return Value::func([s](Args& a) {
        const size_t at = s.find(str(arg(a, 0, "sub", Value(""))));
        return Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(at));
      });
    if (name == "count")
      return Value::func([s](Args& a) {
        const std::string sub = str(arg(a, 0, "sub", Value("")));
        int64_t n = 0;
        if (!sub.empty())
          for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
            ++n;
        return Value(n);
      });
    if (name == "join")
      return Value::func([s, line](Args& a) {
        std::string o;
        const Array items = iter_items(arg(a, 0, "iterable", Value()), line);
        for (size_t k = 0; k < items.size(); ++k) o += (k ? s : "") + str(items[k]);
        return Value(o);
      });
    if (name == "splitlines")
      return Value::func([s](Args&) {
        Array out;
        size_t pos = 0;
        while (pos < s.size()) {
          size_t e = s.find('\n', pos);
          if (e == std::string::npos) e = s.size();
          std::string l = s.substr(pos, e - pos);
          if (!l.empty() && l.back() == '\r') l.pop_back();
          out.emplace_back(l);
          pos = e + 1;
        }
        return Value(std::move(out));
      });
    if (name == "isdigit")
      return Value::func([s](Args&) {
        return Value(!s.empty() &&
                     std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }));
      });
  }
  if (self.t == T::kObj) {
    const auto o = self.o;
    if (name == "get")
      return Value::func([o](Args& a) {
        const std::string k = str(arg(a, 0, "key", Value("")));
        for (const auto& [key, v] : *o)
          if (key == k) return v;
        return a.pos.size() > 1 ? a.pos[1] : Value::none();
      });
    if (name == "items")
      return Value::func([o](Args&) {
        Array out;
        for (const auto& [k, v] : *o) out.push_back(pair(Value(k), v));
        return Value(std::move(out));
      });
    if (name == "keys")
      return Value::func([o](Args&) {
        Array out;
        for (const auto& [k, v] : *o) out.emplace_back(k);
        return Value(std::move(out));
      });
    if (name == "values")
      return Value::func([o](Args&) {
        Array out;
        for (const auto& [k, v] : *o) out.push_back(v);
        return Value(std::move(out));
      });
  }
  if (self.t == T::kArr) {
    const auto arr = self.a;
    if (name == "append")
      return Value::func([arr](Args& a) {
        arr->push_back(a.pos.empty() ? Value::none() : a.pos[0]);
        return Value::none();
      });
  }
  (void)line;
  return Value();
}

Value attr(const Value& v, const std::string& name, int line) {
  if (const Value* x = v.get(name)) return *x;
  return method(v, name, line);
}

Value subscript(const Value& v, const Value& k, int line) {
  if (v.t == T::kObj) {
    if (const Value* x = v.get(str(k))) return *x;
    return Value();
  }
  if ((v.t == T::kArr || v.t == T::kStr) && k.t == T::kInt) {
    const int64_t n = length(v);
    int64_t i = k.i < 0 ? k.i + n : k.i;
    if (i < 0 || i >= n) return Value();
    if (v.t == T::kArr) return (*v.a)[static_cast<size_t>(i)];
    const auto at = cp_starts(v.s);
    return Value(v.s.substr(at[static_cast<size_t>(i)],
                            at[static_cast<size_t>(i) + 1] - at[static_cast<size_t>(i)]));
  }
  if (v.t == T::kStr && k.t == T::kStr) return method(v, k.s, line);
  return Value();
}

// ---- lexing the template ---------------------------------------------------

struct Piece {
  enum Kind { kText, kVar, kBlock } kind;
  std::string text;  // the text, or the tag's inside
  int line;
};

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

struct Tok {
  enum Kind { kName, kNum, kStr, kOp, kEnd } kind;
  std::string s;
  Value num;
};

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

struct Ctx;

struct Expr {
  int line = 0;
  virtual ~Expr() = default;
  virtual Value eval(Ctx& c) const = 0;
};
using ExprP = std::unique_ptr<Expr>;

struct Node {
  int line = 0;
  virtual ~Node() = default;
  virtual void render(Ctx& c, std::string& out) const = 0;
};
using NodeP = std::unique_ptr<Node>;

struct Ctx {
  std::vector<std::map<std::string, Value, std::less<>>> scopes;
  int loop_ctl = 0;  // 1 break, 2 continue
  int depth = 0;     // macro calls
  Value lookup(std::string_view n) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return f->second;
    }
    return Value();
  }
  void set(const std::string& n, Value v) { scopes.back()[n] = std::move(v); }
};

struct Lit final : Expr {
  Value v;
  Value eval(Ctx&) const override { return v; }
};
struct Name final : Expr {
  std::string n;
  Value eval(Ctx& c) const override { return c.lookup(n); }
};
struct ListE final : Expr {
  std::vector<ExprP> items;
  bool tuple = false;
  Value eval(Ctx& c) const override {
    Array a;
    for (const auto& e : items) a.push_back(e->eval(c));
    Value v(std::move(a));
    v.tuple = tuple;
    return v;
  }
};
struct DictE final : Expr {
  std::vector<std::pair<ExprP, ExprP>> items;
  Value eval(Ctx& c) const override {
    Object o;
    for (const auto& [k, v] : items) {
      const std::string key = str(k->eval(c));
      Value x = v->eval(c);
      auto it = std::find_if(o.begin(), o.end(), [&](const auto& p) { return p.first == key; });
      if (it != o.end())
        it->second = std::move(x);
      else
        o.emplace_back(key, std::move(x));
    }
    return Value(std::move(o));
  }
};
struct Attr final : Expr {
  ExprP obj;
  std::string name;
  Value eval(Ctx& c) const override { return attr(obj->eval(c), name, line); }
};
struct Index final : Expr {
  ExprP obj, key;
  Value eval(Ctx& c) const override { return subscript(obj->eval(c), key->eval(c), line); }
};
struct SliceE final : Expr {
  ExprP obj, a, b, step;
  Value eval(Ctx& c) const override {
    const Value v = obj->eval(c);
    const int64_t n = length(v);
    auto get = [&](const ExprP& e, bool& given) -> int64_t {
      given = false;
      if (!e) return 0;
      const Value x = e->eval(c);
      if (x.t == T::kNone || x.undef()) return 0;
      if (x.t != T::kInt) err(line, "slice indices must be integers");
      given = true;
      return x.i;
    };
    bool ga, gb, gs;
    int64_t st = get(step, gs);
    if (!gs) st = 1;
    if (st == 0) err(line, "slice step cannot be zero");
    int64_t lo = get(a, ga), hi = get(b, gb);
    auto clamp = [&](int64_t x, bool given, int64_t dflt) {
      if (!given) return dflt;
      if (x < 0) x += n;
      if (st > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    lo = clamp(lo, ga, st > 0 ? 0 : n - 1);
    hi = clamp(hi, gb, st > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t k = lo; st > 0 ? k < hi : k > hi; k += st) idx.push_back(k);
    if (v.t == T::kArr) {
      Array out;
      for (int64_t k : idx) out.push_back((*v.a)[static_cast<size_t>(k)]);
      return Value(std::move(out));
    }
    if (v.t == T::kStr) {
      const auto at = cp_starts(v.s);
      std::string out;
      for (int64_t k : idx)
        out += v.s.substr(at[static_cast<size_t>(k)],
                          at[static_cast<size_t>(k) + 1] - at[static_cast<size_t>(k)]);
      return Value(out);
    }
    return Value();
  }
};
struct CallArgs {
  std::vector<ExprP> pos;
  std::vector<std::pair<std::string, ExprP>> kw;
  Args eval(Ctx& c) const {
    Args a;
    for (const auto& e : pos) a.pos.push_back(e->eval(c));
    for (const auto& [k, e] : kw) a.kw.emplace_back(k, e->eval(c));
    return a;
  }
};
struct Call final : Expr {
  ExprP fn;
  CallArgs args;
  Value eval(Ctx& c) const override {
    const Value f = fn->eval(c);
    if (f.t != T::kFunc) {
      const Name* n = dynamic_cast<const Name*>(fn.get());
      const Attr* at = dynamic_cast<const Attr*>(fn.get());
      err(line, fmt::format("'{}' is not callable", n ? n->n : at ? at->name : "expression"));
    }
    Args a = args.eval(c);
    return (*f.fn)(a);
  }
};

Value apply_filter(Ctx& c, const std::string& name, const Value& v, Args& a, int line);
bool apply_test(const std::string& name, const Value& v, Args& a, int line);

struct FilterE final : Expr {
  ExprP e;
  std::string name;
  CallArgs args;
  Value eval(Ctx& c) const override {
    const Value v = e->eval(c);
    Args a = args.eval(c);
    return apply_filter(c, name, v, a, line);
  }
};
struct TestE final : Expr {
  ExprP e;
  std::string name;
  CallArgs args;
  bool negate = false;
  Value eval(Ctx& c) const override {
    const Value v = e->eval(c);
    Args a = args.eval(c);
    return Value(apply_test(name, v, a, line) != negate);
  }
};
struct Unary final : Expr {
  char op;
  ExprP e;
  Value eval(Ctx& c) const override {
    const Value v = e->eval(c);
    if (op == '!') return Value(!truthy(v));
    if (!v.is_num()) err(line, fmt::format("bad operand for unary {}", op));
    if (op == '-') return v.t == T::kFloat ? Value(-v.f) : Value(-static_cast<int64_t>(v.num()));
    return v;
  }
};
struct Logic final : Expr {
  bool is_and;
  ExprP l, r;
  Value eval(Ctx& c) const override {
    Value x = l->eval(c);
    if (is_and ? !truthy(x) : truthy(x)) return x;
    return r->eval(c);
  }
};
struct Cond final : Expr {
  ExprP then, cond, otherwise;
  Value eval(Ctx& c) const override {
    if (truthy(cond->eval(c))) return then->eval(c);
    return otherwise ? otherwise->eval(c) : Value();
  }
};

bool contains(const Value& hay, const Value& x, int line) {
  if (hay.t == T::kStr) return hay.s.find(str(x)) != std::string::npos;
  if (hay.t == T::kArr) {
    for (const Value& y : *hay.a)
      if (equal(x, y)) return true;
    return false;
  }
  if (hay.t == T::kObj) return hay.get(str(x)) != nullptr;
  if (hay.undef() || hay.t == T::kNone) return false;
  err(line, fmt::format("'in' needs a string, list or dict, not {}", str(hay, true)));
}

int compare(const Value& x, const Value& y, int line) {
  if (x.is_num() && y.is_num()) return x.num() < y.num() ? -1 : x.num() > y.num() ? 1 : 0;
  if (x.t == T::kStr && y.t == T::kStr) return x.s < y.s ? -1 : x.s > y.s ? 1 : 0;
  err(line, fmt::format("cannot order {} and {}", str(x, true), str(y, true)));
}

struct Binary final : Expr {
  std::string op;
  ExprP l, r;
  Value eval(Ctx& c) const override {
    const Value x = l->eval(c), y = r->eval(c);
    if (op == "==") return Value(equal(x, y));
    if (op == "!=") return Value(!equal(x, y));
    if (op == "<") return Value(compare(x, y, line) < 0);
    if (op == ">") return Value(compare(x, y, line) > 0);
    if (op == "<=") return Value(compare(x, y, line) <= 0);
    if (op == ">=") return Value(compare(x, y, line) >= 0);
    if (op == "in") return Value(contains(y, x, line));
    if (op == "not in") return Value(!contains(y, x, line));
    if (op == "~") return Value(str(x) + str(y));
    if (op == "+") {
      if (x.t == T::kStr && y.t == T::kStr) return Value(x.s + y.s);
      if (x.t == T::kArr && y.t == T::kArr) {
        Array a = *x.a;
        a.insert(a.end(), y.a->begin(), y.a->end());
        return Value(std::move(a));
      }
    }
    if (op == "*" && x.t == T::kStr && y.t == T::kInt) {
      std::string o;
      for (int64_t k = 0; k < y.i; ++k) o += x.s;
      return Value(o);
    }
    if (!x.is_num() || !y.is_num())
      err(line, fmt::format("unsupported operand types for {}: {} and {}", op, str(x, true),
                            str(y, true)));
    const bool ints = x.t != T::kFloat && y.t != T::kFloat;
    const double a = x.num(), b = y.num();
    if (op == "+")
      return ints ? Value(static_cast<int64_t>(a) + static_cast<int64_t>(b)) : Value(a + b);
    if (op == "-")
      return ints ? Value(static_cast<int64_t>(a) - static_cast<int64_t>(b)) : Value(a - b);
    if (op == "*")
      return ints ? Value(static_cast<int64_t>(a) * static_cast<int64_t>(b)) : Value(a * b);
    if (b == 0 && (op == "/" || op == "//" || op == "%")) err(line, "division by zero");
    if (op == "/") return Value(a / b);
    if (op == "//")
      return ints ? Value(static_cast<int64_t>(std::floor(a / b))) : Value(std::floor(a / b));
    if (op == "%") {
      if (ints) {
        const int64_t m = static_cast<int64_t>(a) % static_cast<int64_t>(b);
        return Value(m != 0 && ((m < 0) != (b < 0)) ? m + static_cast<int64_t>(b) : m);
      }
      return Value(a - b * std::floor(a / b));
    }
    if (op == "**")
      return ints && b >= 0 ? Value(static_cast<int64_t>(std::pow(a, b))) : Value(std::pow(a, b));
    err(line, fmt::format("unknown operator {}", op));
  }
};

class ExprParser {
 public:
  ExprParser(std::vector<Tok> toks, int line) : t_(std::move(toks)), line_(line) {}
  bool at_end() const { return t_[k_].kind == Tok::kEnd; }
  const Tok& peek(size_t d = 0) const { return t_[std::min(k_ + d, t_.size() - 1)]; }
  bool is_op(std::string_view o, size_t d = 0) const {
    return peek(d).kind == Tok::kOp && peek(d).s == o;
  }
  bool is_name(std::string_view n, size_t d = 0) const {
    return peek(d).kind == Tok::kName && peek(d).s == n;
  }
  void expect_op(std::string_view o) {
    if (!is_op(o)) err(line_, fmt::format("expected '{}', found '{}'", o, peek().s));
    ++k_;
  }
  std::string name() {
    if (peek().kind != Tok::kName) err(line_, fmt::format("expected a name, found '{}'", peek().s));
    return t_[k_++].s;
  }
  void expect_end() {
    if (!at_end()) err(line_, fmt::format("unexpected '{}'", peek().s));
  }

  template <typename E>
  std::unique_ptr<E> mk() {
    auto e = std::make_unique<E>();
    e->line = line_;
    return e;
  }

  // expr := or ['if' or ['else' expr]]
  ExprP expr() {
    if (++depth_ > 200) err(line_, "an expression nested too deeply");
    ExprP e = or_();
    if (is_name("if")) {
      ++k_;
      auto c = mk<Cond>();
      c->then = std::move(e);
      c->cond = or_();
      if (is_name("else")) {
        ++k_;
        c->otherwise = expr();
      }
      e = std::move(c);
    }
    --depth_;
    return e;
  }
  ExprP or_() {
    ExprP e = and_();
    while (is_name("or")) {
      ++k_;
      auto l = mk<Logic>();
      l->is_and = false;
      l->l = std::move(e);
      l->r = and_();
      e = std::move(l);
    }
    return e;
  }
  ExprP and_() {
    ExprP e = not_();
    while (is_name("and")) {
      ++k_;
      auto l = mk<Logic>();
      l->is_and = true;
      l->l = std::move(e);
      l->r = not_();
      e = std::move(l);
    }
    return e;
  }
  ExprP not_() {
    if (is_name("not")) {
      ++k_;
      if (++depth_ > 200) err(line_, "an expression nested too deeply");
      auto u = mk<Unary>();
      u->op = '!';
      u->e = not_();
      --depth_;
      return u;
    }
    return compare_();
  }
  ExprP compare_() {
    ExprP e = add_();
    while (true) {
      std::string op;
      if (peek().kind == Tok::kOp && (peek().s == "==" || peek().s == "!=" || peek().s == "<" ||
                                      peek().s == ">" || peek().s == "<=" || peek().s == ">=")) {
        op = t_[k_++].s;
      } else if (is_name("in")) {
        ++k_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        k_ += 2;
        op = "not in";
      } else {
        return e;
      }
      auto b = mk<Binary>();
      b->op = op;
      b->l = std::move(e);
      b->r = add_();
      e = std::move(b);
    }
  }
  ExprP add_() {
    ExprP e = concat_();
    while (is_op("+") || is_op("-")) {
      auto b = mk<Binary>();
      b->op = t_[k_++].s;
      b->l = std::move(e);
      b->r = concat_();
      e = std::move(b);
    }
    return e;
  }
  ExprP concat_() {
    ExprP e = mul_();
    while (is_op("~")) {
      ++k_;
      auto b = mk<Binary>();
      b->op = "~";
      b->l = std::move(e);
      b->r = mul_();
      e = std::move(b);
    }
    return e;
  }
  ExprP mul_() {
    ExprP e = pow_();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      auto b = mk<Binary>();
      b->op = t_[k_++].s;
      b->l = std::move(e);
      b->r = pow_();
      e = std::move(b);
    }
    return e;
  }
  ExprP pow_() {
    ExprP e = unary_();
    while (is_op("**")) {
      ++k_;
      auto b = mk<Binary>();
      b->op = "**";
      b->l = std::move(e);
      b->r = unary_();
      e = std::move(b);
    }
    return e;
  }
  ExprP unary_() {
    if (is_op("-") || is_op("+")) {
      if (++depth_ > 200) err(line_, "an expression nested too deeply");
      auto u = mk<Unary>();
      u->op = t_[k_++].s[0];
      u->e = unary_();
      --depth_;
      return u;
    }
    ExprP e = postfix_(primary_());
    // Filters and tests.
    while (true) {
      if (is_op("|")) {
        ++k_;
        auto f = mk<FilterE>();
        f->e = std::move(e);
        f->name = name();
        if (is_op("(")) f->args = call_args();
        e = postfix_(std::move(f));
      } else if (is_name("is")) {
        ++k_;
        auto t = mk<TestE>();
        if (is_name("not")) {
          ++k_;
          t->negate = true;
        }
        t->e = std::move(e);
        t->name = name();
        if (is_op("(")) {
          t->args = call_args();
        } else if (!at_end() &&
                   (peek().kind == Tok::kStr || peek().kind == Tok::kNum ||
                    (peek().kind == Tok::kName && !is_name("and") && !is_name("or") &&
                     !is_name("else") && !is_name("if") && !is_name("in") && !is_name("not")))) {
          t->args.pos.push_back(postfix_(primary_()));  // `is equalto 3`, `is sameas none`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  CallArgs call_args() {
    CallArgs a;
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Tok::kName && is_op("=", 1)) {
        std::string n = name();
        ++k_;
        a.kw.emplace_back(n, expr());
      } else {
        a.pos.push_back(expr());
      }
      if (!is_op(",")) break;
      ++k_;
    }
    expect_op(")");
    return a;
  }
  ExprP postfix_(ExprP e) {
    while (true) {
      if (is_op(".")) {
        ++k_;
        auto a = mk<Attr>();
        a->obj = std::move(e);
        if (peek().kind == Tok::kNum) {  // x.0
          auto i = mk<Index>();
          i->obj = std::move(a->obj);
          auto l = mk<Lit>();
          l->v = t_[k_++].num;
          i->key = std::move(l);
          e = std::move(i);
          continue;
        }
        a->name = name();
        e = std::move(a);
      } else if (is_op("[")) {
        ++k_;
        ExprP lo, hi, st;
        bool slice = false;
        if (!is_op(":")) lo = expr();
        if (is_op(":")) {
          slice = true;
          ++k_;
          if (!is_op(":") && !is_op("]")) hi = expr();
          if (is_op(":")) {
            ++k_;
            if (!is_op("]")) st = expr();
          }
        }
        expect_op("]");
        if (slice) {
          auto s = mk<SliceE>();
          s->obj = std::move(e);
          s->a = std::move(lo);
          s->b = std::move(hi);
          s->step = std::move(st);
          e = std::move(s);
        } else {
          auto i = mk<Index>();
          i->obj = std::move(e);
          i->key = std::move(lo);
          e = std::move(i);
        }
      } else if (is_op("(")) {
        auto c = mk<Call>();
        c->fn = std::move(e);
        c->args = call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprP primary_() {
    const Tok& t = peek();
    if (t.kind == Tok::kNum) {
      ++k_;
      auto l = mk<Lit>();
      l->v = t.num;
      return l;
    }
    if (t.kind == Tok::kStr) {
      std::string s;
      while (peek().kind == Tok::kStr) s += t_[k_++].s;  // adjacent literals join
      auto l = mk<Lit>();
      l->v = Value(s);
      return l;
    }
    if (t.kind == Tok::kName) {
      ++k_;
      auto l = mk<Lit>();
      if (t.s == "true" || t.s == "True") {
        l->v = Value(true);
        return l;
      }
      if (t.s == "false" || t.s == "False") {
        l->v = Value(false);
        return l;
      }
      if (t.s == "none" || t.s == "None") {
        l->v = Value::none();
        return l;
      }
      auto n = mk<Name>();
      n->n = t.s;
      return n;
    }
    if (is_op("(")) {
      ++k_;
      if (is_op(")")) {  // ()
        ++k_;
        auto l = mk<ListE>();
        l->tuple = true;
        return l;
      }
      ExprP e = expr();
      if (is_op(",")) {  // a tuple
        auto l = mk<ListE>();
        l->tuple = true;
        l->items.push_back(std::move(e));
        while (is_op(",")) {
          ++k_;
          if (is_op(")")) break;
          l->items.push_back(expr());
        }
        e = std::move(l);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++k_;
      auto l = mk<ListE>();
      while (!is_op("]")) {
        l->items.push_back(expr());
        if (!is_op(",")) break;
        ++k_;
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      ++k_;
      auto d = mk<DictE>();
      while (!is_op("}")) {
        ExprP k = expr();
        expect_op(":");
        d->items.emplace_back(std::move(k), expr());
        if (!is_op(",")) break;
        ++k_;
      }
      expect_op("}");
      return d;
    }
    err(line_,
        t.kind == Tok::kEnd ? "an expression ends too early" : fmt::format("unexpected '{}'", t.s));
  }

  size_t pos() const { return k_; }

 private:
  std::vector<Tok> t_;
  size_t k_ = 0;
  int line_;
  int depth_ = 0;
};

// ---- filters and tests -------------------------------------------------------

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&#34;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

Value apply_filter(Ctx& c, const std::string& name, const Value& v, Args& a, int line) {
  if (name == "trim") {
    const Value& ch = arg(a, 0, "chars", Value());
    return Value(strip_chars(str(v), ch.t == T::kStr ? ch.s : kSpace, true, true));
  }
  if (name == "upper") return Value(upper(str(v)));
  if (name == "lower") return Value(lower(str(v)));
  if (name == "title") return Value(title(str(v)));
  if (name == "capitalize") {
    std::string o = lower(str(v));
    if (!o.empty()) o[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(o[0])));
    return Value(o);
  }
  if (name == "length" || name == "count") return Value(length(v));
  if (name == "string") return Value(str(v));
  if (name == "safe") return v;
  if (name == "e" || name == "escape") return Value(html_escape(str(v)));
  if (name == "tojson") {
    const Value& ind = arg(a, 0, "indent", Value());
    std::string o;
    dump_json(v, ind.t == T::kInt ? static_cast<int>(ind.i) : -1, 0, o);
    return Value(o);
  }
  if (name == "first" || name == "last") {
    const Array items = iter_items(v, line);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value& sep = arg(a, 0, "d", Value(""));
    const Value& at = arg(a, 1, "attribute", Value());
    std::string o;
    const Array items = iter_items(v, line);
    for (size_t k = 0; k < items.size(); ++k)
      o += (k ? str(sep) : "") + str(at.undef() ? items[k] : attr(items[k], str(at), line));
    return Value(o);
  }
  if (name == "default" || name == "d") {
    const Value& dv = arg(a, 0, "default_value", Value(""));
    const Value& boolean = arg(a, 1, "boolean", Value(false));
    if (v.undef() || (truthy(boolean) && !truthy(v))) return dv;
    return v;
  }
  if (name == "list") return Value(iter_items(v, line));
  if (name == "items") {
    if (v.undef() || v.t == T::kNone) return Value(Array{});
    if (v.t != T::kObj) err(line, "items needs a dict");
    Array out;
    for (const auto& [k, x] : *v.o) out.push_back(pair(Value(k), x));
    return Value(std::move(out));
  }
  if (name == "reverse") {
    if (v.t == T::kStr) {
      Array ch = iter_items(v, line);
      std::string o;
      for (auto it = ch.rbegin(); it != ch.rend(); ++it) o += it->s;
      return Value(o);
    }
    Array items = iter_items(v, line);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "int") {
    if (v.t == T::kStr) {
      try {
        return Value(static_cast<int64_t>(std::stoll(strip_chars(v.s, kSpace, true, true))));
      } catch (const std::exception&) {
        return arg(a, 0, "default", Value(int64_t{0}));
      }
    }
    return v.is_num() ? Value(static_cast<int64_t>(v.num()))
                      : arg(a, 0, "default", Value(int64_t{0}));
  }
  if (name == "float") {
    if (v.t == T::kStr) {
      try {
        return Value(std::stod(v.s));
      } catch (const std::exception&) {
        return Value(0.0);
      }
    }
    return Value(v.is_num() ? v.num() : 0.0);
  }
  if (name == "abs") {
    if (v.t == T::kInt) return Value(v.i < 0 ? -v.i : v.i);
    return Value(std::fabs(v.num()));
  }
  if (name == "replace")
    return Value(
        replace_all(str(v), str(arg(a, 0, "old", Value(""))), str(arg(a, 1, "new", Value("")))));
  if (name == "indent") {
    const Value& w = arg(a, 0, "width", Value(int64_t{4}));
    const bool first = truthy(arg(a, 1, "first", Value(false)));
    const bool blank = truthy(arg(a, 2, "blank", Value(false)));
    const std::string pad =
        w.t == T::kStr ? w.s : std::string(static_cast<size_t>(std::max<int64_t>(0, w.i)), ' ');
    const std::string s = str(v);
    std::string o;
    size_t pos = 0;
    bool is_first = true;
    while (true) {
      const size_t e = s.find('\n', pos);
      const std::string l = s.substr(pos, e == std::string::npos ? std::string::npos : e - pos);
      if ((is_first && first) ||
          (!is_first && (blank || !strip_chars(l, kSpace, true, true).empty())))
        o += pad;
      o += l;
      if (e == std::string::npos) break;
      o += '\n';
      pos = e + 1;
      is_first = false;
    }
    return Value(o);
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name.find("attr") != std::string::npos;
    const bool keep = name == "selectattr" || name == "select";
    Array out;
    const std::string at = by_attr ? str(arg(a, 0, "attribute", Value(""))) : "";
    const size_t test_at = by_attr ? 1 : 0;
    for (const Value& x : iter_items(v, line)) {
      const Value y = by_attr ? attr(x, at, line) : x;
      bool ok;
      if (a.pos.size() > test_at) {
        Args ta;
        ta.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(test_at) + 1, a.pos.end());
        ok = apply_test(str(a.pos[test_at]), y, ta, line);
      } else {
        ok = truthy(y);
      }
      if (ok == keep) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "map") {
    Array out;
    const Value& at = arg(a, 99, "attribute", Value());
    const Value& dflt = arg(a, 99, "default", Value());
    for (const Value& x : iter_items(v, line)) {
      if (!at.undef()) {
        Value y = attr(x, str(at), line);
        out.push_back(y.undef() ? dflt : y);
      } else if (!a.pos.empty()) {
        Args fa;
        fa.pos.assign(a.pos.begin() + 1, a.pos.end());
        out.push_back(apply_filter(c, str(a.pos[0]), x, fa, line));
      } else {
        out.push_back(x);
      }
    }
    return Value(std::move(out));
  }
  if (name == "unique") {
    Array out;
    for (const Value& x : iter_items(v, line))
      if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); }))
        out.push_back(x);
    return Value(std::move(out));
  }
  if (name == "sort") {
    Array items = iter_items(v, line);
    const Value& at = arg(a, 2, "attribute", Value());
    const bool rev = truthy(arg(a, 0, "reverse", Value(false)));
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value xa = at.undef() ? x : attr(x, str(at), line),
                  ya = at.undef() ? y : attr(y, str(at), line);
      return rev ? compare(ya, xa, line) < 0 : compare(xa, ya, line) < 0;
    });
    return Value(std::move(items));
  }
  if (name == "dictsort") {
    if (v.t != T::kObj) err(line, "dictsort needs a dict");
    Object o = *v.o;
    std::stable_sort(o.begin(), o.end(),
                     [](const auto& x, const auto& y) { return x.first < y.first; });
    Array out;
    for (const auto& [k, x] : o) out.push_back(pair(Value(k), x));
    return Value(std::move(out));
  }
  if (name == "wordcount") {
    Args none;
    return Value(length((*method(Value(str(v)), "split", line).fn)(none)));
  }
  err(line, fmt::format("unknown filter '{}'", name));
}

bool apply_test(const std::string& name, const Value& v, Args& a, int line) {
  if (name == "defined") return !v.undef();
  if (name == "undefined") return v.undef();
  if (name == "none") return v.t == T::kNone;
  if (name == "string") return v.t == T::kStr;
  if (name == "number") return v.t == T::kInt || v.t == T::kFloat;
  if (name == "integer") return v.t == T::kInt;
  if (name == "float") return v.t == T::kFloat;
  if (name == "boolean") return v.t == T::kBool;
  if (name == "true") return v.t == T::kBool && v.b;
  if (name == "false") return v.t == T::kBool && !v.b;
  if (name == "mapping") return v.t == T::kObj;
  if (name == "sequence") return v.t == T::kArr || v.t == T::kStr || v.t == T::kObj;
  if (name == "iterable") return v.t == T::kArr || v.t == T::kStr || v.t == T::kObj;
  if (name == "callable") return v.t == T::kFunc;
  if (name == "odd") return v.t == T::kInt && (v.i % 2 != 0);
  if (name == "even") return v.t == T::kInt && v.i % 2 == 0;
  if (name == "lower") return v.t == T::kStr && lower(v.s) == v.s;
  if (name == "upper") return v.t == T::kStr && upper(v.s) == v.s;
  const Value& other = arg(a, 0, "other", Value());
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return equal(v, other);
  if (name == "ne" || name == "!=") return !equal(v, other);
  if (name == "in") return contains(other, v, line);
  if (name == "gt" || name == "greaterthan") return compare(v, other, line) > 0;
  if (name == "lt" || name == "lessthan") return compare(v, other, line) < 0;
  if (name == "ge") return compare(v, other, line) >= 0;
  if (name == "le") return compare(v, other, line) <= 0;
  err(line, fmt::format("unknown test '{}'", name));
}

// ---- statements --------------------------------------------------------------

struct Seq final : Node {
  std::vector<NodeP> body;
  void render(Ctx& c, std::string& out) const override {
    for (const auto& n : body) {
      n->render(c, out);
      if (c.loop_ctl) return;
    }
  }
};
struct Text final : Node {
  std::string s;
  void render(Ctx&, std::string& out) const override { out += s; }
};
struct Output final : Node {
  ExprP e;
  void render(Ctx& c, std::string& out) const override { out += str(e->eval(c)); }
};
struct If final : Node {
  std::vector<std::pair<ExprP, std::unique_ptr<Seq>>> branches;  // null cond: else
  void render(Ctx& c, std::string& out) const override {
    for (const auto& [cond, body] : branches)
      if (!cond || truthy(cond->eval(c))) {
        body->render(c, out);
        return;
      }
  }
};
struct For final : Node {
  std::vector<std::string> vars;
  ExprP iter, filter;
  std::unique_ptr<Seq> body, otherwise;
  void render(Ctx& c, std::string& out) const override {
    const Value it = iter->eval(c);
    Array items = iter_items(it, line);
    if (it.t == T::kObj && vars.size() == 2) {  // for k, v in dict: its items
      items.clear();
      for (const auto& [k, x] : *it.o) items.emplace_back(Array{Value(k), x});
    }
    auto bind = [&](const Value& x) {
      if (vars.size() == 1) {
        c.set(vars[0], x);
        return;
      }
      const Array parts = iter_items(x, line);
      if (parts.size() != vars.size())
        err(line, fmt::format("cannot unpack {} values into {} names", parts.size(), vars.size()));
      for (size_t k = 0; k < vars.size(); ++k) c.set(vars[k], parts[k]);
    };
    if (filter) {
      Array kept;
      c.scopes.emplace_back();
      for (const Value& x : items) {
        bind(x);
        if (truthy(filter->eval(c))) kept.push_back(x);
      }
      c.scopes.pop_back();
      items = std::move(kept);
    }
    if (items.empty()) {
      if (otherwise) otherwise->render(c, out);
      return;
    }
    c.scopes.emplace_back();
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      bind(items[static_cast<size_t>(k)]);
      Object loop = {{"index", Value(k + 1)},
                     {"index0", Value(k)},
                     {"revindex", Value(n - k)},
                     {"revindex0", Value(n - k - 1)},
                     {"first", Value(k == 0)},
                     {"last", Value(k == n - 1)},
                     {"length", Value(n)},
                     {"previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value()},
                     {"nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value()}};
      c.set("loop", Value(std::move(loop)));
      body->render(c, out);
      if (c.loop_ctl == 1) {
        c.loop_ctl = 0;
        break;
      }
      c.loop_ctl = 0;
    }
    c.scopes.pop_back();
  }
};
struct LoopCtl final : Node {
  int what;
  void render(Ctx& c, std::string&) const override { c.loop_ctl = what; }
};
struct Set final : Node {
  std::vector<std::string> names;  // one or a tuple
  std::string attr_of;             // {% set ns.x = ... %}: ns
  ExprP e;
  std::unique_ptr<Seq> block;  // {% set x %}...{% endset %}
  void render(Ctx& c, std::string&) const override {
    Value v;
    if (block) {
      std::string s;
      block->render(c, s);
      v = Value(s);
    } else {
      v = e->eval(c);
    }
    if (!attr_of.empty()) {
      Value ns = c.lookup(attr_of);
      if (ns.t != T::kObj) err(line, fmt::format("'{}' is not a namespace", attr_of));
      for (auto& [k, x] : *ns.o)
        if (k == names[0]) {
          x = v;
          return;
        }
      ns.o->emplace_back(names[0], v);
      return;
    }
    if (names.size() == 1) {
      c.set(names[0], v);
      return;
    }
    const Array parts = iter_items(v, line);
    if (parts.size() != names.size()) err(line, "cannot unpack the values to set");
    for (size_t k = 0; k < names.size(); ++k) c.set(names[k], parts[k]);
  }
};
struct Macro final : Node {
  std::string name;
  std::vector<std::pair<std::string, ExprP>> params;
  std::shared_ptr<Seq> body;
  void render(Ctx& c, std::string&) const override {
    Ctx* cp = &c;
    const Macro* self = this;
    c.set(name, Value::func([cp, self](Args& a) {
            Ctx& c2 = *cp;
            if (++c2.depth > 64)
              err(self->line, fmt::format("macro '{}' calls nest too deeply", self->name));
            std::map<std::string, Value, std::less<>> scope;
            for (size_t k = 0; k < self->params.size(); ++k) {
              const auto& [pn, dflt] = self->params[k];
              Value v = k < a.pos.size() ? a.pos[k] : Value();
              for (const auto& [n, x] : a.kw)
                if (n == pn) v = x;
              if (v.undef() && dflt) v = dflt->eval(c2);
              scope[pn] = v;
            }
            c2.scopes.push_back(std::move(scope));
            std::string out;
            self->body->render(c2, out);
            c2.scopes.pop_back();
            c2.loop_ctl = 0;
            --c2.depth;
            return Value(out);
          }));
  }
};

struct FilterBlock final : Node {
  std::string name;
  CallArgs args;
  std::unique_ptr<Seq> body;
  void render(Ctx& c, std::string& out) const override {
    std::string inner;
    body->render(c, inner);
    Args a = args.eval(c);
    out += str(apply_filter(c, name, Value(inner), a, line));
  }
};

class Parser {
 public:
  explicit Parser(std::vector<Piece> p) : p_(std::move(p)) {}

  std::unique_ptr<Seq> parse_all() {
    std::string end;
    auto s = parse_until({}, end);
    if (k_ < p_.size()) err(p_[k_].line, "unexpected end tag");
    return s;
  }

 private:
  static std::string keyword(const std::string& body) {
    const std::string b = strip_chars(body, kSpace, true, false);
    size_t e = 0;
    while (e < b.size() && (std::isalnum(static_cast<unsigned char>(b[e])) || b[e] == '_')) ++e;
    return b.substr(0, e);
  }

  // Statements until a block tag whose keyword is in `ends` (its keyword in *end).
  std::unique_ptr<Seq> parse_until(const std::vector<std::string>& ends, std::string& end) {
    if (++depth_ > 100) err(p_[std::min(k_, p_.size() - 1)].line, "blocks nest too deeply");
    auto seq = std::make_unique<Seq>();
    while (k_ < p_.size()) {
      const Piece& pc = p_[k_];
      if (pc.kind == Piece::kText) {
        auto t = std::make_unique<Text>();
        t->s = pc.text;
        seq->body.push_back(std::move(t));
        ++k_;
        continue;
      }
      if (pc.kind == Piece::kVar) {
        ExprParser ep(tokenize(pc.text, pc.line), pc.line);
        auto o = std::make_unique<Output>();
        o->line = pc.line;
        o->e = ep.expr();
        ep.expect_end();
        seq->body.push_back(std::move(o));
        ++k_;
        continue;
      }
      const std::string kw = keyword(pc.text);
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        end = kw;
        --depth_;
        return seq;
      }
      seq->body.push_back(statement(kw));
    }
    if (!ends.empty())
      err(p_.empty() ? 0 : p_.back().line, fmt::format("missing {{% {} %}}", ends.back()));
    --depth_;
    return seq;
  }

  NodeP statement(const std::string& kw) {
    const Piece pc = p_[k_++];
    ExprParser ep(tokenize(pc.text, pc.line), pc.line);
    ep.name();  // the keyword
    const int line = pc.line;
    if (kw == "if") {
      auto n = std::make_unique<If>();
      n->line = line;
      ExprP cond = ep.expr();
      ep.expect_end();
      while (true) {
        std::string end;
        auto body = parse_until({"elif", "else", "endif"}, end);
        n->branches.emplace_back(std::move(cond), std::move(body));
        const Piece tag = p_[k_++];
        if (end == "endif") break;
        ExprParser tp(tokenize(tag.text, tag.line), tag.line);
        tp.name();
        if (end == "elif") {
          cond = tp.expr();
          tp.expect_end();
        } else {
          tp.expect_end();
          std::string end2;
          auto els = parse_until({"endif"}, end2);
          ++k_;
          n->branches.emplace_back(nullptr, std::move(els));
          break;
        }
      }
      return n;
    }
    if (kw == "for") {
      auto n = std::make_unique<For>();
      n->line = line;
      n->vars.push_back(ep.name());
      while (ep.is_op(",")) {
        ep.expect_op(",");
        n->vars.push_back(ep.name());
      }
      if (!ep.is_name("in")) err(line, "expected 'in' in the for tag");
      ep.name();
      n->iter = ep.or_();
      if (ep.is_name("if")) {
        ep.name();
        n->filter = ep.expr();
      }
      if (ep.is_name("recursive")) err(line, "recursive loops are not supported");
      ep.expect_end();
      std::string end;
      n->body = parse_until({"else", "endfor"}, end);
      ++k_;
      if (end == "else") {
        std::string end2;
        n->otherwise = parse_until({"endfor"}, end2);
        ++k_;
      }
      return n;
    }
    if (kw == "set") {
      auto n = std::make_unique<Set>();
      n->line = line;
      std::string first = ep.name();
      if (ep.is_op(".")) {
        ep.expect_op(".");
        n->attr_of = first;
        first = ep.name();
      }
      n->names.push_back(first);
      while (ep.is_op(",")) {
        ep.expect_op(",");
        n->names.push_back(ep.name());
      }
      if (ep.at_end()) {
        std::string end;
        n->block = parse_until({"endset"}, end);
        ++k_;
        return n;
      }
      ep.expect_op("=");
      n->e = ep.expr();
      ep.expect_end();
      return n;
    }
    if (kw == "macro") {
      auto n = std::make_unique<Macro>();
      n->line = line;
      n->name = ep.name();
      ep.expect_op("(");
      while (!ep.is_op(")")) {
        std::string pn = ep.name();
        ExprP d;
        if (ep.is_op("=")) {
          ep.expect_op("=");
          d = ep.expr();
        }
        n->params.emplace_back(pn, std::move(d));
        if (!ep.is_op(",")) break;
        ep.expect_op(",");
      }
      ep.expect_op(")");
      ep.expect_end();
      std::string end;
      n->body = parse_until({"endmacro"}, end);
      ++k_;
      return n;
    }
    if (kw == "break" || kw == "continue") {
      auto n = std::make_unique<LoopCtl>();
      n->what = kw == "break" ? 1 : 2;
      ep.expect_end();
      return n;
    }
    if (kw == "filter") {  // {% filter NAME(args) %}...{% endfilter %}
      auto n = std::make_unique<FilterBlock>();
      n->line = line;
      n->name = ep.name();
      if (ep.is_op("(")) n->args = ep.call_args();
      ep.expect_end();
      std::string end;
      n->body = parse_until({"endfilter"}, end);
      ++k_;
      return n;
    }
    if (kw == "generation") {  // transformers' assistant-mask marker: its body as is
      std::string end;
      auto body = parse_until({"endgeneration"}, end);
      ++k_;
      return body;
    }
    err(line, fmt::format("unknown tag '{}'", kw));
  }

  std::vector<Piece> p_;
  size_t k_ = 0;
  int depth_ = 0;
};

Template::Template(std::string_view source) {
  Parser p(lex(source));
  root_ = p.parse_all();
}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  Ctx c;
  c.scopes.emplace_back();
  auto& g = c.scopes.back();
  g["raise_exception"] = Value::func([](Args& a) -> Value {
    fail("template: raise_exception: {}", a.pos.empty() ? std::string() : str(a.pos[0]));
  });
  g["range"] = Value::func([](Args& a) {
    int64_t lo = 0, hi = 0, st = 1;
    auto geti = [&](size_t k) {
      return a.pos[k].t == T::kInt ? a.pos[k].i : static_cast<int64_t>(a.pos[k].num());
    };
    if (a.pos.size() == 1) hi = geti(0);
    if (a.pos.size() >= 2) {
      lo = geti(0);
      hi = geti(1);
    }
    if (a.pos.size() >= 3) st = geti(2);
    if (st == 0) fail("template: range() step is zero");
    Array out;
    for (int64_t k = lo; st > 0 ? k < hi : k > hi; k += st) {
      out.emplace_back(k);
      if (out.size() > 100000) fail("template: range() too long (over 100000 items)");
    }
    return Value(std::move(out));
  });
  g["namespace"] = Value::func([](Args& a) {
    Object o;
    for (const auto& [k, v] : a.kw) o.emplace_back(k, v);
    return Value(std::move(o));
  });
  g["dict"] = Value::func([](Args& a) {
    Object o;
    for (const auto& [k, v] : a.kw) o.emplace_back(k, v);
    return Value(std::move(o));
  });
  g["strftime_now"] = Value::func([](Args& a) {
    const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    const std::string f = a.pos.empty() ? "%Y-%m-%d" : str(a.pos[0]);
    const size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
    return Value(std::string(buf, n));
  });
  if (context.is_object())
    for (const auto& [k, v] : context.items()) g[k] = from_json(v);
  std::string out;
  root_->render(c, out);
  return out;
}

}  // namespace barata::jinja
