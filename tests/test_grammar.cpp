// GBNF grammars: llama.cpp's example grammars (models/grammars, from the
// llama-cpp-python sdist that scripts/fetch-test-data.sh fetches) parse, and
// accept and refuse strings as their text says (the cases are ours); the
// syntax's corners and its errors; and the token mask, for states reached by
// random walks, equals trying every token's bytes, on a byte-level BPE
// vocabulary (Qwen2's 151,936 tokens) and a SentencePiece one.
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/grammar.h"
#include "barata/tokenizer.h"
#include "sanitizer.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;

fs::path grammar_dir() {
  return test::source_dir() / "models" / "grammars";
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The whole string is a sentence of the grammar.
bool matches(const GrammarIndex& ix, std::string_view s) {
  return ix.matches(s);
}

GrammarIndex index_of(std::string_view gbnf) {
  return GrammarIndex(Grammar::parse(gbnf), nullptr);
}

struct Cases {
  const char* file;
  std::vector<std::string> accept, reject;
};

TEST(GbnfExamples, LlamaCppGrammarsParseAndJudgeStrings) {
  BARATA_NEED_FETCHED(grammar_dir() / "json.gbnf", "scripts/fetch-test-data.sh");
  const std::vector<Cases> cases = {
      {"json.gbnf",
       {"{}", "{\"a\": 1}", "{ \"a\" : [1, 2.5, -3e5, true, null], \"b\": {\"c\": \"d\\n\"}}",
        "{\"\xc3\xa9\": \"\xe6\x97\xa5\xe6\x9c\xac\", \"u\": \"\\u00e9\"}\n  ", "{\"x\":[]}"},
       {"[]", "{\"a\" 1}", "{\"a\": tru}", "{'a': 1}", "{\"a\": 01}", "{\"a\": \"\n\"}",
        "{\"a\": 1,}", "{\"a\": \"\\q\"}", "{\"a\": \"\xff\"}", "{"}},
      {"json_arr.gbnf",
       {"[\n]", "[\n1,\n2]", "[\n{\"a\": [true]},\n\"s\"]"},
       {"[]", "[\n1,2]", "[\n1]\n"}},
      {"arithmetic.gbnf",
       {"1+2=3\n", "(a +b)*c =d\n", "x=y\nz1_2 = (3)\n"},
       {"1+2=3", "=3\n", "1++2=3\n", "A=1\n"}},
      {"list.gbnf",
       {"- a\n", "- first item\n- \xe2\x9c\x93 second\n"},
       {"", "- \n", "-a\n", "- a", "- a\x0b b\n", "- a\xe2\x80\xa8\n"}},
      {"c.gbnf",
       {"", "int main(){return 0;}",
        "int f(int x){while(x<10){x = x+1;}if(x==10){return x;}else{return 0;}}",
        "float g(){/* hi */y = h(1, 2);}"},
       {"int main(){return 0}", "main(){}", "int 1x(){}", "int f(){/* open}"}},
      {"chess.gbnf", {"1. e4 e5\n2. Nf3 Nc6\n"}, {"1. e4 e5\n", "1. e9 e5\n2. Nf3 Nc6\n"}},
      {"english.gbnf", {"Hello, world.", "a b\tc"}, {"", "caf\xc3\xa9"}},
      {"japanese.gbnf",
       {"\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf"},
       {"hello"}},
  };
  for (const Cases& c : cases) {
    SCOPED_TRACE(c.file);
    const std::string src = read_text(grammar_dir() / c.file);
    std::shared_ptr<const Grammar> g;
    ASSERT_NO_THROW(g = Grammar::parse(src));
    GrammarIndex ix(g, nullptr);
    for (const std::string& s : c.accept) EXPECT_TRUE(matches(ix, s)) << "should accept: " << s;
    for (const std::string& s : c.reject) EXPECT_FALSE(matches(ix, s)) << "should refuse: " << s;
  }
}

TEST(Gbnf, RepetitionsClassesAndLiterals) {
  const auto ix = index_of(
      "root ::= a{2} b{1,3} c{2,} d{,2} \"|\" e? f* g+\n"
      "a ::= \"x\"\nb ::= \"y\"\nc ::= [0-9]\nd ::= 'q'\n"
      "e ::= [^a-z\\n]\nf ::= \".\" . \ng ::= \"\\x41\\u00e9\\U0001F600\"");
  EXPECT_TRUE(matches(ix, "xxy12|A\xc3\xa9\xf0\x9f\x98\x80"));
  EXPECT_TRUE(matches(ix, "xxyyy123qq|Z.\xe2\x82\xac.aA\xc3\xa9\xf0\x9f\x98\x80"));
  EXPECT_FALSE(matches(ix, "xy12|A\xc3\xa9\xf0\x9f\x98\x80"));      // a{2}
  EXPECT_FALSE(matches(ix, "xxyyyy12|A\xc3\xa9\xf0\x9f\x98\x80"));  // b{1,3}
  EXPECT_FALSE(matches(ix, "xxy1|A\xc3\xa9\xf0\x9f\x98\x80"));      // c{2,}
  EXPECT_FALSE(matches(ix, "xxy12qqq|A\xc3\xa9\xf0\x9f\x98\x80"));  // d{,2}
  EXPECT_FALSE(matches(ix, "xxy12|aA\xc3\xa9\xf0\x9f\x98\x80"));    // e is not a-z
  EXPECT_FALSE(matches(ix, "xxy12|"));                              // g+

  // "." and negated classes take whole UTF-8 characters, never a stray byte
  // or a surrogate's encoding.
  const auto any = index_of("root ::= .");
  EXPECT_TRUE(matches(any, "\x7f"));
  EXPECT_TRUE(matches(any, "\xf4\x8f\xbf\xbf"));
  EXPECT_FALSE(matches(any, "\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(matches(any, "\xed\xa0\x80"));      // U+D800
  EXPECT_FALSE(matches(any, "\xc0\x80"));          // overlong
  EXPECT_FALSE(matches(any, "\x80"));
  const auto greek = index_of("root ::= [\xce\xb1-\xcf\x89]+  # alpha to omega\n");
  EXPECT_TRUE(matches(greek, "\xce\xb1\xce\xbb\xcf\x86\xce\xb1"));
  EXPECT_FALSE(matches(greek, "\xce\x91"));  // capital alpha

  // Rules may span lines inside groups and after ::= and |; a newline
  // outside a group ends the rule.
  const auto multi = index_of("root ::=\n  ( \"a\"\n  | \"b\" ) |\n  \"c\"\n");
  EXPECT_TRUE(matches(multi, "b"));
  EXPECT_TRUE(matches(multi, "c"));
}

TEST(Gbnf, ErrorsNameTheLineColumnOrRule) {
  auto msg = [](std::string_view g) {
    try {
      Grammar::parse(g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(msg("root ::= a"), "grammar: line 1, column 10: rule 'a' is not defined");
  EXPECT_EQ(msg("root ::= \"a\"\nroot ::= \"b\""),
            "grammar: line 2, column 1: rule 'root' is defined twice (first at line 1, column 1)");
  EXPECT_EQ(msg("x ::= \"a\""), "grammar: no rule named 'root' (the start rule)");
  EXPECT_EQ(msg("root ::= root \"a\" | \"b\""),
            "grammar: rule 'root' is left-recursive (it can reach itself before taking a byte)");
  EXPECT_EQ(msg("root ::= \"abc"), "grammar: line 1, column 14: unterminated string literal");
  EXPECT_EQ(msg("root ::= [a-"), "grammar: line 1, column 10: unterminated character class");
  EXPECT_EQ(msg("root ::= \"a\"{3,1}"),
            "grammar: line 1, column 13: a repetition {m,n} with n below m");
  EXPECT_EQ(msg("root ::= * \"a\""), "grammar: line 1, column 10: '*' with nothing before it");
  EXPECT_EQ(msg("root ::= (\"a\""), "grammar: line 1, column 10: unclosed '('");
  EXPECT_EQ(msg("root = \"a\""), "grammar: line 1, column 6: expected ::= after 'root'");
  EXPECT_EQ(msg("root ::= \"\\q\""), "grammar: line 1, column 11: unknown escape '\\q'");
  EXPECT_EQ(msg("root ::= \"a\"{99999}"),
            "grammar: line 1, column 14: a repetition count above 10000");
  EXPECT_EQ(msg("root ::= [^\\x00-\\U0010FFFF]"),
            "grammar: line 1, column 10: a character class that matches nothing");
  EXPECT_EQ(msg("root ::= <think>"),
            "grammar: line 1, column 10: token references (<...>) are not supported");
}

// Random walks through a grammar over a real vocabulary: at every step the
// mask equals the brute-force check of every token, and the walk goes on
// with an allowed token chosen at random.
void check_masks(const fs::path& vocab, const std::string& gbnf, int walks, int steps,
                 uint64_t seed) {
  const GgufFile f = GgufFile::open(vocab);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  auto ix = std::make_shared<GrammarIndex>(Grammar::parse(gbnf), GrammarVocab::of(tok));
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> fast, slow;
  int checked = 0;
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(ix);
    for (int s = 0; s < steps; ++s) {
      ix->mask(m.state(), fast);
      ix->mask_brute_force(m.state(), slow);
      ASSERT_EQ(fast.size(), slow.size());
      for (size_t i = 0; i < fast.size(); ++i)
        ASSERT_EQ(fast[i], slow[i]) << "walk " << w << " step " << s << " word " << i;
      ++checked;
      std::vector<int32_t> ok;
      for (int32_t id = 0; id < tok.n_vocab(); ++id)
        if ((fast[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1) ok.push_back(id);
      if (ok.empty()) break;
      // Prefer longer tokens now and then, so that walks get somewhere.
      const int32_t pick = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
      ASSERT_TRUE(m.accept(pick));
    }
  }
  EXPECT_GT(checked, walks);
}

// Under AddressSanitizer the brute force over 151,936 tokens costs about
// ten times more: fewer steps there (the same code paths).
TEST(GrammarMask, EqualsBruteForceOnQwen2Vocabulary) {
  BARATA_NEED_FETCHED(test::vocab_path("qwen2"), "scripts/fetch-test-data.sh");
  BARATA_NEED_FETCHED(grammar_dir() / "json.gbnf", "scripts/fetch-test-data.sh");
  const bool asan = test::sanitized();
  check_masks(test::vocab_path("qwen2"), read_text(grammar_dir() / "json.gbnf"), asan ? 1 : 3,
              asan ? 8 : 12, 1);
  check_masks(test::vocab_path("qwen2"), read_text(grammar_dir() / "arithmetic.gbnf"), asan ? 1 : 2,
              asan ? 4 : 10, 2);
}

TEST(GrammarMask, EqualsBruteForceOnSentencePieceVocabulary) {
  BARATA_NEED_FETCHED(test::vocab_path("llama-spm"), "scripts/fetch-test-data.sh");
  BARATA_NEED_FETCHED(grammar_dir() / "json.gbnf", "scripts/fetch-test-data.sh");
  const bool asan = test::sanitized();
  check_masks(test::vocab_path("llama-spm"), read_text(grammar_dir() / "json.gbnf"), asan ? 1 : 3,
              16, 3);
  check_masks(test::vocab_path("llama-spm"), read_text(grammar_dir() / "c.gbnf"), asan ? 1 : 2, 16,
              4);
  check_masks(test::vocab_path("llama-spm"), read_text(grammar_dir() / "japanese.gbnf"), 1, 8, 5);
}

}  // namespace
}  // namespace barata

namespace barata {
namespace {

GrammarIndex schema_index(std::string_view schema) {
  return GrammarIndex(Grammar::parse(json_schema_to_gbnf(schema)), nullptr);
}

TEST(JsonSchema, ObjectsFollowPropertiesRequiredAndAdditional) {
  const auto ix = schema_index(R"({"type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
    "required": ["name", "age"]})");
  for (const char* ok :
       {R"({"name": "Al", "age": 30})", R"({"name":"Al","age":0,"tags":[]})",
        "{\n  \"name\": \"\\u00e9\",\n  \"age\": 120,\n  \"tags\": [\"a\", \"b\"]\n}"})
    EXPECT_TRUE(matches(ix, ok)) << ok;
  for (const char* bad :
       {R"({"age": 3})", R"({"name": "Al"})", R"({"age": 3, "name": "Al"})",
        R"({"name": "Al", "age": 121})", R"({"name": "Al", "age": -1})",
        R"({"name": "Alfred", "age": 1})", R"({"name": "Al", "age": 1, "x": 1})",
        R"({"name": "Al", "age": 1, "tags": ["a", "b", "c"]})", R"({"name": "Al", "age": 01})"})
    EXPECT_FALSE(matches(ix, bad)) << bad;

  const auto extra = schema_index(
      R"({"properties": {"a": {"type": "boolean"}}, "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(matches(extra, R"({"a": true, "b": 1, "c": -2})"));
  EXPECT_TRUE(matches(extra, R"({})"));
  EXPECT_TRUE(matches(extra, R"({"b": 1})"));
  EXPECT_FALSE(matches(extra, R"({"a": true, "b": "x"})"));
  const auto any = schema_index(R"({"type": "object"})");
  EXPECT_TRUE(matches(any, R"({"k": [1, {"x": null}], "z": "s"})"));
  EXPECT_FALSE(matches(any, R"([1])"));
}

// Every integer in [-1100, 1100] against each range, so that the digit
// grammars of the bounds are right at every carry.
TEST(JsonSchema, IntegerBoundsAreExact) {
  struct R {
    std::string schema;
    int64_t lo, hi;
  };
  const std::vector<R> ranges = {
      {R"({"type":"integer","minimum":0,"maximum":120})", 0, 120},
      {R"({"type":"integer","minimum":7,"maximum":7})", 7, 7},
      {R"({"type":"integer","minimum":19,"maximum":1001})", 19, 1001},
      {R"({"type":"integer","minimum":-37,"maximum":205})", -37, 205},
      {R"({"type":"integer","minimum":-1050,"maximum":-99})", -1050, -99},
      {R"({"type":"integer","exclusiveMinimum":9,"exclusiveMaximum":100})", 10, 99},
      {R"({"type":"integer","minimum":995})", 995, INT64_MAX},
      {R"({"type":"integer","maximum":-3})", INT64_MIN, -3},
      {R"({"type":"integer","maximum":42})", INT64_MIN, 42},
      {R"({"type":"integer","minimum":-8})", -8, INT64_MAX},
  };
  for (const R& r : ranges) {
    SCOPED_TRACE(r.schema);
    const auto ix = schema_index(r.schema);
    int wrong = 0;
    for (int64_t v = -1100; v <= 1100; ++v) {
      const bool want = v >= r.lo && v <= r.hi;
      if (matches(ix, std::to_string(v)) != want && ++wrong < 5) ADD_FAILURE() << v;
    }
    EXPECT_EQ(wrong, 0);
    EXPECT_FALSE(matches(ix, "-0"));
    EXPECT_FALSE(matches(ix, "1.0"));
  }
}

TEST(JsonSchema, EnumsUnionsRefsArraysStringsFormats) {
  const auto e = schema_index(R"({"enum": ["red", 3, null, {"a": [true]}]})");
  for (const char* ok : {R"("red")", "3", "null", R"({"a":[true]})"}) EXPECT_TRUE(matches(e, ok));
  EXPECT_FALSE(matches(e, R"("blue")"));
  const auto c = schema_index(R"({"const": "x\"y"})");
  EXPECT_TRUE(matches(c, R"("x\"y")"));

  const auto u = schema_index(
      R"({"anyOf": [{"type": "string", "format": "date"}, {"type": ["integer", "null"]}]})");
  for (const char* ok : {R"("2024-02-29")", "12", "null"}) EXPECT_TRUE(matches(u, ok)) << ok;
  for (const char* bad : {R"("2024-13-01")", R"("2024-1-01")", "true", "1.5"})
    EXPECT_FALSE(matches(u, bad)) << bad;
  const auto n = schema_index(R"({"type": "number", "nullable": true})");
  for (const char* ok : {"-1.5e3", "0", "null", "2.25"}) EXPECT_TRUE(matches(n, ok)) << ok;
  EXPECT_FALSE(matches(n, "01"));

  const auto tree = schema_index(R"({"$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(matches(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]})"));
  EXPECT_FALSE(matches(tree, R"({"v": 1, "kids": [{"w": 2}]})"));

  const auto arr = schema_index(
      R"({"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3})");
  EXPECT_FALSE(matches(arr, "[true]"));
  EXPECT_TRUE(matches(arr, "[true, false]"));
  EXPECT_TRUE(matches(arr, "[true,false,true]"));
  EXPECT_FALSE(matches(arr, "[true,false,true,true]"));
  const auto tup = schema_index(
      R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})");
  EXPECT_TRUE(matches(tup, R"(["a", 1])"));
  EXPECT_FALSE(matches(tup, R"(["a", 1, 2])"));
  EXPECT_FALSE(matches(tup, R"([1, "a"])"));

  const auto len = schema_index(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(matches(len, R"("a")"));
  EXPECT_TRUE(matches(len, R"("ab")"));
  EXPECT_TRUE(matches(len, R"("a\nb")"));  // an escape is one character
  EXPECT_FALSE(matches(len, R"("abcd")"));
  const auto id = schema_index(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(matches(id, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(matches(id, R"("123e4567e89b12d3a456426614174000")"));
  const auto dt = schema_index(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(matches(dt, R"("2024-05-01T13:45:00Z")"));
  EXPECT_TRUE(matches(dt, R"("2024-05-01T13:45:00.123+02:00")"));
  EXPECT_FALSE(matches(dt, R"("2024-05-01 13:45:00Z")"));
}

TEST(JsonSchema, PatternsAreRegularExpressions) {
  const auto a = schema_index(R"({"type": "string", "pattern": "^[A-Z][a-z]+(-[0-9]{2,3})?$"})");
  for (const char* ok : {R"("Ab")", R"("Hello-12")", R"("Hello-123")"})
    EXPECT_TRUE(matches(a, ok)) << ok;
  for (const char* bad : {R"("ab")", R"("Hello-1")", R"("Hello-1234")", R"("A")"})
    EXPECT_FALSE(matches(a, bad)) << bad;
  // Unanchored ends match anything, as JSON Schema's patterns do.
  const auto b = schema_index(R"({"type": "string", "pattern": "\\d{3}"})");
  EXPECT_TRUE(matches(b, R"("x123y")"));
  EXPECT_TRUE(matches(b, R"("456")"));
  EXPECT_FALSE(matches(b, R"("12a3")"));
  const auto c = schema_index(R"({"type": "string", "pattern": "^(cat|dog)s?\\.$"})");
  EXPECT_TRUE(matches(c, R"("dogs.")"));
  EXPECT_FALSE(matches(c, R"("dogsx")"));
  const auto d = schema_index(R"({"type": "string", "pattern": "^[^,]+$"})");
  EXPECT_TRUE(matches(d, R"("a b")"));
  EXPECT_FALSE(matches(d, R"("a,b")"));
  EXPECT_FALSE(matches(d, "\"a\"b\""));
}

TEST(JsonSchema, WhatItCannotExpressIsNamedWithItsPointer) {
  auto msg = [](std::string_view s) {
    try {
      json_schema_to_gbnf(s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(msg(R"({"type": "object", "properties": {"a": {"type": "string", "not": {}}}})"),
            "json schema: the keyword 'not' is not supported at #/properties/a/not");
  EXPECT_EQ(msg(R"({"type": "string", "format": "email"})"),
            "json schema: the string format 'email' is not supported at #/format");
  EXPECT_EQ(msg(R"({"$ref": "#/$defs/missing"})"),
            "json schema: $ref '#/$defs/missing' names no definition at #/$ref");
  EXPECT_EQ(msg(R"({"type": "widget"})"), "json schema: unknown type 'widget' at #/type");
  EXPECT_EQ(msg(R"({"type": "integer", "minimum": 5, "maximum": 2})"),
            "json schema: an integer range with no member at #");
  EXPECT_EQ(msg(R"x({"type": "string", "pattern": "(?=a)"})x"),
            "json schema: pattern: lookarounds and named groups are not supported at #/pattern");
  EXPECT_EQ(msg(R"({"allOf": [{}, {}]})"),
            "json schema: allOf with more than one schema is not supported at #/allOf");
  EXPECT_EQ(msg("{\"type\": "), msg("{\"type\": "));  // not JSON: one message
  EXPECT_NE(msg("{\"type\": ").find("json schema: not JSON"), std::string::npos);
  std::string deep;
  for (int i = 0; i < 70; ++i) deep += R"({"type": "array", "items": )";
  deep += "{}";
  for (int i = 0; i < 70; ++i) deep += "}";
  EXPECT_NE(msg(deep).find("schemas nest deeper than 64 levels"), std::string::npos);
}

TEST(Gbnf, HostileGrammarsAreRefusedNotCrashed) {
  auto msg = [](const std::string& g) {
    try {
      Grammar::parse(g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(msg("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'))
                .find("groups nest deeper than 200"),
            std::string::npos);
  EXPECT_NE(msg("root ::= \"" + std::string(300, 'a') + "\"{10000}").find("write out more than"),
            std::string::npos);
  // A chain of rules longer than expansion may follow.
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 3000; ++i) chain += fmt::format("r{} ::= r{}\n", i, i + 1);
  chain += "r3000 ::= \"x\"\n";
  auto g = Grammar::parse(chain);
  try {
    GrammarIndex(g, nullptr).initial();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nest more than 1000 deep"), std::string::npos);
  }
}

}  // namespace
}  // namespace barata
