// Tokenizer built from a GGUF file's `tokenizer.ggml.*` metadata: SentencePiece-
// style (`model = llama`: score-driven merging, byte fallback through <0xXX>
// tokens) and byte-level BPE (`model = gpt2`: merge ranks, a pre-tokenizer
// regex chosen by `tokenizer.ggml.pre`). Token ids are exact against llama.cpp
// (release b4748) on every vocabulary test set it ships; docs/tokenizer.md says
// what was verified.
//
// Special tokens. Control and unknown tokens (`<s>`, `<|im_start|>`) are found
// inside the text only when `parse_special` is true. User-defined tokens are
// always split out before the rest of the text is tokenized, whatever
// `parse_special` says: that is what llama.cpp and Hugging Face tokenizers do,
// and the reference vectors depend on it.
//
// Invalid UTF-8 in the input never throws and never crashes; it is handled as
// llama.cpp does:
//   - SentencePiece vocabularies: the text is split into symbols by lead
//     byte only (a malformed lead byte takes as many following bytes as it
//     announces, possibly part of the '▁' standing for a space), and whatever
//     no token covers is spelled byte by byte with <0xXX> tokens: the ids are
//     llama.cpp's, and decode() gives the bytes back (a space swallowed that
//     way comes back as '▁').
//   - BPE vocabularies: every byte that does not start a sequence of the
//     announced length is U+FFFD before pre-tokenization (llama.cpp's
//     unicode_cpts_from_utf8: a malformed lead or stray continuation byte
//     consumes one byte). Like llama.cpp, overlong forms are taken as the code
//     point they spell and UTF-16 surrogates (ED A0 80) pass through as their
//     bytes. The one difference: a value above U+10FFFF (F4 90 80 80 and up)
//     is U+FFFD here, where llama.cpp aborts.
//
// A Tokenizer is immutable after from_gguf, cheap to copy (shared state), and
// safe to use from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace barata {

class GgufFile;

namespace tok {
struct Vocab;
}

// Bytes [begin, end) of a text.
struct TextRange {
  size_t begin = 0, end = 0;
};

class Tokenizer {
 public:
  // Reads tokens, scores, token types, merges, special ids and flags. Throws
  // barata::Error naming the key and the problem: a missing token list, an
  // unsupported `tokenizer.ggml.model`, an unknown `tokenizer.ggml.pre` (the
  // message lists the supported ones), arrays of mismatched length.
  static Tokenizer from_gguf(const GgufFile& f);

  // Every `tokenizer.ggml.pre` value a BPE vocabulary may carry.
  static const std::vector<std::string>& supported_pre();

  // Text to ids. `add_bos` prepends bos_id() (callers usually pass
  // add_bos_default()); no EOS is ever appended. Empty text gives [] or [bos].
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;
  // The same, except that no special token is found where it would overlap
  // one of the `literal` ranges (sorted, disjoint): text a client typed stays
  // text inside a template whose markup is parsed (barata serve's chat).
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special,
                              std::span<const TextRange> literal) const;

  // The bytes one token stands for: byte tokens give their byte, SentencePiece
  // '▁' gives ' ', BPE pieces are mapped back through the byte-to-unicode
  // table; control, unknown and user-defined tokens give their text
  // (llama.cpp's token_to_piece with special = true). Unused and undefined
  // tokens give "". May be part of a UTF-8 character. Throws on an id outside
  // [0, n_vocab).
  std::string token_to_piece(int32_t id) const;
  // The same bytes without a copy; valid while the tokenizer lives.
  std::string_view piece(int32_t id) const;

  // Ids to text as llama.cpp's llama_detokenize(remove_special = false,
  // unparse_special = render_special): pieces concatenated, one leading space
  // of the first piece dropped when the vocabulary adds a space prefix, and
  // for vocabularies that ask for it (clean_up_tokenization_spaces) the
  // " ." " ," " 's" ... clean-up. With render_special false, control and
  // unknown tokens give "".
  std::string decode(std::span<const int32_t> ids, bool render_special = true) const;

  int32_t n_vocab() const;
  // Byte values no token stands for (BPE vocabularies only): text holding
  // them is encoded with the unknown token, or without them.
  std::vector<int> bytes_without_token() const;
  int32_t bos_id() const;  // -1 when the vocabulary has none
  int32_t eos_id() const;  // -1 when the vocabulary has none
  // tokenizer.ggml.add_bos_token; when absent llama.cpp's default: true for
  // SentencePiece, false for BPE except the pre-tokenizers that add one
  // (llama3, tekken, chameleon).
  bool add_bos_default() const;
  // End of generation: eos, eot, eom and the tokens llama.cpp recognises by
  // their text (<|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>,
  // <|eom_id|>, <EOT>) and the FIM pad/repo/file-separator tokens.
  bool is_eog(int32_t id) const;
  // A token that stands for text (normal, byte or user-defined), not a
  // control, unknown or unused one: what a grammar may produce.
  bool is_text(int32_t id) const;
  // The id whose token text is exactly `text` (e.g. "<|im_start|>").
  std::optional<int32_t> find_token(std::string_view text) const;
  const std::string& chat_template() const;         // tokenizer.chat_template or ""
  const std::string& model() const;                 // "llama" or "gpt2"
  const std::string& pre() const;                   // tokenizer.ggml.pre, or "default"
  const std::string& token_text(int32_t id) const;  // as stored in the file

 private:
  explicit Tokenizer(std::shared_ptr<const tok::Vocab> v) : v_(std::move(v)) {}
  std::shared_ptr<const tok::Vocab> v_;
};

// Streaming decode for generated tokens: push() returns the text that became
// complete, never half a UTF-8 character; an incomplete character waits for
// the next token. The concatenated output equals the concatenated
// token_to_piece() bytes when those are valid UTF-8; bytes that can never form
// a character come out as U+FFFD, so the output is always valid UTF-8.
// flush() returns what is still held (an unfinished character as U+FFFD).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& t) : t_(t) {}
  std::string push(int32_t id);
  // As push, appending the final text to out (no temporaries: a step's
  // text costs no allocation once out has room).
  void push(int32_t id, std::string& out);
  std::string flush();

 private:
  Tokenizer t_;
  std::string pending_;
};

}  // namespace barata
