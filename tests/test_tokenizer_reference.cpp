// Token ids against other implementations' output on real files:
//  - SmolLM2-135M-Instruct (byte-level BPE, pre = smollm) and
//    Qwen2.5-Coder-0.5B-Instruct (pre = qwen2, scripts/fetch-qwen2.sh): the
//    vectors in tests/data/tokenizer/{smollm2,qwen2}.jsonl, written by
//    llama.cpp b4748's llama-tokenize through scripts/gen_tokenizer_vectors.py.
//  - every one of those files and llama.cpp's vocabularies (models/vocab,
//    scripts/fetch-test-data.sh) on the same 4 KiB of random text
//    (tests/data/tokenizer/random_mix.bin: many scripts, every kind of
//    whitespace, invalid UTF-8), ids from the same script.
//  - the committed tiny SentencePiece models of tests/data/models: the prompt
//    ids of tests/data/reference/public_*.jsonl (llama.cpp b4748, BOS added).
// Fetched files that are absent skip the test (fail under
// BARATA_REQUIRE_DATA=1), naming the script that fetches them.
#include <filesystem>
#include <fstream>
#include <iostream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/gguf.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

std::vector<json> read_jsonl(const fs::path& p) {
  std::ifstream f(p);
  std::vector<json> rows;
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) rows.push_back(json::parse(line));
  return rows;
}

// Checks one model's tokenizer against its vectors.
void check_vectors(const fs::path& model, const std::string& vectors, const std::string& pre,
                   bool round_trip) {
  const GgufFile f = GgufFile::open(model);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok.model(), "gpt2");
  EXPECT_EQ(tok.pre(), pre);
  EXPECT_FALSE(tok.add_bos_default());
  const auto rows = read_jsonl(test::source_dir() / "tests/data/tokenizer" / vectors);
  ASSERT_GE(rows.size(), 40u);
  for (const json& r : rows) {
    const std::string text =
        r.contains("text_hex") ? from_hex(r["text_hex"]) : r["text"].get<std::string>();
    const bool parse_special = r["parse_special"];
    const auto want = r["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, false, parse_special), want) << "text [" << text << "]";
    // Valid text comes back byte for byte (neither vocabulary cleans spaces).
    if (round_trip && !r.contains("text_hex")) {
      EXPECT_EQ(tok.decode(want), text);
    }
  }
}

TEST(TokenizerReference, SmolLM2MatchesLlamaTokenize) {
  const fs::path model = test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  BARATA_NEED_FETCHED(model, "scripts/fetch-model.sh");
  check_vectors(model, "smollm2.jsonl", "smollm", true);
}

TEST(TokenizerReference, Qwen2MatchesLlamaTokenize) {
  const fs::path model = test::model_path("Qwen2.5-Coder-0.5B-Instruct.gguf");
  BARATA_NEED_FETCHED(model, "scripts/fetch-qwen2.sh");
  check_vectors(model, "qwen2.jsonl", "qwen2", true);
}

TEST(TokenizerReference, RandomTextMatchesLlamaTokenize) {
  const fs::path data = test::source_dir() / "tests/data/tokenizer";
  const std::vector<uint8_t> raw = test::read_bytes(data / "random_mix.bin");
  const std::string text(raw.begin(), raw.end());
  ASSERT_GT(text.size(), 4000u);
  std::vector<std::string> absent;
  size_t checked = 0;
  for (const json& r : read_jsonl(data / "random_mix.jsonl")) {
    const std::string name = r["file"];
    fs::path file = test::vocab_dir() / name;
    if (!fs::exists(file)) file = test::model_path(name);
    // The Llama 3.2 vocabulary (scripts/fetch-llama3-vocab.sh, not run by
    // scripts/test.sh) and llama.cpp's own llama-bpe vocabulary (Llama 3's)
    // give the same ids on this text; the second stands in for the first.
    if (!fs::exists(file) && name == "llama3.2-vocab.gguf") file = test::vocab_path("llama-bpe");
    if (!fs::exists(file)) {
      if (test::require_data())
        ADD_FAILURE() << name << " is absent: run " << test::fetch_script_for(file);
      absent.push_back(name);
      continue;
    }
    const GgufFile f = GgufFile::open(file);
    const Tokenizer tok = Tokenizer::from_gguf(f);
    EXPECT_EQ(tok.encode(text, false, false), r["ids"].get<std::vector<int32_t>>()) << name;
    ++checked;
  }
  for (const auto& a : absent) std::cerr << "[ note ] not checked, file absent: " << a << "\n";
  if (checked == 0) GTEST_SKIP() << "none of the files in random_mix.jsonl is on this machine";
}

TEST(TokenizerReference, SharedModelPromptIds) {
  const fs::path dir = test::data_dir() / "reference";  // committed: no skip
  size_t n_prompts = 0;
  for (const char* name : {"aidreams260K", "stories260K", "stories260K-f16"}) {
    const fs::path ref = dir / (std::string("public_") + name + ".jsonl");
    const fs::path model = test::tiny_model(std::string(name) + ".gguf");
    ASSERT_TRUE(fs::exists(ref)) << ref;
    ASSERT_TRUE(fs::exists(model)) << model;
    const GgufFile f = GgufFile::open(model);
    const Tokenizer tok = Tokenizer::from_gguf(f);
    EXPECT_TRUE(tok.add_bos_default()) << name;
    for (const json& r : read_jsonl(ref)) {
      const std::string prompt = r["prompt"];
      const auto want = r["prompt_ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(tok.encode(prompt, tok.add_bos_default(), false), want)
          << name << ": [" << prompt << "]";
      ++n_prompts;
    }
  }
  EXPECT_EQ(n_prompts, 12u);
}

}  // namespace
}  // namespace barata
