// Tokenizer behaviour beyond the reference vectors: errors, empty and invalid
// input, megabyte inputs, special tokens, pieces, decoding and streaming.
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;

// A file opened once per test binary; tests skip when it is absent (fail
// under BARATA_REQUIRE_DATA=1), naming the script that fetches it.
struct Loaded {
  std::optional<GgufFile> file;
  std::optional<Tokenizer> tok;
};

const Loaded& load(const fs::path& p) {
  static std::map<std::string, Loaded> cache;
  Loaded& l = cache[p.string()];
  if (!l.file && fs::exists(p)) {
    l.file.emplace(GgufFile::open(p));
    l.tok.emplace(Tokenizer::from_gguf(*l.file));
  }
  return l;
}

fs::path vocab(const std::string& name) {
  return test::vocab_path(name);
}
fs::path smollm2() {
  return test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
}

#define REQUIRE_TOKENIZER(var, path)                       \
  BARATA_NEED_FETCHED(path, test::fetch_script_for(path)); \
  const Loaded& var##_loaded = load(path);                 \
  ASSERT_TRUE(var##_loaded.tok) << (path);                 \
  const Tokenizer& var = *var##_loaded.tok

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80                ? 1
               : c >= 0xC2 && c < 0xE0 ? 2
               : c >= 0xE0 && c < 0xF0 ? 3
               : c >= 0xF0 && c < 0xF5 ? 4
                                       : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// A small synthetic BPE vocabulary: the 256 byte characters, "he", "ll".
std::vector<uint8_t> tiny_bpe(const std::string& model, const std::string& pre) {
  GgufWriter w;
  w.set("tokenizer.ggml.model", model);
  if (!pre.empty()) w.set("tokenizer.ggml.pre", pre);
  std::vector<GgufValue> tokens;
  for (int b = 0; b < 256; ++b) {
    // GPT-2 byte characters: printable Latin-1 stand for themselves, the rest
    // from U+0100 on (only the printable ASCII ones matter here).
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    static int shifted = 0;
    if (b == 0) shifted = 0;
    const uint32_t cpt = printable ? b : 256 + shifted++;
    std::string s;
    if (cpt < 0x80) {
      s += static_cast<char>(cpt);
    } else {
      s += static_cast<char>(0xC0 | (cpt >> 6));
      s += static_cast<char>(0x80 | (cpt & 0x3F));
    }
    tokens.emplace_back(s);
  }
  tokens.emplace_back("he");
  tokens.emplace_back("ll");
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.merges", GgufValue::array(GgufType::STRING, {"h e", "l l"}));
  return w.to_bytes();
}

TEST(Tokenizer, UnknownPreIsAnErrorListingTheSupportedOnes) {
  const auto bytes = tiny_bpe("gpt2", "nonesuch-7");
  const GgufFile f = GgufFile::from_memory(bytes, "tiny.gguf");
  try {
    Tokenizer::from_gguf(f);
    FAIL() << "an unknown pre was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'nonesuch-7'"), std::string::npos) << msg;
    for (const char* p : {"gpt-2", "llama-bpe", "qwen2", "smollm", "deepseek-coder", "falcon"})
      EXPECT_NE(msg.find(p), std::string::npos) << p << " missing from: " << msg;
  }
  EXPECT_GE(Tokenizer::supported_pre().size(), 20u);
}

TEST(Tokenizer, UnsupportedModelAndMissingPiecesAreErrors) {
  const auto bert = tiny_bpe("bert", "");
  EXPECT_THROW(Tokenizer::from_gguf(GgufFile::from_memory(bert, "bert.gguf")), Error);
  GgufWriter w;
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", "gpt-2");
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, {"a", "b"}));
  const auto no_merges = w.to_bytes();
  EXPECT_THROW(Tokenizer::from_gguf(GgufFile::from_memory(no_merges, "m.gguf")), Error);
  GgufWriter none;
  none.set("general.architecture", "llama");
  const auto no_vocab = none.to_bytes();
  EXPECT_THROW(Tokenizer::from_gguf(GgufFile::from_memory(no_vocab, "n.gguf")), Error);
}

TEST(Tokenizer, TinySyntheticBpeMerges) {
  const auto bytes = tiny_bpe("gpt2", "gpt-2");
  const GgufFile f = GgufFile::from_memory(bytes, "tiny.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(f);
  // "hello": h e l l o -> "he" (rank 0) then "ll" (rank 1), o alone.
  EXPECT_EQ(tok.encode("hello", false, false), (std::vector<int32_t>{256, 257, 'o'}));
  EXPECT_EQ(tok.decode(tok.encode("hello", false, false)), "hello");
}

// A small synthetic SentencePiece vocabulary with a token that has '▁' inside
// ("a▁b"): merges may then cross word starts, so words are not merged apart.
TEST(Tokenizer, SentencePieceMergesAcrossWordsWhenTheVocabularyDoes) {
  GgufWriter w;
  w.set("tokenizer.ggml.model", "llama");
  std::vector<GgufValue> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<GgufValue> scores = {0.0f, 0.0f, 0.0f};
  std::vector<GgufValue> types = {int32_t{2}, int32_t{3}, int32_t{3}};
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(fmt::format("<0x{:02X}>", b));
    scores.emplace_back(0.0f);
    types.emplace_back(int32_t{6});
  }
  const std::string sp = "\xE2\x96\x81";
  for (auto [text, score] : std::vector<std::pair<std::string, float>>{{sp, -3.0f},
                                                                       {"a", -2.0f},
                                                                       {"b", -2.0f},
                                                                       {sp + "a", -1.0f},
                                                                       {"a" + sp, -0.5f},
                                                                       {"a" + sp + "b", -0.1f}}) {
    tokens.emplace_back(text);
    scores.emplace_back(score);
    types.emplace_back(int32_t{1});
  }
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::FLOAT32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::INT32, std::move(types)));
  const auto bytes = w.to_bytes();
  const GgufFile f = GgufFile::from_memory(bytes, "spm.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(f);
  // "▁a▁b": "a▁" (-0.5) first, then "a▁b" (-0.1); "▁a" (-1) never wins.
  EXPECT_EQ(tok.encode("a b", false, false),
            (std::vector<int32_t>{*tok.find_token(sp), *tok.find_token("a" + sp + "b")}));
  EXPECT_EQ(tok.decode(tok.encode("a b", false, false)), "a b");
  // "c" has no token: its byte; BOS by default.
  EXPECT_EQ(tok.encode("c", true, false),
            (std::vector<int32_t>{1, *tok.find_token(sp), *tok.find_token("<0x63>")}));
}

TEST(Tokenizer, EmptyTextGivesNothingOrBos) {
  REQUIRE_TOKENIZER(spm, vocab("llama-spm"));
  EXPECT_TRUE(spm.encode("", false, false).empty());
  EXPECT_EQ(spm.encode("", true, false), std::vector<int32_t>{spm.bos_id()});
  REQUIRE_TOKENIZER(bpe, vocab("gpt-2"));
  EXPECT_TRUE(bpe.encode("", false, true).empty());
  EXPECT_EQ(bpe.encode("", true, false), std::vector<int32_t>{bpe.bos_id()});
}

TEST(Tokenizer, InvalidUtf8SentencePieceKeepsTheBytes) {
  REQUIRE_TOKENIZER(tok, vocab("llama-spm"));
  const std::string text = "ok \xff\xfe end \xe2\x82";
  const auto ids = tok.encode(text, false, false);
  // The ids llama.cpp b4748's llama-tokenize gives (--no-bos --no-escape
  // --no-parse-special). A malformed lead byte takes as many bytes as it
  // announces (0xFF: four) into one symbol, here half of the '▁' that stands
  // for the space after it; what no token covers is spelled in <0xXX> tokens.
  EXPECT_EQ(ids,
            (std::vector<int32_t>{3431, 29871, 258, 257, 229, 153, 132, 355, 29871, 229, 133}));
  // So the bytes come back, except that one space comes back as its '▁'.
  EXPECT_EQ(tok.decode(ids),
            "ok \xff\xfe\xe2\x96\x81"
            "end \xe2\x82");
  EXPECT_EQ(tok.decode(tok.encode("\xff", false, false)), "\xff");
}

TEST(Tokenizer, InvalidUtf8BpeBecomesReplacementCharacters) {
  REQUIRE_TOKENIZER(tok, vocab("gpt-2"));
  // Each byte that starts no well-formed sequence is U+FFFD, as in llama.cpp.
  EXPECT_EQ(tok.encode("a\xff\xfe b", false, false),
            tok.encode("a\xEF\xBF\xBD\xEF\xBF\xBD b", false, false));
  EXPECT_EQ(tok.encode("x\xe2\x82", false, false),
            tok.encode("x\xEF\xBF\xBD\xEF\xBF\xBD", false, false));
  // Overlong forms spell their code point; surrogates pass through as bytes
  // (both as llama.cpp does); above U+10FFFF is U+FFFD (llama.cpp aborts).
  EXPECT_EQ(tok.encode("a\xc0\xaf", false, false), tok.encode("a/", false, false));
  EXPECT_EQ(tok.decode(tok.encode("x\xed\xa0\x80y", false, false)), "x\xed\xa0\x80y");
  EXPECT_EQ(tok.encode("\xf4\x90\x80\x80", false, false), tok.encode("\xEF\xBF\xBD", false, false));
}

std::string megabyte_text() {
  const std::string para =
      "The quick brown fox jumps over the lazy dog; it's 42 degrees at 10:30.\n"
      "def f(x):\n    return x ** 2  # square\n"
      "Café naïve façade — 你好，世界！ こんにちは 🦙🤗  \t tabs\n\n";
  std::string s;
  while (s.size() < (1u << 20)) s += para;
  return s;
}

void expect_sane_count(const Tokenizer& tok, const std::string& text, size_t min_bytes_per_token) {
  const auto ids = tok.encode(text, false, false);
  EXPECT_GT(ids.size(), 0u);
  EXPECT_LE(ids.size(), text.size());
  EXPECT_GE(ids.size() * 16, text.size()) << "fewer tokens than any real vocabulary gives";
  EXPECT_LE(ids.size() * min_bytes_per_token, text.size());
}

TEST(Tokenizer, MegabyteInputsComplete) {
  // These must finish quickly (they would take minutes if any step were
  // quadratic); the counts say the output is plausible. Nothing asserts a time.
  const std::string mixed = megabyte_text();
  const std::string one_word(1u << 20, 'a');
  const std::string spaces = std::string(1u << 20, ' ') + "x";
  REQUIRE_TOKENIZER(bpe, vocab("gpt-2"));
  expect_sane_count(bpe, mixed, 2);
  {
    const auto ids = bpe.encode(one_word, false, false);  // one 1 MiB word
    EXPECT_GT(ids.size(), 0u);
    EXPECT_LE(ids.size(), one_word.size() / 4);
    EXPECT_EQ(bpe.decode(ids), one_word);
  }
  {
    const auto ids = bpe.encode(spaces, false, false);  // one 1 MiB whitespace run
    EXPECT_GT(ids.size(), 0u);
    EXPECT_EQ(bpe.decode(ids), spaces);
  }
  REQUIRE_TOKENIZER(spm, vocab("llama-spm"));
  expect_sane_count(spm, mixed, 1);
  EXPECT_LE(spm.encode(one_word, false, false).size(), one_word.size() / 3);
  EXPECT_GT(spm.encode(spaces, false, false).size(), 0u);
}

TEST(Tokenizer, SpecialTokensParsedOnlyWhenAsked) {
  REQUIRE_TOKENIZER(tok, smollm2());
  const int32_t im_start = *tok.find_token("<|im_start|>");
  const auto parsed = tok.encode("<|im_start|>user", false, true);
  ASSERT_FALSE(parsed.empty());
  EXPECT_EQ(parsed.front(), im_start);
  const auto raw = tok.encode("<|im_start|>user", false, false);
  EXPECT_EQ(std::count(raw.begin(), raw.end(), im_start), 0);
  EXPECT_GT(raw.size(), parsed.size());
  EXPECT_EQ(tok.decode(raw), "<|im_start|>user");
  EXPECT_EQ(tok.decode(parsed), "<|im_start|>user");
  EXPECT_EQ(tok.decode(parsed, /*render_special=*/false), "user");
}

TEST(Tokenizer, EndOfGenerationAndMetadata) {
  REQUIRE_TOKENIZER(tok, smollm2());
  EXPECT_EQ(tok.n_vocab(), 49152);
  EXPECT_TRUE(tok.is_eog(*tok.find_token("<|im_end|>")));
  EXPECT_TRUE(tok.is_eog(*tok.find_token("<|endoftext|>")));
  EXPECT_TRUE(tok.is_eog(tok.eos_id()));
  EXPECT_FALSE(tok.is_eog(*tok.find_token("<|im_start|>")));
  EXPECT_FALSE(tok.is_eog(*tok.find_token("Hello")));
  EXPECT_FALSE(tok.find_token("no such token text").has_value());
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);

  REQUIRE_TOKENIZER(spm, test::tiny_model("aidreams260K.gguf"));
  EXPECT_EQ(spm.model(), "llama");
  EXPECT_EQ(spm.bos_id(), 1);
  EXPECT_EQ(spm.eos_id(), 2);
  EXPECT_TRUE(spm.is_eog(2));
  EXPECT_FALSE(spm.is_eog(1));
  EXPECT_TRUE(spm.chat_template().empty());
}

TEST(Tokenizer, PiecesAreTheBytesTokensStandFor) {
  REQUIRE_TOKENIZER(spm, vocab("llama-spm"));
  EXPECT_EQ(spm.token_to_piece(*spm.find_token("<0x0A>")), "\n");
  EXPECT_EQ(spm.token_to_piece(*spm.find_token("<0xE4>")), "\xE4");
  EXPECT_EQ(spm.token_to_piece(*spm.find_token("\xE2\x96\x81the")), " the");
  EXPECT_EQ(spm.token_to_piece(spm.bos_id()), "<s>");
  EXPECT_THROW(spm.token_to_piece(-1), Error);
  EXPECT_THROW(spm.token_to_piece(spm.n_vocab()), Error);
  const int32_t bad[] = {5, spm.n_vocab()};
  EXPECT_THROW(spm.decode(bad), Error);

  REQUIRE_TOKENIZER(bpe, vocab("gpt-2"));
  EXPECT_EQ(bpe.token_to_piece(*bpe.find_token("\xC4\xA0the")), " the");  // "Ġthe"
  EXPECT_EQ(bpe.token_to_piece(*bpe.find_token("\xC4\x8A")), "\n");       // "Ċ"
}

TEST(Tokenizer, DecodeFollowsLlamaCppRules) {
  REQUIRE_TOKENIZER(spm, vocab("llama-spm"));
  // The space the encoder put in front comes off again.
  EXPECT_EQ(spm.decode(spm.encode("Hello world", false, false)), "Hello world");
  EXPECT_EQ(spm.decode(spm.encode("Hello world", true, false)), "<s> Hello world");
  REQUIRE_TOKENIZER(bpe, vocab("gpt-2"));
  // GPT-2 asks for clean_up_tokenization_spaces: " ," and " 's" lose the space.
  EXPECT_EQ(bpe.decode(bpe.encode("Hello , world 's end .", false, false)), "Hello, world's end.");
  REQUIRE_TOKENIZER(smol, smollm2());  // SmolLM2 does not
  EXPECT_EQ(smol.decode(smol.encode("Hello , world .", false, false)), "Hello , world .");
}

void check_stream(const Tokenizer& tok, const std::string& text, bool expect_split) {
  const auto ids = tok.encode(text, false, false);
  StreamDecoder sd(tok);
  std::string all, pieces;
  bool held_back = false;
  for (int32_t id : ids) {
    const std::string piece = tok.token_to_piece(id);
    pieces += piece;
    const std::string out = sd.push(id);
    EXPECT_TRUE(valid_utf8(out)) << "half a character streamed out after id " << id;
    if (!piece.empty() && out.empty()) held_back = true;
    all += out;
  }
  all += sd.flush();
  EXPECT_EQ(all, pieces);
  if (expect_split) {
    EXPECT_TRUE(held_back) << "no character was split over tokens: " << text;
  }
}

TEST(Tokenizer, StreamDecoderHoldsSplitCharacters) {
  REQUIRE_TOKENIZER(spm, vocab("llama-spm"));
  // U+1F999 is not in the Llama vocabulary: four <0xXX> byte tokens.
  check_stream(spm, "llama \xF0\x9F\xA6\x99 here", true);
  REQUIRE_TOKENIZER(bpe, vocab("gpt-2"));
  // GPT-2 splits the same emoji into byte-level tokens that cut its bytes.
  check_stream(bpe, "llama \xF0\x9F\xA6\x99 here, caf\xC3\xA9, \xE4\xBD\xA0\xE5\xA5\xBD", true);
  check_stream(bpe, "plain ASCII only", false);

  StreamDecoder sd(spm);
  EXPECT_EQ(sd.push(*spm.find_token("<0xE4>")), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");  // an unfinished character at the end
  EXPECT_EQ(sd.push(*spm.find_token("<0xFF>")), "\xEF\xBF\xBD");  // never valid
}

}  // namespace
}  // namespace barata
