// libFuzzer target for the tokenizers: arbitrary bytes encoded and decoded on
// a SentencePiece vocabulary and on byte-level BPE vocabularies (one per
// pre-tokenizer below), parse-special on and off, and random id sequences
// (out-of-range ids included) decoded. Only barata::Error may escape, and
// only where the contract allows it (an id outside [0, n_vocab)).
//
// Input: byte 0 selects the vocabulary and the flags, the rest is the text
// (and, read as little-endian int32, the ids to decode).
//
// The SentencePiece vocabulary is the GGUF named by BARATA_FUZZ_SPM_VOCAB,
// else tests/data/models/aidreams260K.gguf when present, else a synthetic one
// built here; BPE vocabularies are always synthetic (BARATA_FUZZ_BPE_VOCAB
// adds a file's).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/gguf.h"
#include "barata/tokenizer.h"

namespace {

using barata::GgufFile;
using barata::GgufType;
using barata::GgufValue;
using barata::GgufWriter;
using barata::Tokenizer;

struct Vocab {
  std::string label;
  std::vector<uint8_t> bytes;  // keeps the GgufFile's buffer alive
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

// The GPT-2 byte-to-unicode character of byte b, as UTF-8.
std::string byte_char(int b) {
  const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  uint32_t cpt = static_cast<uint32_t>(b);
  if (!printable) {
    uint32_t shifted = 0;
    for (int c = 0; c < b; ++c)
      if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++shifted;
    cpt = 256 + shifted;
  }
  std::string s;
  if (cpt < 0x80) {
    s += static_cast<char>(cpt);
  } else {
    s += static_cast<char>(0xC0 | (cpt >> 6));
    s += static_cast<char>(0x80 | (cpt & 0x3F));
  }
  return s;
}

// A byte-level BPE vocabulary: the 256 byte characters, merges of common
// English pairs (and their space-prefixed forms), and special tokens.
std::vector<uint8_t> synthetic_bpe(const std::string& pre) {
  GgufWriter w;
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", pre);
  std::vector<GgufValue> tokens, types;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(byte_char(b));
    types.emplace_back(int32_t{1});
  }
  const std::string sp = byte_char(' '), nl = byte_char('\n');
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {sp, "t"},    {"h", "e"},    {sp + "t", "h"}, {"th", "e"}, {"i", "n"},
      {"e", "r"}, {sp, "a"},    {"o", "n"},    {"r", "e"},      {sp, "s"},   {"a", "n"},
      {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {nl, nl},        {"1", "2"},  {"e", "s"}};
  std::vector<GgufValue> merge_strings;
  for (const auto& [a, b] : merges) {
    merge_strings.emplace_back(a + " " + b);
    tokens.emplace_back(a + b);
    types.emplace_back(int32_t{1});
  }
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.emplace_back(special);
    types.emplace_back(int32_t{3});  // control
  }
  tokens.emplace_back("<tool>");  // user-defined
  types.emplace_back(int32_t{4});
  const auto n = static_cast<uint32_t>(tokens.size());
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::INT32, std::move(types)));
  w.set("tokenizer.ggml.merges", GgufValue::array(GgufType::STRING, std::move(merge_strings)));
  w.set("tokenizer.ggml.bos_token_id", uint32_t{n - 4});
  w.set("tokenizer.ggml.eos_token_id", uint32_t{n - 4});
  return w.to_bytes();
}

// A SentencePiece vocabulary with byte fallback: <unk> <s> </s>, the 256 byte
// tokens, scored pieces, and special tokens.
std::vector<uint8_t> synthetic_spm() {
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
  float score = -1.0f;
  for (const std::string& piece : std::vector<std::string>{
           sp,   sp + "the", "the",      "th",           "he",      "e", "t",
           "h",  "a",        sp + "a",   "in",           sp + "in", "o", "n",
           "on", sp + "on",  "\xC3\xA9", "\xE4\xB8\xAD", sp + sp,   ".", ","}) {
    tokens.emplace_back(piece);
    scores.emplace_back(score);
    types.emplace_back(int32_t{1});
    score -= 0.25f;
  }
  tokens.emplace_back("<|user|>");
  scores.emplace_back(0.0f);
  types.emplace_back(int32_t{4});
  tokens.emplace_back("<unused0>");
  scores.emplace_back(0.0f);
  types.emplace_back(int32_t{5});
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::array(GgufType::FLOAT32, std::move(scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::INT32, std::move(types)));
  w.set("tokenizer.ggml.bos_token_id", uint32_t{1});
  w.set("tokenizer.ggml.eos_token_id", uint32_t{2});
  w.set("tokenizer.ggml.unknown_token_id", uint32_t{0});
  return w.to_bytes();
}

Vocab make(std::string label, std::vector<uint8_t> bytes) {
  Vocab v{std::move(label), std::move(bytes), nullptr, nullptr};
  v.file = std::make_unique<GgufFile>(GgufFile::from_memory(v.bytes, v.label));
  v.tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*v.file));
  return v;
}

Vocab open(const std::filesystem::path& path) {
  Vocab v{path.filename().string(), {}, nullptr, nullptr};
  v.file = std::make_unique<GgufFile>(GgufFile::open(path));
  v.tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*v.file));
  return v;
}

std::vector<Vocab>& vocabs() {
  static std::vector<Vocab> all = [] {
    std::vector<Vocab> out;
    try {
      const char* spm = std::getenv("BARATA_FUZZ_SPM_VOCAB");
#ifdef BARATA_SOURCE_DIR
      const std::filesystem::path committed =
          std::filesystem::path(BARATA_SOURCE_DIR) / "tests/data/models/aidreams260K.gguf";
#else
      const std::filesystem::path committed;
#endif
      std::error_code ec;
      if (spm != nullptr && *spm != '\0')
        out.push_back(open(spm));
      else if (!committed.empty() && std::filesystem::exists(committed, ec))
        out.push_back(open(committed));
      out.push_back(make("synthetic-spm", synthetic_spm()));
      if (const char* bpe = std::getenv("BARATA_FUZZ_BPE_VOCAB"); bpe != nullptr && *bpe != '\0')
        out.push_back(open(bpe));
      for (const char* pre : {"gpt-2", "llama-bpe", "qwen2", "smollm", "deepseek-coder", "falcon",
                              "starcoder", "tekken"})
        out.push_back(make(std::string("synthetic-bpe-") + pre, synthetic_bpe(pre)));
    } catch (const barata::Error& e) {
      std::fprintf(stderr, "fuzz_tokenizer: setup failed: %s\n", e.what());
      std::abort();
    }
    for (const auto& v : out)
      std::fprintf(stderr, "fuzz_tokenizer: vocabulary %s\n", v.label.c_str());
    return out;
  }();
  return all;
}

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cpt = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cpt = (cpt << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cpt < kMin[n] || cpt > 0x10FFFF || (cpt >= 0xD800 && cpt <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

[[noreturn]] void finding(const Vocab& v, const char* what) {
  std::fprintf(stderr, "fuzz_tokenizer: %s on %s\n", what, v.label.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  auto& all = vocabs();
  const uint8_t sel = data[0];
  const Vocab& v = all[sel % all.size()];
  const bool parse_special = (sel & 0x10) != 0, add_bos = (sel & 0x20) != 0;
  const bool render_special = (sel & 0x40) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Tokenizer& tok = *v.tok;
  const int32_t n_vocab = tok.n_vocab();

  // Encode: never throws; every id is in range; decode of the result works.
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, add_bos, parse_special);
  } catch (const barata::Error&) {
    finding(v, "encode threw barata::Error");
  }
  for (int32_t id : ids)
    if (id < 0 || id >= n_vocab) finding(v, "encode returned an id outside the vocabulary");
  std::string back;
  try {
    back = tok.decode(ids, render_special);
    barata::StreamDecoder sd(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += sd.push(id);
    streamed += sd.flush();
    if (!valid_utf8(streamed)) finding(v, "StreamDecoder produced invalid UTF-8");
  } catch (const barata::Error&) {
    finding(v, "decode of encode()'s ids threw");
  }
  // Byte-level BPE is lossless on valid UTF-8 without special tokens: the pieces
  // put together are the text (decode() may clean up spaces on top).
  if (tok.model() == "gpt2" && !parse_special && !add_bos && valid_utf8(text)) {
    std::string pieces;
    for (int32_t id : ids) pieces += tok.token_to_piece(id);
    if (pieces != text) {
      std::fprintf(stderr, "fuzz_tokenizer: text '%s' came back as '%s' (%zu ids)\n",
                   barata::printable(text).c_str(), barata::printable(pieces).c_str(), ids.size());
      finding(v, "BPE pieces of encode(text) != text");
    }
  }

  // Decode of arbitrary ids: in range must work; out of range must be an Error.
  std::vector<int32_t> raw;
  for (size_t i = 1; i + 4 <= size; i += 4) {
    int32_t id;
    std::memcpy(&id, data + i, 4);
    // Mostly in range, sometimes just outside it, sometimes anything.
    if ((id & 0x30000000) != 0x30000000)
      id = static_cast<int32_t>(static_cast<uint32_t>(id) % static_cast<uint32_t>(n_vocab + 2)) - 1;
    raw.push_back(id);
  }
  bool out_of_range = false;
  for (int32_t id : raw) out_of_range |= id < 0 || id >= n_vocab;
  try {
    (void)tok.decode(raw, render_special);
    if (out_of_range) finding(v, "decode accepted an id outside the vocabulary");
    barata::StreamDecoder sd(tok);
    std::string streamed;
    for (int32_t id : raw) streamed += sd.push(id);
    streamed += sd.flush();
    if (!valid_utf8(streamed)) finding(v, "StreamDecoder produced invalid UTF-8");
    for (int32_t id : raw) (void)tok.token_to_piece(id);
  } catch (const barata::Error&) {
    if (!out_of_range) finding(v, "decode of in-range ids threw");
  }
  return 0;
}
