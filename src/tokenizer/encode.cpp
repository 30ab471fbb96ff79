// Tokenizer::encode: special tokens are split out of the text first, then each
// stretch of plain text goes through the SentencePiece or the BPE path. The
// splitting rules are llama.cpp's (release b4748, src/llama-vocab.cpp,
// tokenizer_st_partition and tokenize), restated.
#include <algorithm>
#include <climits>

#include "barata/error.h"
#include "barata/tokenizer.h"
#include "tokenizer/vocab.h"

namespace barata {
namespace tok {
namespace {

struct Fragment {
  int32_t token;  // >= 0: a special token; -1: text[off, off + len)
  size_t off, len;
};

bool is_c_space(char c) {  // C isspace in the "C" locale, as llama.cpp strips with
  return c == ' ' || (c >= '\t' && c <= '\r');
}

bool eligible(const Vocab& v, int32_t id, bool parse_special) {
  return parse_special || (v.tokens[id].attr & (kAttrControl | kAttrUnknown)) == 0;
}

// The special tokens that occur anywhere in the text, sorted by id: one pass
// over the text with the trie, so that a vocabulary with thousands of special
// tokens does not cost thousands of passes.
std::vector<int32_t> present_specials(const Vocab& v, std::string_view text, bool parse_special) {
  std::vector<int32_t> found;
  const SpecialTrie& trie = v.special_trie;
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = trie.child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      const int32_t id = trie.nodes[node].token;
      if (id >= 0 && eligible(v, id, parse_special)) found.push_back(id);
    }
  }
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  return found;
}

// Splits every text fragment at each occurrence of one special token, left to
// right, dropping the whitespace its lstrip/rstrip attributes ask for.
// True when [b, e) overlaps one of the sorted, disjoint ranges.
bool overlaps(std::span<const TextRange> ranges, size_t b, size_t e) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), b,
                             [](size_t x, const TextRange& r) { return x < r.end; });
  return it != ranges.end() && it->begin < e;
}

void split_on(const Vocab& v, std::string_view text, int32_t id, std::vector<Fragment>& frags,
              std::vector<Fragment>& scratch, std::span<const TextRange> literal) {
  const std::string& tok = v.tokens[id].text;
  const uint32_t attr = v.tokens[id].attr;
  // Only the tokens parse_special governs; user-defined ones split as ever.
  const bool guarded = !literal.empty() && (attr & (kAttrControl | kAttrUnknown)) != 0;
  scratch.clear();
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      scratch.push_back(f);
      continue;
    }
    size_t off = f.off, len = f.len;
    size_t from = 0;  // where to look next, relative to off
    while (len > 0) {
      const size_t rel = text.substr(off, len).find(tok, from);
      if (rel == std::string_view::npos) break;
      if (guarded && overlaps(literal, off + rel, off + rel + tok.size())) {
        from = rel + 1;  // text, not a token: look past it
        continue;
      }
      from = 0;
      size_t left = rel;
      if (attr & kAttrLstrip)
        while (left > 0 && is_c_space(text[off + left - 1])) --left;
      if (left > 0) scratch.push_back({-1, off, left});
      scratch.push_back({id, 0, 0});
      size_t r_off = off + rel + tok.size(), r_len = len - rel - tok.size();
      if (attr & kAttrRstrip)
        while (r_len > 0 && is_c_space(text[r_off])) ++r_off, --r_len;
      off = r_off, len = r_len;
    }
    if (len > 0) scratch.push_back({-1, off, len});
  }
  std::swap(frags, scratch);
}

std::vector<Fragment> partition(const Vocab& v, std::string_view text, bool parse_special,
                                std::span<const TextRange> literal) {
  std::vector<Fragment> frags, scratch;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  const std::vector<int32_t> present = present_specials(v, text, parse_special);
  if (present.empty()) return frags;
  for (int32_t id : v.special_tokens)  // longest first
    if (std::binary_search(present.begin(), present.end(), id))
      split_on(v, text, id, frags, scratch, literal);
  return frags;
}

}  // namespace
}  // namespace tok

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos,
                                       bool parse_special) const {
  return encode(text, add_bos, parse_special, {});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special,
                                       std::span<const TextRange> literal) const {
  using namespace tok;
  const Vocab& v = *v_;
  if (text.size() > static_cast<size_t>(INT32_MAX))  // symbol offsets are 32-bit
    fail("tokenizer: a text of {} bytes is over the 2 GiB limit", text.size());
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos) {
    if (v.bos < 0) fail("tokenizer: BOS requested but the vocabulary has no BOS token");
    out.push_back(v.bos);
  }
  const std::vector<Fragment> frags = partition(v, text, parse_special, literal);
  bool prev_special = true;  // SPM: the text at the start counts as after a special token
  std::string buf;
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string_view piece = text.substr(f.off, f.len);
    if (v.kind == Kind::kSpm) {
      // SentencePiece sees spaces as '▁' (U+2581), and a space before text
      // that starts the input or follows a special token.
      buf.clear();
      buf.reserve(piece.size() + piece.size() / 4 + 3);
      if (v.add_space_prefix && prev_special) buf += "\xE2\x96\x81";
      for (char c : piece) {
        if (c == ' ')
          buf += "\xE2\x96\x81";
        else
          buf += c;
      }
      spm_encode(v, buf, out);
    } else {
      bpe_encode(v, piece, out);
    }
    prev_special = false;
  }
  return out;
}

}  // namespace barata
