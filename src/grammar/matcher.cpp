// The grammar's pushdown automaton over bytes, the vocabulary trie and the
// token masks (see grammar.h for the scheme).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "barata/error.h"
#include "barata/grammar.h"
#include "barata/tokenizer.h"

namespace barata {
namespace {

using Kind = Grammar::Kind;

// How many of a stack's top positions decide a token before the rest is
// consulted. Three covers a JSON string's character loop and its closing
// quote, so that the costly in-string walk is shared by every string.
constexpr size_t kTopDepth = 3;
constexpr size_t kMaxStacks = 4096;  // more: an ambiguous grammar, refused
constexpr size_t kMaskCacheSize = 512;
constexpr int kMaxExpandDepth = 1000;  // rule references followed without a byte

void normalize(GrammarStacks& s) {
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  if (s.size() > kMaxStacks)
    fail("grammar: a state has more than {} parses at once (the grammar is too ambiguous)",
         kMaxStacks);
}

uint64_t fnv(uint64_t h, std::string_view s) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

// ---- the vocabulary ------------------------------------------------------

GrammarVocab::GrammarVocab(const Tokenizer& tok) : n_vocab(tok.n_vocab()) {
  const size_t n = static_cast<size_t>(n_vocab);
  pieces.resize(n);
  eog.assign(n, 0);
  eog_bits.assign((n + 63) / 64, 0);
  for (int32_t id = 0; id < n_vocab; ++id) {
    if (tok.is_eog(id)) {
      eog[static_cast<size_t>(id)] = 1;
      eog_bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    }
    if (tok.is_text(id)) pieces[static_cast<size_t>(id)] = std::string(tok.piece(id));
  }
  for (int32_t id = 0; id < n_vocab; ++id)
    if (!pieces[static_cast<size_t>(id)].empty()) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const int c = pieces[static_cast<size_t>(a)].compare(pieces[static_cast<size_t>(b)]);
    return c != 0 ? c < 0 : a < b;
  });
  std::vector<uint32_t> path;  // path[k]: the node at depth k + 1
  const std::string* prev = nullptr;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string& p = pieces[static_cast<size_t>(ids[k])];
    if (p.size() > std::numeric_limits<uint16_t>::max())
      fail("grammar: token {} is {} bytes long", ids[k], p.size());
    size_t lcp = 0;
    if (prev)
      while (lcp < p.size() && lcp < prev->size() && p[lcp] == (*prev)[lcp]) ++lcp;
    while (path.size() > lcp) {
      end[path.back()] = static_cast<uint32_t>(byte.size());
      path.pop_back();
    }
    for (size_t d = lcp; d < p.size(); ++d) {
      path.push_back(static_cast<uint32_t>(byte.size()));
      byte.push_back(static_cast<unsigned char>(p[d]));
      depth.push_back(static_cast<uint16_t>(d + 1));
      end.push_back(0);
      tok_begin.push_back(static_cast<uint32_t>(k));
      tok_end.push_back(static_cast<uint32_t>(k));
    }
    tok_end[path.back()] = static_cast<uint32_t>(k + 1);
    prev = &p;
  }
  while (!path.empty()) {
    end[path.back()] = static_cast<uint32_t>(byte.size());
    path.pop_back();
  }
}

std::shared_ptr<const GrammarVocab> GrammarVocab::of(const Tokenizer& tok) {
  static std::mutex mu;
  static std::map<uint64_t, std::weak_ptr<const GrammarVocab>> cache;
  uint64_t h = 1469598103934665603ull;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    h = fnv(h, tok.piece(id));
    h = fnv(h, tok.is_text(id) ? "t" : (tok.is_eog(id) ? "e" : "c"));
  }
  std::lock_guard<std::mutex> lock(mu);
  if (auto v = cache[h].lock()) return v;
  auto v = std::make_shared<const GrammarVocab>(tok);
  cache[h] = v;
  return v;
}

// ---- the automaton -------------------------------------------------------

GrammarIndex::GrammarIndex(std::shared_ptr<const Grammar> g, std::shared_ptr<const GrammarVocab> v)
    : g_(std::move(g)), v_(std::move(v)) {}

size_t GrammarIndex::VecHash::operator()(const std::vector<uint32_t>& v) const {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t x : v) h = (h ^ x) * 1099511628211ull;
  return static_cast<size_t>(h);
}

// Replaces a stack whose top is a reference or an ended alternative by the
// stacks whose tops are byte sets (or the escape marker, or nothing left:
// the start rule is complete), into out.
void GrammarIndex::expand(GrammarStack& s, GrammarStacks& out, int depth) const {
  if (depth > kMaxExpandDepth)
    fail("grammar: rules nest more than {} deep without taking a byte", kMaxExpandDepth);
  if (s.empty()) {
    out.push_back(s);
    return;
  }
  const uint32_t p = s.back();
  const Grammar::Elem e = g_->elems[p];
  switch (e.kind) {
    case Kind::kBytes:
    case Kind::kEscape:
      out.push_back(s);
      return;
    case Kind::kEnd:
      s.pop_back();
      expand(s, out, depth + 1);
      s.push_back(p);
      return;
    case Kind::kRef: {
      s.pop_back();
      const bool more = g_->elems[p + 1].kind != Kind::kEnd;  // else a tail call
      if (more) s.push_back(p + 1);
      for (uint32_t a : g_->alts[e.arg]) {
        s.push_back(a);
        expand(s, out, depth + 1);
        s.pop_back();
      }
      if (more) s.pop_back();
      s.push_back(p);
      if (out.size() > kMaxStacks * 4)
        fail("grammar: a state has more than {} parses at once (the grammar is too ambiguous)",
             kMaxStacks);
      return;
    }
  }
}

GrammarStacks GrammarIndex::initial() const {
  GrammarStacks out;
  GrammarStack s;
  for (uint32_t a : g_->alts[g_->root]) {
    s.assign(1, a);
    expand(s, out);
  }
  normalize(out);
  return out;
}

void GrammarIndex::advance(const GrammarStacks& in, unsigned char b, GrammarStacks& out) const {
  out.clear();
  GrammarStack t;
  for (const GrammarStack& s : in) {
    if (s.empty()) continue;
    const uint32_t p = s.back();
    const Grammar::Elem e = g_->elems[p];
    if (e.kind != Kind::kBytes || !Grammar::has(g_->sets[e.arg], b)) continue;
    t.assign(s.begin(), s.end() - 1);
    if (g_->elems[p + 1].kind != Kind::kEnd) t.push_back(p + 1);
    expand(t, out);
  }
  normalize(out);
}

bool GrammarIndex::accepts(const GrammarStacks& from, std::string_view bytes) const {
  GrammarStacks a = from, b;
  for (unsigned char c : bytes) {
    advance(a, c, b);
    if (b.empty()) return false;
    a.swap(b);
  }
  return true;
}

bool GrammarIndex::matches(std::string_view text) const {
  GrammarStacks st = initial(), nx;
  for (unsigned char c : text) {
    advance(st, c, nx);
    if (nx.empty()) return false;
    st.swap(nx);
  }
  return !st.empty() && st.front().empty();
}

// The tokens decided by a stack's top positions alone: one walk of the trie
// from the stack [escape, top...]. A token whose bytes all fit in the top is
// accepted; one that needs what lies below (the escape marker reached after
// e of its bytes) is uncertain, with e; the rest are refused.
int32_t GrammarIndex::intern(GrammarStacks&& s) const {
  std::vector<uint32_t> key;
  for (const GrammarStack& x : s) {
    key.insert(key.end(), x.begin(), x.end());
    key.push_back(UINT32_MAX);
  }
  auto [it, fresh] = walk_ids_.emplace(std::move(key), static_cast<int32_t>(walk_states_.size()));
  if (fresh) {
    walk_states_.push_back(std::move(s));
    std::array<int32_t, 256> none;
    none.fill(-1);
    walk_next_.push_back(none);
  }
  return it->second;
}

int32_t GrammarIndex::step(int32_t state, unsigned char b, bool* escaped) const {
  int32_t t = walk_next_[static_cast<size_t>(state)][b];
  if (t < 0) {
    GrammarStacks out;
    advance(walk_states_[static_cast<size_t>(state)], b, out);
    const auto gone = std::remove_if(
        out.begin(), out.end(), [](const GrammarStack& s) { return !s.empty() && s.back() == 0; });
    const bool esc = gone != out.end();
    out.erase(gone, out.end());
    t = intern(std::move(out)) * 2 + (esc ? 1 : 0);
    walk_next_[static_cast<size_t>(state)][b] = t;
  }
  *escaped = t & 1;
  return t >> 1;
}

// The tokens decided by a stack's top positions alone: one walk of the trie
// from the stack [escape, top...]. A token whose bytes all fit in the top is
// accepted; one that needs what lies below (the escape marker reached after
// e of its bytes) is uncertain, with e; the rest are refused.
GrammarIndex::TopInfo GrammarIndex::classify(std::span<const uint32_t> top) const {
  const GrammarVocab& V = *v_;
  TopInfo info;
  info.accepted.assign((static_cast<size_t>(V.n_vocab) + 63) / 64, 0);
  auto set = [&](int32_t id) {
    info.accepted[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  };
  const int32_t dead = intern(GrammarStacks());
  GrammarStacks first;
  GrammarStack s0(1, 0);  // position 0: the escape marker
  s0.insert(s0.end(), top.begin(), top.end());
  expand(s0, first);
  normalize(first);
  std::vector<int32_t> lv(1, intern(std::move(first)));
  std::vector<uint16_t> esc;  // depths on the path where the top was left
  const size_t N = V.byte.size();
  for (size_t i = 0; i < N;) {
    const size_t d = V.depth[i];
    lv.resize(d);
    while (!esc.empty() && esc.back() >= d) esc.pop_back();
    bool escaped = false;
    const int32_t nx = step(lv[d - 1], V.byte[i], &escaped);
    if (escaped) esc.push_back(static_cast<uint16_t>(d));
    if (nx == dead && esc.empty()) {
      i = V.end[i];
      continue;
    }
    if (nx == dead) {
      // Nothing goes on inside the top: every token below is decided by the rest.
      for (size_t j = i; j < V.end[i]; ++j)
        for (uint32_t k = V.tok_begin[j]; k < V.tok_end[j]; ++k) {
          const int32_t id = V.ids[k];
          if (j == i && escaped) {
            set(id);
            continue;
          }
          for (uint16_t e : esc)
            if (e < V.depth[j]) info.uncertain.emplace_back(id, e);
        }
      i = V.end[i];
      continue;
    }
    for (uint32_t k = V.tok_begin[i]; k < V.tok_end[i]; ++k) set(V.ids[k]);
    lv.push_back(nx);
    ++i;
  }
  return info;
}

const GrammarIndex::TopInfo& GrammarIndex::top_info(std::span<const uint32_t> top) const {
  std::vector<uint32_t> key(top.begin(), top.end());
  auto it = tops_.find(key);
  if (it != tops_.end()) return *it->second;
  ++stats_.tops;
  auto info = std::make_unique<TopInfo>(classify(top));
  return *tops_.emplace(std::move(key), std::move(info)).first->second;
}

void GrammarIndex::mask(const GrammarStacks& state, std::vector<uint64_t>& bits) const {
  const size_t words = (static_cast<size_t>(v_->n_vocab) + 63) / 64;
  std::vector<uint32_t> key;
  for (const GrammarStack& s : state) {
    key.insert(key.end(), s.begin(), s.end());
    key.push_back(UINT32_MAX);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.masks;
  if (auto it = masks_.find(key); it != masks_.end()) {
    ++stats_.mask_hits;
    bits = it->second;
    return;
  }
  bits.assign(words, 0);
  GrammarStack rest;
  GrammarStacks below;
  for (const GrammarStack& s : state) {
    if (s.empty()) continue;
    const size_t k = std::min(kTopDepth, s.size());
    const TopInfo& ti = top_info(std::span<const uint32_t>(s).subspan(s.size() - k));
    for (size_t w = 0; w < words; ++w) bits[w] |= ti.accepted[w];
    if (ti.uncertain.empty() || k == s.size()) continue;  // below the whole stack: nothing
    rest.assign(s.begin(), s.end() - static_cast<std::ptrdiff_t>(k));
    below.clear();
    expand(rest, below);
    normalize(below);
    Grammar::ByteSet first{};
    for (const GrammarStack& b : below)
      if (!b.empty() && g_->elems[b.back()].kind == Kind::kBytes)
        for (int w = 0; w < 4; ++w) first[w] |= g_->sets[g_->elems[b.back()].arg][w];
    for (auto [id, e] : ti.uncertain) {
      const size_t i = static_cast<size_t>(id);
      if ((bits[i >> 6] >> (i & 63)) & 1) continue;
      const std::string& p = v_->pieces[i];
      if (!Grammar::has(first, static_cast<unsigned char>(p[e]))) continue;
      ++stats_.uncertain_checked;
      if (accepts(below, std::string_view(p).substr(e))) bits[i >> 6] |= uint64_t{1} << (i & 63);
    }
  }
  if (masks_.size() >= kMaskCacheSize) masks_.clear();
  masks_.emplace(std::move(key), bits);
}

void GrammarIndex::mask_brute_force(const GrammarStacks& state, std::vector<uint64_t>& bits) const {
  bits.assign((static_cast<size_t>(v_->n_vocab) + 63) / 64, 0);
  for (size_t i = 0; i < v_->pieces.size(); ++i)
    if (!v_->pieces[i].empty() && accepts(state, v_->pieces[i]))
      bits[i >> 6] |= uint64_t{1} << (i & 63);
}

GrammarIndex::Stats GrammarIndex::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

// ---- one sequence --------------------------------------------------------

GrammarMatcher::GrammarMatcher(std::shared_ptr<const GrammarIndex> idx)
    : idx_(std::move(idx)), stacks_(idx_->initial()) {}

bool GrammarMatcher::complete() const {
  return !stacks_.empty() && stacks_.front().empty();  // sorted: the empty stack first
}
bool GrammarMatcher::can_continue() const {
  return stacks_.size() > (complete() ? 1u : 0u);
}

int64_t GrammarMatcher::apply(std::span<float> logits) {
  const auto t0 = std::chrono::steady_clock::now();
  const GrammarVocab& V = idx_->vocab();
  idx_->mask(stacks_, bits_);
  const bool done = complete();
  const size_t nv = std::min(logits.size(), static_cast<size_t>(V.n_vocab));
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  int64_t n = 0;
  for (size_t w = 0; w * 64 < nv; ++w) {
    uint64_t m = bits_[w] | (done ? V.eog_bits[w] : 0);
    const size_t base = w * 64, end = std::min(base + 64, nv);
    if (end - base < 64) m &= (uint64_t{1} << (end - base)) - 1;
    n += std::popcount(m);
    if (m == ~uint64_t{0}) continue;
    for (size_t i = base; i < end; ++i)
      if (!((m >> (i - base)) & 1)) logits[i] = kNegInf;
  }
  for (size_t i = nv; i < logits.size(); ++i) logits[i] = kNegInf;
  apply_us_.push_back(static_cast<float>(
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count()));
  return n;
}

bool GrammarMatcher::accept(int32_t token) {
  const GrammarVocab& V = idx_->vocab();
  if (token < 0 || token >= V.n_vocab) return false;
  const size_t t = static_cast<size_t>(token);
  if (V.eog[t]) return complete();
  const std::string& p = V.pieces[t];
  if (p.empty()) return false;
  tmp_ = stacks_;
  for (unsigned char c : p) {
    idx_->advance(tmp_, c, tmp2_);
    if (tmp2_.empty()) return false;
    tmp_.swap(tmp2_);
  }
  stacks_.swap(tmp_);
  return true;
}

std::shared_ptr<const GrammarIndex> grammar_index(std::string_view gbnf, const Tokenizer& tok) {
  static std::mutex mu;
  // Most recently used last; a few entries (each may hold megabytes of masks).
  static std::vector<std::pair<std::string, std::shared_ptr<const GrammarIndex>>> cache;
  auto vocab = GrammarVocab::of(tok);
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < cache.size(); ++i)
      if (cache[i].first == gbnf && &cache[i].second->vocab() == vocab.get()) {
        auto hit = cache[i];
        cache.erase(cache.begin() + static_cast<std::ptrdiff_t>(i));
        cache.push_back(hit);
        return hit.second;
      }
  }
  auto idx = std::make_shared<const GrammarIndex>(Grammar::parse(gbnf), std::move(vocab));
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace_back(std::string(gbnf), idx);
  if (cache.size() > 16) cache.erase(cache.begin());
  return idx;
}

}  // namespace barata
