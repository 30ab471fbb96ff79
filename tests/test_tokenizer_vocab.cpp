// llama.cpp's vocabulary test sets: each ggml-vocab-<set>.gguf (a tokenizer
// without weights) with strings (.inp) and the ids llama.cpp gives them (.out),
// encoded without BOS and with special tokens not parsed; every string must
// give exactly its ids. Two generations of expectations run against the same
// vocabularies, and barata passes both:
//  - models/vocab (scripts/fetch-test-data.sh): the .gguf/.inp/.out files of
//    the llama.cpp that llama-cpp-python==0.3.16 vendors (commit 4227c9b,
//    2025-08-14);
//  - tests/data/vocab-b4748: the .inp/.out files of llama.cpp release b4748,
//    whose third string is "Führer" where the later one has "Äpfel" (the
//    vocabularies are byte for byte the same in both releases).
// The qwen2 set also runs against a real Qwen2.5 model's tokenizer
// (scripts/fetch-qwen2.sh).
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "barata/gguf.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp's test-tokenizer-0 layout: the .inp strings are separated by
// "\n__ggml_vocab_test__\n" (the file ends with one, which closes the last
// string); the .out has one line of space-separated ids per string.
std::vector<VocabCase> read_cases(const fs::path& inp, const fs::path& out) {
  std::ifstream fi(inp, std::ios::binary);
  const std::string raw{std::istreambuf_iterator<char>(fi), std::istreambuf_iterator<char>()};
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(raw.substr(pos));
      break;
    }
    texts.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::ifstream fo(out);
  std::vector<VocabCase> cases;
  std::string line;
  for (size_t i = 0; std::getline(fo, line); ++i) {
    VocabCase c;
    if (i < texts.size()) c.text = texts[i];
    std::istringstream ss(line);
    for (int32_t id; ss >> id;) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), texts.size()) << inp;
  return cases;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// The two folders of expectations, fetched and committed.
struct Expectations {
  const char* what;
  fs::path dir;
};
std::vector<Expectations> expectations() {
  return {{"llama.cpp 4227c9b (llama-cpp-python 0.3.16)", test::vocab_dir()},
          {"llama.cpp b4748", test::data_dir() / "vocab-b4748"}};
}

// Runs one set of expectations; returns the number of strings checked.
size_t check_set(const Tokenizer& tok, const std::string& set, const Expectations& e) {
  SCOPED_TRACE(e.what);
  const fs::path inp = e.dir / ("ggml-vocab-" + set + ".gguf.inp");
  const fs::path out = e.dir / ("ggml-vocab-" + set + ".gguf.out");
  EXPECT_TRUE(fs::exists(inp)) << inp;
  EXPECT_TRUE(fs::exists(out)) << out;
  const auto cases = read_cases(inp, out);
  for (const auto& c : cases) {
    const auto got = tok.encode(c.text, /*add_bos=*/false, /*parse_special=*/false);
    EXPECT_EQ(got, c.ids) << set << ": text [" << c.text << "]\n  got  " << show(got) << "\n  want "
                          << show(c.ids);
  }
  return cases.size();
}

class TokenizerVocab : public testing::TestWithParam<std::string> {};

TEST_P(TokenizerVocab, MatchesReferenceIds) {
  const fs::path file = test::vocab_path(GetParam());
  BARATA_NEED_FETCHED(file, "scripts/fetch-test-data.sh");
  const GgufFile f = GgufFile::open(file);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  for (const auto& e : expectations()) EXPECT_GE(check_set(tok, GetParam(), e), 40u);
}

INSTANTIATE_TEST_SUITE_P(LlamaCppSets, TokenizerVocab,
                         testing::Values("llama-spm", "phi-3", "gpt-2", "starcoder",
                                         "deepseek-coder", "deepseek-llm", "falcon", "mpt",
                                         "refact", "qwen2", "llama-bpe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(TokenizerVocab, Qwen2SetWithRealModel) {
  const fs::path model = test::model_path("Qwen2.5-Coder-0.5B-Instruct.gguf");
  BARATA_NEED_FETCHED(model, "scripts/fetch-qwen2.sh");
  const GgufFile f = GgufFile::open(model);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok.pre(), "qwen2");
  for (const auto& e : expectations()) EXPECT_GE(check_set(tok, "qwen2", e), 40u) << model;
}

}  // namespace
}  // namespace barata
