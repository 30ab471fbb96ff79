// Every vocabulary test set of ../shared/vocab (llama.cpp b4748's
// models/ggml-vocab-*.gguf with their .inp/.out files): each string encoded
// without BOS and with special tokens not parsed must give exactly the ids of
// its .out line. The qwen2 and llama-bpe sets come without their vocabulary;
// they run against a GGUF of that family when one is found: a real
// Qwen2.5 model (scripts/fetch-qwen2.sh), and a vocabulary-only GGUF made from
// the real Llama 3.2 tokenizer (scripts/fetch-llama3-vocab.sh), the same kind
// of file as the missing ggml-vocab-llama-bpe.gguf.
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

// Runs one set; returns the number of strings checked.
size_t check_set(const Tokenizer& tok, const std::string& set) {
  const fs::path dir = test::shared_dir() / "vocab";
  const auto cases = read_cases(dir / ("ggml-vocab-" + set + ".gguf.inp"),
                                dir / ("ggml-vocab-" + set + ".gguf.out"));
  for (const auto& c : cases) {
    const auto got = tok.encode(c.text, /*add_bos=*/false, /*parse_special=*/false);
    EXPECT_EQ(got, c.ids) << set << ": text [" << c.text << "]\n  got  " << show(got) << "\n  want "
                          << show(c.ids);
  }
  return cases.size();
}

class TokenizerVocab : public testing::TestWithParam<std::string> {};

TEST_P(TokenizerVocab, MatchesReferenceIds) {
  const fs::path file = test::shared_dir() / "vocab" / ("ggml-vocab-" + GetParam() + ".gguf");
  if (!fs::exists(file)) GTEST_SKIP() << file << " is absent on this machine";
  const GgufFile f = GgufFile::open(file);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  EXPECT_GE(check_set(tok, GetParam()), 40u);
}

INSTANTIATE_TEST_SUITE_P(SharedSets, TokenizerVocab,
                         testing::Values("llama-spm", "phi-3", "gpt-2", "starcoder",
                                         "deepseek-coder", "deepseek-llm", "falcon", "mpt",
                                         "refact"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// A real model whose tokenizer.ggml.pre is one of `pres`, looked for in the
// project's models/ and ../shared/models.
std::optional<fs::path> find_model(std::initializer_list<std::string_view> pres) {
  for (const fs::path& dir : {test::source_dir() / "models", test::shared_dir() / "models"}) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() != ".gguf") continue;
      try {
        const GgufFile f = GgufFile::open(e.path());
        const std::string pre = f.get_or<std::string>("tokenizer.ggml.pre", "");
        for (auto p : pres)
          if (pre == p) return e.path();
      } catch (const std::exception&) {
        continue;  // not ours to judge here
      }
    }
  }
  return std::nullopt;
}

TEST(TokenizerVocab, Qwen2SetWithRealModel) {
  const auto model = find_model({"qwen2"});
  if (!model)
    GTEST_SKIP() << "the qwen2 set needs a Qwen2-family GGUF (tokenizer.ggml.pre = qwen2) in "
                    "models/ or ../shared/models; none is there (scripts/fetch-qwen2.sh fetches "
                    "Qwen2.5-Coder-0.5B-Instruct)";
  const GgufFile f = GgufFile::open(*model);
  EXPECT_GE(check_set(Tokenizer::from_gguf(f), "qwen2"), 40u) << *model;
}

TEST(TokenizerVocab, LlamaBpeSetWithRealModel) {
  const auto model = find_model({"llama-bpe", "llama3", "llama-v3"});
  if (!model)
    GTEST_SKIP() << "the llama-bpe set needs a Llama-3-family GGUF (tokenizer.ggml.pre = "
                    "llama-bpe) in models/ or ../shared/models; none is there "
                    "(scripts/fetch-llama3-vocab.sh makes one from the Llama 3.2 tokenizer)";
  const GgufFile f = GgufFile::open(*model);
  EXPECT_GE(check_set(Tokenizer::from_gguf(f), "llama-bpe"), 40u) << *model;
}

}  // namespace
}  // namespace barata
