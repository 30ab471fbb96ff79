// Jinja filters and tests.
#include "value.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"

namespace barata::jinja {

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
    if (v.t == T::kInt) return v;
    return v.is_num() ? Value(to_int(std::trunc(v.num()), line))
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
    if (v.t == T::kInt) {
      if (v.i == std::numeric_limits<int64_t>::min()) err(line, "integer overflow in abs()");
      return Value(v.i < 0 ? -v.i : v.i);
    }
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

}  // namespace barata::jinja
