// The tokenizer's state, shared by the files of src/tokenizer/: vocabulary,
// special tokens, merge ranks and the pre-tokenizer. Built once by
// Tokenizer::from_gguf (vocab.cpp), read-only afterwards.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "tokenizer/index.h"

namespace barata::tok {

// Token attributes as bit flags; the values are llama.cpp's llama_token_attr
// (include/llama.h), so the rules taken from llama-vocab.cpp read the same.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrLstrip = 1u << 7,  // eat whitespace left of the token when splitting it out
  kAttrRstrip = 1u << 8,  // ... and right of it
};

struct TokenData {
  std::string text;  // as stored in tokenizer.ggml.tokens
  float score = 0.0f;
  uint32_t attr = kAttrNormal;
};

// A trie over the special tokens' texts, to find which of them occur in a text
// in one pass (see encode.cpp).
struct SpecialTrie {
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> next;  // byte -> child node
    int32_t token = -1;                                   // token ending here
  };
  std::vector<Node> nodes{Node{}};
  std::array<int32_t, 256> root;  // the root's children by byte, -1 if none
  SpecialTrie() { root.fill(-1); }
  void insert(std::string_view text, int32_t id);
  int32_t child(int32_t node, unsigned char c) const;
};

class PreTokenizer;  // pretokenizer.cpp

enum class Kind { kSpm, kBpe };

struct Vocab {
  Kind kind = Kind::kSpm;
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre or "default"
  std::string chat_template;

  std::vector<TokenData> tokens;
  TextIndex text_to_id;
  size_t max_token_bytes = 0;

  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false;
  bool add_space_prefix = false;       // SPM: a ' ' before text that follows BOS/specials
  bool clean_spaces = false;           // decode: clean_up_tokenization_spaces
  bool ignore_merges = false;          // BPE: a word that is a token is taken whole
  bool spm_words_independent = false;  // SPM: no token has '▁' after a non-'▁' (spm.cpp)

  // Control, user-defined and unknown tokens, longest text first (the order in
  // which llama.cpp splits them out of the text).
  std::vector<int32_t> special_tokens;
  SpecialTrie special_trie;
  std::unordered_set<int32_t> eog;

  // The token standing for each byte: SPM <0xXX> (or the byte itself as text);
  // BPE the byte's character in the byte-to-unicode table. -1 when absent.
  std::array<int32_t, 256> byte_token;

  MergeTable merges;  // BPE
  std::unique_ptr<PreTokenizer> pre_tokenizer;

  std::vector<std::string> pieces;  // token_to_piece for every id

  Vocab();
  ~Vocab();
  // The id whose text is exactly `text`, or -1.
  int32_t find(std::string_view text) const { return text_to_id.find(Texts{tokens}, text); }
  struct Texts {  // the token list seen as texts, for TextIndex
    const std::vector<TokenData>& t;
    std::string_view operator[](int32_t id) const { return t[id].text; }
  };
};

// SentencePiece-style encoding of one text fragment (spaces already '▁').
void spm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out);
// Byte-level BPE of one raw text fragment: pre-tokenize, then merge each word.
void bpe_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out);
// token_to_piece with llama.cpp's rules; "" for types that have no piece.
std::string piece_for(const Vocab& v, int32_t id);

}  // namespace barata::tok
