// The Jinja2 subset of chat templates (see barata/jinja.h): a recursive-descent
// parser to statement and expression trees, and a tree-walking evaluator over
// the values of value.h.
#include "barata/jinja.h"

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

#include "value.h"

namespace barata::jinja {

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
    if (op == '-') {
      if (v.t == T::kFloat) return Value(-v.f);
      if (v.t == T::kBool) return Value(-static_cast<int64_t>(v.b));
      if (v.i == std::numeric_limits<int64_t>::min())
        err(line, fmt::format("integer overflow in -({})", v.i));
      return Value(-v.i);
    }
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
    if (op == "~") {
      std::string o = str(x) + str(y);
      check_bytes(o.size(), line);
      return Value(std::move(o));
    }
    if (op == "+") {
      if (x.t == T::kStr && y.t == T::kStr) {
        check_bytes(x.s.size() + y.s.size(), line);
        return Value(x.s + y.s);
      }
      if (x.t == T::kArr && y.t == T::kArr) {
        if (x.a->size() + y.a->size() > kMaxItems)
          err(line, fmt::format("a list of over {} items", kMaxItems));
        Array a = *x.a;
        a.insert(a.end(), y.a->begin(), y.a->end());
        return Value(std::move(a));
      }
    }
    if (op == "*" && x.t == T::kStr && y.t == T::kInt) {
      if (y.i > 0 && !x.s.empty())
        check_bytes(x.s.size() * std::min<uint64_t>(y.i, kMaxBytes + 1), line);
      std::string o;
      for (int64_t k = 0; k < y.i; ++k) o += x.s;
      return Value(o);
    }
    if (!x.is_num() || !y.is_num())
      err(line, fmt::format("unsupported operand types for {}: {} and {}", op, str(x, true),
                            str(y, true)));
    if (x.t != T::kFloat && y.t != T::kFloat)
      return int_op(x.t == T::kBool ? x.b : x.i, y.t == T::kBool ? y.b : y.i);
    const double a = x.num(), b = y.num();
    if (op == "+") return Value(a + b);
    if (op == "-") return Value(a - b);
    if (op == "*") return Value(a * b);
    if (b == 0 && (op == "/" || op == "//" || op == "%")) err(line, "division by zero");
    if (op == "/") return Value(a / b);
    if (op == "//") return Value(std::floor(a / b));
    if (op == "%") return Value(a - b * std::floor(a / b));
    if (op == "**") return Value(std::pow(a, b));
    err(line, fmt::format("unknown operator {}", op));
  }

  // Integer arithmetic as Python's, except that a result outside 64 bits is
  // an error (Python would grow the integer).
  Value int_op(int64_t a, int64_t b) const {
    int64_t r = 0;
    auto overflow = [&] { err(line, fmt::format("integer overflow in {} {} {}", a, op, b)); };
    if (op == "+") return __builtin_add_overflow(a, b, &r) ? (overflow(), Value()) : Value(r);
    if (op == "-") return __builtin_sub_overflow(a, b, &r) ? (overflow(), Value()) : Value(r);
    if (op == "*") return __builtin_mul_overflow(a, b, &r) ? (overflow(), Value()) : Value(r);
    if (b == 0 && (op == "/" || op == "//" || op == "%")) err(line, "division by zero");
    if (op == "/") return Value(static_cast<double>(a) / static_cast<double>(b));
    if (op == "//" || op == "%") {
      if (a == std::numeric_limits<int64_t>::min() && b == -1) {
        if (op == "%") return Value(int64_t{0});
        overflow();
      }
      const int64_t q = a / b, m = a % b;
      const bool adjust = m != 0 && ((m < 0) != (b < 0));  // floor, as Python
      if (op == "//") return Value(adjust ? q - 1 : q);
      return Value(adjust ? m + b : m);
    }
    if (op == "**") {
      if (b < 0) return Value(std::pow(static_cast<double>(a), static_cast<double>(b)));
      int64_t result = 1, base = a;
      for (int64_t e = b; e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(result, base, &result)) overflow();
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) {
          if (result == 0) break;
          overflow();
        }
      }
      return Value(result);
    }
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
  void render(Ctx&, std::string& out) const override {
    out += s;
    check_bytes(out.size(), line);
  }
};
struct Output final : Node {
  ExprP e;
  void render(Ctx& c, std::string& out) const override {
    out += str(e->eval(c));
    check_bytes(out.size(), line);
  }
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
        count_step(c, line);
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
      count_step(c, line);
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
            count_step(c2, self->line);
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
      return a.pos[k].t == T::kInt ? a.pos[k].i : to_int(a.pos[k].num(), 0);
    };
    if (a.pos.size() == 1) hi = geti(0);
    if (a.pos.size() >= 2) {
      lo = geti(0);
      hi = geti(1);
    }
    if (a.pos.size() >= 3) st = geti(2);
    if (st == 0) fail("template: range() step is zero");
    Array out;
    for (int64_t k = lo; st > 0 ? k < hi : k > hi;) {
      out.emplace_back(k);
      if (out.size() > 100000) fail("template: range() too long (over 100000 items)");
      if (__builtin_add_overflow(k, st, &k)) break;  // past every int64: the range ends
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
