// JSON Schema to GBNF. What is understood (everything else that constrains
// a value is refused, the keyword and its JSON pointer named; annotations
// such as title and description are ignored):
//  - true / {} (any JSON value), type (one or a list), nullable (OpenAPI);
//  - const, enum, anyOf, oneOf (as anyOf: the grammar cannot count matches),
//    allOf with one member, $ref to "#", "#/$defs/..." or "#/definitions/..."
//    (recursion allowed);
//  - object: properties (written in their order), required,
//    additionalProperties (false, true or a schema; absent means false when
//    properties are given, as OpenAI's strict mode, else true);
//  - array: items, prefixItems, minItems, maxItems (at most 1000);
//  - string: minLength, maxLength, pattern (a regular expression subset,
//    unanchored ends matching anything, as JSON Schema's), format date, time,
//    date-time, uuid;
//  - integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (as
//    decimal-digit grammars); number: minimum 0 (no sign) only.
// The JSON written is compact except that `ws` allows a space or a newline
// with indentation after punctuation.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/grammar.h"

namespace barata {
namespace {

using json = nlohmann::ordered_json;

constexpr int kMaxItems = 1000;

// GBNF literal for raw bytes.
std::string lit(std::string_view s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"')
      o += "\\\"";
    else if (c == '\\')
      o += "\\\\";
    else if (c == '\n')
      o += "\\n";
    else if (c == '\r')
      o += "\\r";
    else if (c == '\t')
      o += "\\t";
    else if (c < 0x20 || c == 0x7F)
      o += fmt::format("\\x{:02X}", c);
    else
      o += static_cast<char>(c);
  }
  return o + "\"";
}

// Characters of a JSON string (any but ", \ and controls, or an escape).
constexpr const char* kCharRule =
    R"([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))";

std::string digits_range(char lo, char hi) {
  if (lo == hi) return fmt::format("\"{}\"", lo);
  return fmt::format("[{}-{}]", lo, hi);
}

// Every digit string of A's length from A to B (equal lengths, leading zeros
// allowed), as GBNF alternatives.
void padded_range(const std::string& A, const std::string& B, std::vector<std::string>& out) {
  const size_t n = A.size();
  if (A == B) {
    out.push_back(n == 0 ? "\"\"" : lit(A));
    return;
  }
  size_t k = 0;
  while (A[k] == B[k]) ++k;
  const std::string P = k ? lit(A.substr(0, k)) + " " : "";
  const size_t m = n - k - 1;
  const std::string ra = A.substr(k + 1), rb = B.substr(k + 1);
  const std::string any = m ? fmt::format(" [0-9]{{{}}}", m) : "";
  const bool low_full = ra.find_first_not_of('0') == std::string::npos;
  const bool high_full = rb.find_first_not_of('9') == std::string::npos;
  auto group = [&](char d, const std::string& lo, const std::string& hi) {
    std::vector<std::string> sub;
    padded_range(lo, hi, sub);
    std::string b;
    for (const std::string& x : sub) b += (b.empty() ? "" : " | ") + x;
    out.push_back(P + digits_range(d, d) + " (" + b + ")");
  };
  if (!low_full) group(A[k], ra, std::string(m, '9'));
  const char mid_lo = low_full ? A[k] : static_cast<char>(A[k] + 1);
  const char mid_hi = high_full ? B[k] : static_cast<char>(B[k] - 1);
  if (mid_lo <= mid_hi) out.push_back(P + digits_range(mid_lo, mid_hi) + any);
  if (!high_full) group(B[k], std::string(m, '0'), rb);
}

// Decimal strings of the integers in [lo, hi] (lo <= hi), no leading zeros.
void uint_range(uint64_t lo, uint64_t hi, std::vector<std::string>& alts) {
  uint64_t first = 0, last = 9;  // the numbers of each digit count
  for (size_t len = 1; len <= 20 && first <= hi; ++len) {
    const uint64_t a = std::max(lo, first), b = std::min(hi, last);
    if (a <= b) padded_range(std::to_string(a), std::to_string(b), alts);
    if (len == 19) break;
    first = last + 1;
    last = last * 10 + 9;
  }
}

class Converter {
 public:
  explicit Converter(const json& root) : root_(root) {}

  std::string run() {
    const std::string top = visit(root_, "#", "root");
    std::string out = "root ::= " + top + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  [[noreturn]] static void refuse(const std::string& ptr, std::string_view what) {
    fail("json schema: {} at {}", what, ptr.empty() ? "#" : ptr);
  }

  std::string add(const std::string& hint, const std::string& body) {
    std::string name;
    for (char c : hint) name += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
    if (name.empty() || !std::isalpha(static_cast<unsigned char>(name[0]))) name = "r-" + name;
    std::string n = name;
    for (int i = 2; rules_.count(n) || n == "root"; ++i) n = name + "-" + std::to_string(i);
    rules_[n] = body;
    return n;
  }
  // A shared helper rule, defined once.
  std::string prim(const std::string& name) {
    if (rules_.count(name)) return name;
    static const std::map<std::string, std::string> defs = {
        {"ws", R"(| " " | "\n" [ \t]{0,20})"},
        {"char", kCharRule},
        {"string", R"("\"" char* "\"")"},
        {"int", R"("-"? ("0" | [1-9] [0-9]{0,18}))"},
        {"number", R"(int ("." [0-9]+)? ([eE] [-+]? [0-9]+)?)"},
        {"boolean", R"("true" | "false")"},
        {"null", R"("null")"},
        {"value", R"(object | array | string | number | boolean | null)"},
        {"object",
         R"("{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* ws )? "}")"},
        {"array", R"("[" ws ( value ( ws "," ws value )* ws )? "]")"},
        {"date",
         R"([0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ))"},
        {"time",
         R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))"},
        {"hex", "[0-9a-fA-F]"},
    };
    rules_[name] = defs.at(name);
    // Their own dependencies.
    if (name == "string") prim("char");
    if (name == "number") prim("int");
    if (name == "value")
      for (const char* d : {"object", "array", "string", "number", "boolean", "null"}) prim(d);
    if (name == "object" || name == "array") {
      prim("ws");
      prim("value");
      prim("string");
    }
    return name;
  }

  const json& resolve(const std::string& ref, const std::string& ptr) {
    if (ref == "#") return root_;
    for (const char* pre : {"#/$defs/", "#/definitions/"}) {
      const std::string p(pre);
      if (ref.rfind(p, 0) == 0) {
        const std::string key = ref.substr(p.size());
        const auto defs = root_.find(p.substr(2, p.size() - 3));
        if (defs != root_.end() && defs->is_object() && defs->contains(key)) return defs->at(key);
        refuse(ptr + "/$ref", fmt::format("$ref '{}' names no definition", ref));
      }
    }
    refuse(ptr + "/$ref",
           fmt::format("$ref '{}' is not a local #/$defs/ or #/definitions/ reference", ref));
  }

  std::string visit(const json& s, const std::string& ptr, const std::string& hint) {
    struct Depth {
      int& d;
      explicit Depth(int& x) : d(x) { ++d; }
      ~Depth() { --d; }
    } depth(depth_);
    if (depth_ > 64) refuse(ptr, "schemas nest deeper than 64 levels");
    if (rules_.size() > 20000) refuse(ptr, "the schema makes more than 20000 rules");
    if (s.is_boolean()) {
      if (!s.get<bool>()) refuse(ptr, "the schema false (nothing matches)");
      return prim("value");
    }
    if (!s.is_object()) refuse(ptr, "a schema that is not an object or a boolean");
    static const std::set<std::string> known = {"type",
                                                "properties",
                                                "required",
                                                "additionalProperties",
                                                "items",
                                                "prefixItems",
                                                "minItems",
                                                "maxItems",
                                                "minLength",
                                                "maxLength",
                                                "pattern",
                                                "format",
                                                "minimum",
                                                "maximum",
                                                "exclusiveMinimum",
                                                "exclusiveMaximum",
                                                "enum",
                                                "const",
                                                "anyOf",
                                                "oneOf",
                                                "allOf",
                                                "$ref",
                                                "$defs",
                                                "definitions",
                                                "nullable",
                                                "title",
                                                "description",
                                                "examples",
                                                "default",
                                                "$schema",
                                                "$id",
                                                "$comment",
                                                "readOnly",
                                                "writeOnly",
                                                "deprecated",
                                                "strict",
                                                "name"};
    for (const auto& [k, v] : s.items())
      if (!known.count(k))
        refuse(ptr + "/" + k, fmt::format("the keyword '{}' is not supported", k));

    std::string body = visit_inner(s, ptr, hint);
    if (s.value("nullable", false)) body = "(" + body + ") | " + prim("null");
    return body.find(' ') == std::string::npos ? body : "(" + body + ")";
  }

  std::string visit_inner(const json& s, const std::string& ptr, const std::string& hint) {
    if (s.contains("$ref")) {
      const std::string ref = s.at("$ref").is_string() ? s.at("$ref").get<std::string>() : "";
      if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
      const json& target = resolve(ref, ptr);
      // Named before it is visited, so that a recursive reference finds it.
      std::string name = ref == "#" ? "root-ref" : ref.substr(ref.rfind('/') + 1);
      name = add("def-" + name, "");
      refs_[ref] = name;
      rules_[name] = visit(target, ref.substr(1).empty() ? "#" : ref, name);
      return name;
    }
    if (s.contains("const")) return lit(s.at("const").dump());
    if (s.contains("enum")) {
      const json& e = s.at("enum");
      if (!e.is_array() || e.empty()) refuse(ptr + "/enum", "enum must be a non-empty array");
      std::string b;
      for (const json& v : e) b += (b.empty() ? "" : " | ") + lit(v.dump());
      return b;
    }
    for (const char* key : {"anyOf", "oneOf"})
      if (s.contains(key)) {
        const json& a = s.at(key);
        if (!a.is_array() || a.empty())
          refuse(ptr + "/" + key, fmt::format("{} must be a non-empty array", key));
        std::string b;
        for (size_t i = 0; i < a.size(); ++i)
          b += (i ? " | " : "") + visit(a[i], fmt::format("{}/{}/{}", ptr, key, i), hint);
        return b;
      }
    if (s.contains("allOf")) {
      const json& a = s.at("allOf");
      if (!a.is_array() || a.size() != 1)
        refuse(ptr + "/allOf", "allOf with more than one schema is not supported");
      return visit(a[0], ptr + "/allOf/0", hint);
    }
    if (s.contains("type")) {
      const json& t = s.at("type");
      if (t.is_array()) {
        if (t.empty()) refuse(ptr + "/type", "an empty type list");
        std::string b;
        for (const json& one : t) {
          if (!one.is_string()) refuse(ptr + "/type", "a type that is not a string");
          b += (b.empty() ? "" : " | ") + typed(s, one.get<std::string>(), ptr, hint);
        }
        return b;
      }
      if (!t.is_string()) refuse(ptr + "/type", "a type that is not a string");
      return typed(s, t.get<std::string>(), ptr, hint);
    }
    // No type: what the keywords imply, else any value.
    if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
      return typed(s, "object", ptr, hint);
    if (s.contains("items") || s.contains("prefixItems")) return typed(s, "array", ptr, hint);
    if (s.contains("pattern") || s.contains("format") || s.contains("minLength") ||
        s.contains("maxLength"))
      return typed(s, "string", ptr, hint);
    return prim("value");
  }

  std::string typed(const json& s, const std::string& t, const std::string& ptr,
                    const std::string& hint) {
    if (t == "null") return prim("null");
    if (t == "boolean") return prim("boolean");
    if (t == "integer") return integer(s, ptr, hint);
    if (t == "number") {
      for (const char* k : {"maximum", "exclusiveMinimum", "exclusiveMaximum"})
        if (s.contains(k))
          refuse(ptr + "/" + k,
                 fmt::format("'{}' on a number (not an integer) is not supported", k));
      if (s.contains("minimum")) {
        if (!s.at("minimum").is_number() || s.at("minimum").get<double>() != 0.0)
          refuse(ptr + "/minimum", "a number's minimum other than 0 is not supported");
        prim("int");
        return add(hint + "-num",
                   R"(("0" | [1-9] [0-9]{0,18}) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?)");
      }
      return prim("number");
    }
    if (t == "string") return string(s, ptr, hint);
    if (t == "array") return array(s, ptr, hint);
    if (t == "object") return object(s, ptr, hint);
    refuse(ptr + "/type", fmt::format("unknown type '{}'", t));
  }

  static int64_t get_int(const json& s, const char* k, const std::string& ptr) {
    const json& v = s.at(k);
    if (!v.is_number() ||
        (v.is_number_float() &&
         v.get<double>() != static_cast<double>(static_cast<int64_t>(v.get<double>()))))
      refuse(ptr + "/" + k, fmt::format("'{}' must be an integer", k));
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      refuse(ptr + "/" + k, fmt::format("'{}' is out of range", k));
    return v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
  }

  std::string integer(const json& s, const std::string& ptr, const std::string& hint) {
    constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
    int64_t lo = kNone, hi = std::numeric_limits<int64_t>::max();
    bool has_hi = false;
    if (s.contains("minimum")) lo = get_int(s, "minimum", ptr);
    if (s.contains("exclusiveMinimum")) lo = std::max(lo, get_int(s, "exclusiveMinimum", ptr) + 1);
    if (s.contains("maximum")) {
      hi = get_int(s, "maximum", ptr);
      has_hi = true;
    }
    if (s.contains("exclusiveMaximum")) {
      hi = std::min(hi, get_int(s, "exclusiveMaximum", ptr) - 1);
      has_hi = true;
    }
    if (lo == kNone && !has_hi) return prim("int");
    if (lo != kNone && lo > hi) refuse(ptr, "an integer range with no member");
    std::vector<std::string> alts;
    constexpr uint64_t kUMax = 999999999999999999ull;  // 18 digits
    auto nonneg = [&](uint64_t a, uint64_t b, bool b_open) {
      if (b_open) {
        // [a, inf): up to a's width capped, then every longer number.
        const size_t w = std::to_string(a).size();
        uint64_t top = 9;
        for (size_t i = 1; i < w; ++i) top = top * 10 + 9;
        uint_range(a, top, alts);
        if (w < 19) alts.push_back(fmt::format("[1-9] [0-9]{{{},{}}}", w, 18));
        return;
      }
      uint_range(a, std::min(b, kUMax), alts);
    };
    if (lo != kNone && lo >= 0) {
      nonneg(static_cast<uint64_t>(lo), static_cast<uint64_t>(hi), !has_hi);
    } else if (lo == kNone) {
      // (-inf, hi]
      if (hi >= 0) {
        alts.push_back(R"("-" [1-9] [0-9]{0,18})");
        uint_range(0, static_cast<uint64_t>(hi), alts);
      } else {
        std::vector<std::string> neg;
        std::swap(alts, neg);
        nonneg(static_cast<uint64_t>(-hi), 0, true);
        std::string b;
        for (const std::string& a : alts) b += (b.empty() ? "" : " | ") + a;
        alts = {"\"-\" (" + b + ")"};
      }
    } else {
      // lo < 0 <= or < hi.
      std::vector<std::string> keep;
      const uint64_t neg_top = static_cast<uint64_t>(-lo);
      const uint64_t neg_bot = hi < 0 ? static_cast<uint64_t>(-hi) : 1;
      uint_range(neg_bot, neg_top, alts);
      std::string b;
      for (const std::string& a : alts) b += (b.empty() ? "" : " | ") + a;
      keep.push_back("\"-\" (" + b + ")");
      alts.clear();
      if (hi >= 0) uint_range(0, static_cast<uint64_t>(hi), alts);
      alts.insert(alts.begin(), keep.begin(), keep.end());
    }
    std::string body;
    for (const std::string& a : alts) body += (body.empty() ? "" : " | ") + a;
    return add(hint + "-int", body);
  }

  std::string string(const json& s, const std::string& ptr, const std::string& hint) {
    prim("char");
    if (s.contains("format")) {
      const std::string f = s.at("format").is_string() ? s.at("format").get<std::string>() : "";
      std::string inner;
      if (f == "date")
        inner = prim("date");
      else if (f == "time")
        inner = prim("time");
      else if (f == "date-time")
        inner = prim("date") + " \"T\" " + prim("time");
      else if (f == "uuid")
        inner = prim("hex") + "{8} \"-\" " + prim("hex") + "{4} \"-\" " + prim("hex") +
                "{4} \"-\" " + prim("hex") + "{4} \"-\" " + prim("hex") + "{12}";
      else
        refuse(ptr + "/format", fmt::format("the string format '{}' is not supported", f));
      if (f == "date-time") prim("time");
      return add(hint + "-" + f, "\"\\\"\" " + inner + " \"\\\"\"");
    }
    if (s.contains("pattern")) {
      if (!s.at("pattern").is_string()) refuse(ptr + "/pattern", "pattern must be a string");
      return add(
          hint + "-pattern",
          "\"\\\"\" " + regex(s.at("pattern").get<std::string>(), ptr + "/pattern") + " \"\\\"\"");
    }
    if (s.contains("minLength") || s.contains("maxLength")) {
      const int64_t mn = s.contains("minLength") ? get_int(s, "minLength", ptr) : 0;
      const int64_t mx = s.contains("maxLength") ? get_int(s, "maxLength", ptr) : -1;
      if (mn < 0 || mn > kMaxItems || mx > kMaxItems || (mx >= 0 && mx < mn))
        refuse(ptr, fmt::format("string lengths must be in 0..{} with minLength <= maxLength",
                                kMaxItems));
      return add(hint + "-str", mx < 0 ? fmt::format("\"\\\"\" char{{{},}} \"\\\"\"", mn)
                                       : fmt::format("\"\\\"\" char{{{},{}}} \"\\\"\"", mn, mx));
    }
    return prim("string");
  }

  std::string array(const json& s, const std::string& ptr, const std::string& hint) {
    prim("ws");
    int64_t mn = s.contains("minItems") ? get_int(s, "minItems", ptr) : 0;
    int64_t mx = s.contains("maxItems") ? get_int(s, "maxItems", ptr) : -1;
    if (mn < 0 || mn > kMaxItems || mx > kMaxItems || (mx >= 0 && mx < mn))
      refuse(ptr, fmt::format("minItems/maxItems must be in 0..{} with minItems <= maxItems",
                              kMaxItems));
    std::vector<std::string> fixed;
    if (s.contains("prefixItems")) {
      const json& p = s.at("prefixItems");
      if (!p.is_array()) refuse(ptr + "/prefixItems", "prefixItems must be an array");
      for (size_t i = 0; i < p.size(); ++i)
        fixed.push_back(
            visit(p[i], fmt::format("{}/prefixItems/{}", ptr, i), hint + "-" + std::to_string(i)));
    }
    std::string item = prim("value");
    bool more = true;
    if (s.contains("items")) {
      const json& it = s.at("items");
      if (it.is_boolean() && !it.get<bool>())
        more = false;
      else
        item = visit(it, ptr + "/items", hint + "-item");
    }
    if (!fixed.empty()) {
      // The tuple's members in order (all of them: a shorter array is not written), then the rest.
      std::string body = "\"[\" ws ";
      for (size_t i = 0; i < fixed.size(); ++i) body += (i ? "ws \",\" ws " : "") + fixed[i] + " ";
      if (more) body += "( ws \",\" ws " + item + " )* ";
      return add(hint + "-tuple", body + "ws \"]\"");
    }
    if (!more) return add(hint + "-arr", "\"[\" ws \"]\"");
    const std::string sep = "ws \",\" ws " + item;
    std::string elems;
    if (mx < 0)
      elems = mn <= 1 ? fmt::format("{} ( {} )*", item, sep)
                      : fmt::format("{} ( {} ){{{},}}", item, sep, mn - 1);
    else if (mx == 0)
      elems = "";
    else
      elems = fmt::format("{} ( {} ){{{},{}}}", item, sep, std::max<int64_t>(mn - 1, 0), mx - 1);
    if (elems.empty()) return add(hint + "-arr", "\"[\" ws \"]\"");
    if (mn == 0) return add(hint + "-arr", "\"[\" ws ( " + elems + " ws )? \"]\"");
    return add(hint + "-arr", "\"[\" ws " + elems + " ws \"]\"");
  }

  std::string object(const json& s, const std::string& ptr, const std::string& hint) {
    prim("ws");
    std::vector<std::pair<std::string, std::string>> props;  // key literal rule, value rule
    std::set<std::string> required;
    if (s.contains("required")) {
      const json& r = s.at("required");
      if (!r.is_array()) refuse(ptr + "/required", "required must be an array");
      for (const json& k : r) {
        if (!k.is_string()) refuse(ptr + "/required", "required must list strings");
        required.insert(k.get<std::string>());
      }
    }
    std::vector<bool> req;
    if (s.contains("properties")) {
      const json& p = s.at("properties");
      if (!p.is_object()) refuse(ptr + "/properties", "properties must be an object");
      for (const auto& [k, v] : p.items()) {
        const std::string key_json = json(k).dump();
        const std::string value = visit(v, ptr + "/properties/" + k, hint + "-" + k);
        props.emplace_back(lit(key_json) + " ws \":\" ws " + value, k);
        req.push_back(required.count(k) > 0);
      }
    }
    for (const std::string& r : required) {
      bool found = false;
      for (const auto& p : props) found = found || p.second == r;
      if (!found && s.contains("properties"))
        refuse(ptr + "/required", fmt::format("required property '{}' is not in properties", r));
    }
    // Extra keys: additionalProperties, absent = false when properties are given.
    std::string extra;
    bool allow_extra = !s.contains("properties");
    if (s.contains("additionalProperties")) {
      const json& a = s.at("additionalProperties");
      if (a.is_boolean()) {
        allow_extra = a.get<bool>();
      } else {
        allow_extra = true;
        extra = visit(a, ptr + "/additionalProperties", hint + "-extra");
      }
    }
    if (allow_extra) {
      if (extra.empty()) extra = prim("value");
      prim("string");
      extra = add(hint + "-kv", prim("string") + " ws \":\" ws " + extra);
    }
    if (props.empty() && !required.empty())
      refuse(ptr + "/required", "required without properties is not supported");
    // seq(i, first): the members from property i on; `first`: nothing written yet.
    const size_t n = props.size();
    std::vector<std::string> seq_first(n + 1), seq_more(n + 1);
    const std::string sep = "ws \",\" ws ";
    // The tail: extra keys (or nothing).
    if (allow_extra) {
      seq_first[n] = add(hint + "-rest", "( " + extra + " ( " + sep + extra + " )* )?");
      seq_more[n] = add(hint + "-rest", "( " + sep + extra + " )*");
    } else {
      seq_first[n] = seq_more[n] = "";
    }
    for (size_t i = n; i-- > 0;) {
      const std::string& kv = props[i].first;
      const std::string then = seq_more[i + 1];
      const std::string with_first = kv + (then.empty() ? "" : " " + then);
      const std::string with_more = sep + kv + (then.empty() ? "" : " " + then);
      if (req[i]) {
        seq_first[i] = add(hint + "-p" + std::to_string(i), with_first);
        if (i > 0) seq_more[i] = add(hint + "-q" + std::to_string(i), with_more);
      } else {
        const std::string skip_first = seq_first[i + 1], skip_more = seq_more[i + 1];
        seq_first[i] = add(hint + "-p" + std::to_string(i),
                           with_first + " | " + (skip_first.empty() ? "\"\"" : skip_first));
        if (i > 0)
          seq_more[i] = add(hint + "-q" + std::to_string(i),
                            with_more + " | " + (skip_more.empty() ? "\"\"" : skip_more));
      }
    }
    if (seq_first[0].empty()) return add(hint + "-obj", "\"{\" ws \"}\"");
    return add(hint + "-obj", "\"{\" ws " + seq_first[0] + " ws \"}\"");
  }

  // A regular expression (the ECMA subset schemas use) as GBNF over the
  // JSON-escaped text of the string: literals, escapes (\d \w \s and their
  // negations, \. etc.), classes, ".", groups ( ) (?: ), |, * + ? {m} {m,}
  // {m,n}, lazy quantifiers (as greedy), ^ and $ at the ends.
  std::string regex(const std::string& re, const std::string& ptr) {
    size_t i = 0;
    bool anchored_start = false, anchored_end = false;
    std::string r = re;
    if (!r.empty() && r[0] == '^') {
      anchored_start = true;
      r = r.substr(1);
    }
    if (!r.empty() && r.back() == '$' && (r.size() < 2 || r[r.size() - 2] != '\\')) {
      anchored_end = true;
      r.pop_back();
    }
    const std::string body = regex_alt(r, i, ptr);
    if (i != r.size()) refuse(ptr, fmt::format("pattern: unexpected '{}' at offset {}", r[i], i));
    std::string out = "(" + body + ")";
    if (!anchored_start) out = "char* " + out;
    if (!anchored_end) out += " char*";
    return out;
  }
  // JSON's encoding of one code point class in GBNF: what may appear raw.
  static std::string cls_escape(unsigned char c) {
    if (c == ']' || c == '[' || c == '\\' || c == '^' || c == '-' || c == '"')
      return std::string("\\") + static_cast<char>(c);
    if (c < 0x20 || c == 0x7F) return fmt::format("\\x{:02X}", c);
    return std::string(1, static_cast<char>(c));
  }
  std::string regex_alt(const std::string& r, size_t& i, const std::string& ptr) {
    std::string out = regex_seq(r, i, ptr);
    while (i < r.size() && r[i] == '|') {
      ++i;
      out += " | " + regex_seq(r, i, ptr);
    }
    return out;
  }
  std::string regex_seq(const std::string& r, size_t& i, const std::string& ptr) {
    std::vector<std::string> items;
    while (i < r.size() && r[i] != '|' && r[i] != ')') {
      std::string atom;
      const char c = r[i];
      if (c == '(') {
        ++i;
        if (r.compare(i, 2, "?:") == 0)
          i += 2;
        else if (i < r.size() && r[i] == '?')
          refuse(ptr, "pattern: lookarounds and named groups are not supported");
        if (++regex_depth_ > 64) refuse(ptr, "pattern: groups nest deeper than 64");
        atom = "(" + regex_alt(r, i, ptr) + ")";
        --regex_depth_;
        if (i >= r.size() || r[i] != ')') refuse(ptr, "pattern: unclosed '('");
        ++i;
      } else if (c == '[') {
        atom = regex_class(r, i, ptr);
      } else if (c == '.') {
        ++i;
        atom = R"([^"\\\x7F\x00-\x1F])";
      } else if (c == '\\') {
        atom = regex_escape(r, i, ptr, false);
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        refuse(ptr, fmt::format("pattern: '{}' with nothing before it at offset {}", c, i));
      } else if (c == '^' || c == '$') {
        refuse(ptr, "pattern: ^ and $ are supported only at the ends");
      } else {
        // One UTF-8 character, escaped as JSON writes it.
        size_t n = 1;
        const unsigned char u = static_cast<unsigned char>(c);
        if (u >= 0xC0) n = u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : 2;
        const std::string ch = r.substr(i, n);
        i += n;
        atom = ch == "\"" ? lit("\\\"") : ch == "\\" ? lit("\\\\") : lit(ch);
      }
      // Quantifiers.
      if (i < r.size()) {
        const char q = r[i];
        if (q == '*' || q == '+' || q == '?') {
          atom += q;
          ++i;
        } else if (q == '{') {
          const size_t close = r.find('}', i);
          if (close == std::string::npos) refuse(ptr, "pattern: unclosed '{'");
          const std::string inner = r.substr(i + 1, close - i - 1);
          for (char d : inner)
            if (!std::isdigit(static_cast<unsigned char>(d)) && d != ',')
              refuse(ptr, "pattern: a bad {m,n}");
          atom += "{" + inner + "}";
          i = close + 1;
        }
        if (i < r.size() && r[i] == '?') ++i;  // lazy: the same strings
      }
      items.push_back(atom);
    }
    std::string out;
    for (const std::string& a : items) out += (out.empty() ? "" : " ") + a;
    return out.empty() ? "\"\"" : out;
  }
  // \d \w \s (and negated), or an escaped character.
  std::string regex_escape(const std::string& r, size_t& i, const std::string& ptr, bool in_class) {
    ++i;
    if (i >= r.size()) refuse(ptr, "pattern: a trailing backslash");
    const char e = r[i++];
    const char* d = "0-9";
    const char* w = "a-zA-Z0-9_";
    const char* s = " \\t\\n\\r";
    switch (e) {
      case 'd':
        return in_class ? d : fmt::format("[{}]", d);
      case 'w':
        return in_class ? w : fmt::format("[{}]", w);
      case 's':
        return in_class ? s : fmt::format("[{}]", s);
      case 'D':
      case 'W':
      case 'S':
        if (in_class) refuse(ptr, "pattern: \\D \\W \\S inside a class are not supported");
        return fmt::format(R"([^{}"\\\x7F\x00-\x1F])", e == 'D' ? d : e == 'W' ? w : s);
      case 'n':
        return in_class ? "\\n" : lit("\\n");
      case 't':
        return in_class ? "\\t" : lit("\\t");
      case 'b':
      case 'B':
      case '1':
      case '2':
      case '3':
      case '4':
      case '5':
      case '6':
      case '7':
      case '8':
      case '9':
        refuse(ptr, fmt::format("pattern: \\{} is not supported", e));
      default:
        break;
    }
    if (std::isalnum(static_cast<unsigned char>(e)))
      refuse(ptr, fmt::format("pattern: \\{} is not supported", e));
    if (in_class) return cls_escape(static_cast<unsigned char>(e));
    return e == '"' ? lit("\\\"") : e == '\\' ? lit("\\\\") : lit(std::string(1, e));
  }
  std::string regex_class(const std::string& r, size_t& i, const std::string& ptr) {
    ++i;  // [
    bool negate = false;
    if (i < r.size() && r[i] == '^') {
      negate = true;
      ++i;
    }
    std::string inner;
    bool first = true;
    while (i < r.size() && (r[i] != ']' || first)) {
      first = false;
      if (r[i] == '\\') {
        inner += regex_escape(r, i, ptr, true);
      } else {
        size_t n = 1;
        const unsigned char u = static_cast<unsigned char>(r[i]);
        if (u >= 0xC0) n = u >= 0xF0 ? 4 : u >= 0xE0 ? 3 : 2;
        if (n == 1 && r[i] == '-' && !inner.empty() && i + 1 < r.size() && r[i + 1] != ']') {
          inner += '-';
          ++i;
          continue;
        }
        inner += n == 1 ? cls_escape(u) : r.substr(i, n);
        i += n;
      }
    }
    if (i >= r.size()) refuse(ptr, "pattern: unclosed '['");
    ++i;
    // A JSON string holds " and \ only escaped, controls never: a negated class
    // leaves them out; a plain one naming them is refused.
    if (negate) return "[^" + inner + R"("\\\x7F\x00-\x1F])";
    if (inner.find("\\\"") != std::string::npos || inner.find("\\\\") != std::string::npos)
      refuse(ptr, "pattern: a class with \" or \\ is not supported");
    return "[" + inner + "]";
  }

  const json& root_;
  int depth_ = 0, regex_depth_ = 0;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> refs_;
};

}  // namespace

std::string json_schema_to_gbnf(const json& schema) {
  return Converter(schema).run();
}

std::string json_schema_to_gbnf(std::string_view text) {
  json schema;
  try {
    schema = json::parse(text);
  } catch (const json::exception& e) {
    fail("json schema: not JSON: {}", e.what());
  }
  return Converter(schema).run();
}

std::string json_object_gbnf() {
  return json_schema_to_gbnf(json{{"type", "object"}});
}

}  // namespace barata
