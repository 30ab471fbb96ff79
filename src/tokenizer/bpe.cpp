// Byte-level BPE as llama.cpp does it for `model = gpt2` vocabularies (release
// b4748, src/llama-vocab.cpp, llm_tokenizer_bpe_session): the text is split
// into words by the pre-tokenizer, each word's bytes become GPT-2's
// byte-to-unicode characters (one symbol per byte), and within each word the
// adjacent pair with the lowest merge rank is merged until no ranked pair
// remains (ties: the leftmost pair). Work is per word, O(w log w) for a word
// of w bytes, so long inputs stay linear in practice.
#include <algorithm>
#include <queue>

#include "barata/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace barata::tok {
namespace {

struct Symbol {
  int32_t prev, next;  // neighbours in the live chain, -1 at the ends
  int32_t id;          // token id, -1 if the byte has none; -2 once merged away
};

struct Bigram {
  int32_t rank;
  int32_t left, right;
  int32_t left_id, right_id, result;
};

struct ByRank {  // the top is the lowest rank, then the leftmost
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

// A byte whose token the vocabulary lacks becomes the unknown token when
// there is one; without one it is dropped, as llama.cpp drops it. A real
// vocabulary does this: falcon's has no token for 0x0B (vertical tab), and
// llama.cpp's ids for it (tests/data/tokenizer/random_mix.jsonl) omit the byte.
void missing_byte(const Vocab& v, unsigned char /*b*/, std::vector<int32_t>& out) {
  if (v.unk >= 0) out.push_back(v.unk);
}

class WordMerger {
 public:
  explicit WordMerger(const Vocab& v) : v_(v) {}

  void encode(std::string_view word, std::vector<int32_t>& out) {
    if (v_.ignore_merges) {  // llama3, tekken: a word that is a token is taken whole
      encoded_.clear();
      for (char c : word) encoded_ += byte_to_unicode()[static_cast<unsigned char>(c)];
      const int32_t id = v_.find(encoded_);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    const auto n = static_cast<int32_t>(word.size());
    sym_.clear();
    for (int32_t i = 0; i < n; ++i)
      sym_.push_back(
          {i - 1, i + 1 == n ? -1 : i + 1, v_.byte_token[static_cast<unsigned char>(word[i])]});
    heap_.clear();
    for (int32_t i = 1; i < n; ++i) propose(i - 1, i);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), ByRank{});
      const Bigram b = heap_.back();
      heap_.pop_back();
      Symbol& l = sym_[b.left];
      Symbol& r = sym_[b.right];
      if (l.id != b.left_id || r.id != b.right_id || l.next != b.right) continue;  // stale
      l.id = b.result;
      r.id = -2;
      l.next = r.next;
      if (r.next >= 0) sym_[r.next].prev = b.left;
      propose(l.prev, b.left);
      propose(b.left, l.next);
    }
    for (int32_t i = 0; i != -1; i = sym_[i].next) {
      if (sym_[i].id >= 0)
        out.push_back(sym_[i].id);
      else
        missing_byte(v_, static_cast<unsigned char>(word[static_cast<size_t>(i)]), out);
    }
  }

 private:
  void propose(int32_t l, int32_t r) {
    if (l < 0 || r < 0 || sym_[l].id < 0 || sym_[r].id < 0) return;
    const Merge* m = v_.merges.find(sym_[l].id, sym_[r].id);
    if (m == nullptr) return;
    heap_.push_back({m->rank, l, r, sym_[l].id, sym_[r].id, m->result});
    std::push_heap(heap_.begin(), heap_.end(), ByRank{});
  }

  const Vocab& v_;
  std::vector<Symbol> sym_;
  std::vector<Bigram> heap_;
  std::string encoded_;
};

}  // namespace

void bpe_encode(const Vocab& v, std::string_view raw, std::vector<int32_t>& out) {
  std::string bytes, match;
  const bool differ = sanitize_utf8(raw, bytes, match);
  const std::string& text = differ ? match : bytes;
  std::vector<std::string_view> words;
  v.pre_tokenizer->split(text, words);
  if (differ)  // the same words, from the bytes that hold the surrogates
    for (auto& w : words) w = std::string_view(bytes).substr(w.data() - text.data(), w.size());
  WordMerger merger(v);
  for (std::string_view w : words) {
    if (w.size() == 1) {  // the most common word after splitting: one byte
      const int32_t id = v.byte_token[static_cast<unsigned char>(w[0])];
      if (id >= 0)
        out.push_back(id);
      else
        missing_byte(v, static_cast<unsigned char>(w[0]), out);
      continue;
    }
    merger.encode(w, out);
  }
}

}  // namespace barata::tok
