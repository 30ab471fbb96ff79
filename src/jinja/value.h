// The Jinja interpreter's shared parts (src/jinja/, barata/jinja.h): its
// Python-like values, the evaluation context, the lexer's pieces and tokens,
// and the helpers the evaluator, the filters and the parser all call.
// Internal to the library.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace barata::jinja {

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

// Bounds on what one rendering may build, so that a hostile file's template
// ends with an error instead of exhausting memory or time: the bytes of a
// string or of the output, the items of a list, and the loop iterations and
// macro calls (steps). Real chat templates stay far below them.
inline constexpr size_t kMaxBytes = size_t{16} << 20;
inline constexpr size_t kMaxItems = 1000000;
inline constexpr int64_t kMaxSteps = 1000000;

// Whitespace as Python's str.strip() sees it.
inline const std::string kSpace = " \t\n\r\f\v";

struct Ctx {
  std::vector<std::map<std::string, Value, std::less<>>> scopes;
  int loop_ctl = 0;   // 1 break, 2 continue
  int depth = 0;      // macro calls
  int64_t steps = 0;  // loop iterations and macro calls so far (kMaxSteps)
  Value lookup(std::string_view n) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return f->second;
    }
    return Value();
  }
  void set(const std::string& n, Value v) { scopes.back()[n] = std::move(v); }
};

// ---- helpers (value.cpp) ---------------------------------------------------

// Throws barata::Error "template: line N: what" (or without a line).
[[noreturn]] void err(int line, std::string_view what);
// One more loop iteration or macro call; an error past kMaxSteps.
void count_step(Ctx& c, int line);
// A float as a 64-bit integer; an error outside that range (or NaN).
int64_t to_int(double d, int line);
// An error when a string, or the output, of n bytes would pass kMaxBytes.
void check_bytes(size_t n, int line);
bool truthy(const Value& v);
std::string py_float(double d);
std::string json_str(const std::string& s);
void dump_json(const Value& v, int indent, int level, std::string& o);
std::string py_repr_str(const std::string& s);
// As Python's str(), or repr() with `repr`.
std::string str(const Value& v, bool repr = false);
bool equal(const Value& x, const Value& y);
Value pair(Value k, Value v);
Value from_json(const nlohmann::ordered_json& j);
std::vector<size_t> cp_starts(const std::string& s);
int64_t length(const Value& v);
Array iter_items(const Value& v, int line);
Value arg(Args& a, size_t k, std::string_view name, const Value& dflt);
std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right);
std::string upper(std::string s);
std::string lower(std::string s);
std::string title(std::string s);
// s with the first `count` (-1: every) occurrences of a replaced by b.
std::string replace_all(std::string s, const std::string& a, const std::string& b,
                        int64_t count = -1);
Value method(const Value& self, const std::string& name, int line);
Value attr(const Value& v, const std::string& name, int line);
Value subscript(const Value& v, const Value& k, int line);
bool contains(const Value& hay, const Value& x, int line);
int compare(const Value& x, const Value& y, int line);

// ---- filters and tests (builtins.cpp) ----------------------------------------

Value apply_filter(Ctx& c, const std::string& name, const Value& v, Args& a, int line);
bool apply_test(const std::string& name, const Value& v, Args& a, int line);

// ---- lexing (lex.cpp) --------------------------------------------------------

struct Piece {
  enum Kind { kText, kVar, kBlock } kind;
  std::string text;  // the text, or the tag's inside
  int line;
};
// The template's text and tags, whitespace control applied.
std::vector<Piece> lex(std::string_view src);

struct Tok {
  enum Kind { kName, kNum, kStr, kOp, kEnd } kind;
  std::string s;
  Value num;
};
// A tag's inside as tokens.
std::vector<Tok> tokenize(const std::string& s, int line);

}  // namespace barata::jinja
