// Pre-tokenization for byte-level BPE: the regexes named by
// `tokenizer.ggml.pre`, run with PCRE2 (UTF + UCP, JIT).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace barata::tok {

// What one `tokenizer.ggml.pre` value means (llama.cpp b4748,
// src/llama-vocab.cpp: llama_vocab::impl::load and llm_tokenizer_bpe).
struct PreSpec {
  std::vector<std::string_view> names;  // the values that select it
  std::vector<std::string> regexes;     // applied in order, see PreTokenizer
  bool clean_spaces = true;             // decode: clean_up_tokenization_spaces
  bool ignore_merges = false;           // a word that is a token is taken whole
  bool add_bos = false;                 // default for add_bos_token
  bool no_bos = false;                  // the vocabulary has no BOS token
};

// The spec for a `pre` value, or nullptr.
const PreSpec* find_pre_spec(std::string_view pre);
// Every supported value, in table order.
const std::vector<std::string>& supported_pre_names();

class PreTokenizer {
 public:
  // Compiles the patterns; throws barata::Error on a pattern PCRE2 rejects.
  explicit PreTokenizer(const std::vector<std::string>& regexes);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits valid UTF-8 into words, as llama.cpp's unicode_regex_split does:
  // the text starts as one fragment; each regex in turn splits every fragment
  // into its matches and the gaps between them (both kept, in order). A regex
  // sees one fragment at a time: lookarounds and `$` stop at its edges.
  void split(std::string_view text, std::vector<std::string_view>& words) const;

 private:
  struct Compiled;
  std::vector<std::unique_ptr<Compiled>> regexes_;
};

}  // namespace barata::tok
