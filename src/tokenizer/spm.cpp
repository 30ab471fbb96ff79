// SentencePiece-style encoding as llama.cpp does it for `model = llama`
// vocabularies (release b4748, src/llama-vocab.cpp, llm_tokenizer_spm_session):
// start from one symbol per UTF-8 character, repeatedly merge the adjacent pair
// whose concatenation is the vocabulary token with the highest score (ties: the
// leftmost pair), and spell whatever ends up outside the vocabulary as byte
// tokens. A priority queue of candidate pairs keeps it O(n log n) on long text.
#include <algorithm>
#include <queue>

#include "barata/error.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace barata::tok {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // '▁' U+2581

struct Symbol {
  int32_t prev, next;  // neighbours in the live chain, -1 at the ends
  uint32_t off, n;     // bytes of the text; n == 0 once merged into its left
};

struct Bigram {
  float score;
  int32_t left, right;
  uint32_t size;  // bytes of left + right when the pair was proposed
};

struct ByScore {  // the top is the highest score, then the leftmost
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

void spm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
  if (text.empty()) return;
  std::vector<Symbol> sym;
  sym.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t n =
        std::min(utf8_lead_len(static_cast<unsigned char>(text[off])), text.size() - off);
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({i - 1, i + 1, static_cast<uint32_t>(off), static_cast<uint32_t>(n)});
    off += n;
  }
  const auto n_sym = static_cast<int32_t>(sym.size());

  std::vector<Bigram> storage;
  storage.reserve(256);
  std::priority_queue<Bigram, std::vector<Bigram>, ByScore> queue(ByScore{}, std::move(storage));
  auto propose = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t size = sym[l].n + sym[r].n;
    if (size > v.max_token_bytes) return;
    const int32_t id = v.find(text.substr(sym[l].off, size));
    if (id < 0) return;
    queue.push({v.tokens[id].score, l, r, size});
  };
  auto is_space = [&](int32_t i) {
    return sym[i].n == 3 && text.compare(sym[i].off, 3, kSpmSpace) == 0;
  };

  // Merging one segment [first, last) of symbols.
  auto merge = [&](int32_t first, int32_t last) {
    sym[first].prev = -1;
    sym[last - 1].next = -1;
    for (int32_t i = first + 1; i < last; ++i) propose(i - 1, i);
    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& l = sym[b.left];
      Symbol& r = sym[b.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = b.left;
      propose(l.prev, b.left);
      propose(b.left, l.next);
    }
    for (int32_t i = first; i != -1; i = sym[i].next) {
      const std::string_view piece = text.substr(sym[i].off, sym[i].n);
      const int32_t id = v.find(piece);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (char c : piece) {  // byte fallback
        const int32_t b = v.byte_token[static_cast<unsigned char>(c)];
        if (b < 0)
          fail("tokenizer: no token for byte 0x{:02X} (no <0x{:02X}> in the vocabulary)",
               static_cast<unsigned char>(c), static_cast<unsigned char>(c));
        out.push_back(b);
      }
    }
  };

  // When no token has a '▁' after anything but another '▁' (true of the
  // Llama and Phi-3 vocabularies), no merge can cross the start of a run of
  // '▁': each word is merged on its own, with a small queue that stays in
  // cache. Same ids, and the same order of merges within each word.
  int32_t first = 0;
  if (v.spm_words_independent)
    for (int32_t i = 1; i < n_sym; ++i)
      if (is_space(i) && !is_space(i - 1)) {
        merge(first, i);
        first = i;
      }
  merge(first, n_sym);
}

}  // namespace barata::tok
