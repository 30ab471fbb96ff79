// Jinja values: truth, equality, order, printing as Python does, JSON in and
// out, and the string, list and dict methods templates call.
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

[[noreturn]] void err(int line, std::string_view what) {
  if (line > 0) fail("template: line {}: {}", line, what);
  fail("template: {}", what);
}

void count_step(Ctx& c, int line) {
  if (++c.steps > kMaxSteps)
    err(line,
        fmt::format("the rendering takes over {} loop iterations and macro calls", kMaxSteps));
}

int64_t to_int(double d, int line) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
    err(line, fmt::format("{} does not fit a 64-bit integer", py_float(d)));
  return static_cast<int64_t>(d);
}

void check_bytes(size_t n, int line) {
  if (n > kMaxBytes) err(line, fmt::format("a string of over {} MiB", kMaxBytes >> 20));
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

std::string str(const Value& v, bool repr) {
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
std::string replace_all(std::string s, const std::string& a, const std::string& b, int64_t count) {
  if (a.empty()) return s;
  std::string o;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t at = s.find(a, pos);
    if (at == std::string::npos) break;
    o += s.substr(pos, at - pos) + b;
    check_bytes(o.size(), 0);
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

}  // namespace barata::jinja
