// GBNF grammars: llama.cpp's example grammars (models/grammars, from the
// llama-cpp-python sdist that scripts/fetch-test-data.sh fetches) parse, and
// accept and refuse strings as their text says (the cases are ours); the
// syntax's corners and its errors; and the token mask, for states reached by
// random walks, equals trying every token's bytes, on a byte-level BPE
// vocabulary (Qwen2's 151,646 tokens) and a SentencePiece one.
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/grammar.h"
#include "barata/tokenizer.h"
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
  GrammarStacks st = ix.initial(), nx;
  for (unsigned char c : s) {
    ix.advance(st, c, nx);
    if (nx.empty()) return false;
    st.swap(nx);
  }
  return !st.empty() && st.front().empty();
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

TEST(GrammarMask, EqualsBruteForceOnQwen2Vocabulary) {
  BARATA_NEED_FETCHED(test::vocab_path("qwen2"), "scripts/fetch-test-data.sh");
  BARATA_NEED_FETCHED(grammar_dir() / "json.gbnf", "scripts/fetch-test-data.sh");
  check_masks(test::vocab_path("qwen2"), read_text(grammar_dir() / "json.gbnf"), 3, 12, 1);
  check_masks(test::vocab_path("qwen2"), read_text(grammar_dir() / "arithmetic.gbnf"), 2, 10, 2);
}

TEST(GrammarMask, EqualsBruteForceOnSentencePieceVocabulary) {
  BARATA_NEED_FETCHED(test::vocab_path("llama-spm"), "scripts/fetch-test-data.sh");
  BARATA_NEED_FETCHED(grammar_dir() / "json.gbnf", "scripts/fetch-test-data.sh");
  check_masks(test::vocab_path("llama-spm"), read_text(grammar_dir() / "json.gbnf"), 3, 16, 3);
  check_masks(test::vocab_path("llama-spm"), read_text(grammar_dir() / "c.gbnf"), 2, 16, 4);
  check_masks(test::vocab_path("llama-spm"), read_text(grammar_dir() / "japanese.gbnf"), 2, 8, 5);
}

}  // namespace
}  // namespace barata
