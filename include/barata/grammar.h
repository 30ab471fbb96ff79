// Grammar-constrained decoding: a GBNF grammar (llama.cpp's syntax, so that
// users' .gbnf files work) compiled to a pushdown automaton over bytes, and
// per step the set of vocabulary ids whose bytes it accepts.
//
// The automaton: every rule is a list of alternatives, each a sequence of
// byte sets and rule references; code-point classes ([^"\\], [α-ω], ".") are
// compiled to their UTF-8 byte sequences, and repetitions (* + ? {m,n}) to
// rules of their own. A state is a set of stacks of positions (the top is the
// byte set to match next, the rest where each enclosing rule goes on).
//
// The token mask of a state (GrammarMatcher::mask) is the union over its
// stacks. Each stack's top few positions decide most tokens by themselves:
// walking the vocabulary's byte trie once from them gives the tokens accepted
// whatever lies below ("context-independent") and the few that run past them
// (e.g. `",` after a string's last character), which are checked against the
// rest of the stack at run time. The first is cached per top, for the life of
// the GrammarIndex; whole masks are cached per state. See docs/grammar.md.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace barata {

class Tokenizer;

// A compiled grammar; immutable, shared by every sequence that uses it.
class Grammar {
 public:
  // Parses GBNF text. `root` names the start rule. Throws barata::Error
  // naming the line and column, or the rule (undefined, left-recursive).
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf,
                                              std::string_view root = "root");

  enum class Kind : uint8_t { kBytes, kRef, kEnd, kEscape };
  struct Elem {
    Kind kind;
    uint32_t arg;  // kBytes: index into sets; kRef: rule id
  };
  using ByteSet = std::array<uint64_t, 4>;
  static bool has(const ByteSet& s, unsigned char b) { return (s[b >> 6] >> (b & 63)) & 1; }

  // Every alternative of every rule, each ended by kEnd, in one array; a
  // position is an index into it. Position 0 is a kEscape (GrammarIndex's
  // marker for "below the stacks' top").
  std::vector<Elem> elems;
  std::vector<ByteSet> sets;
  std::vector<std::vector<uint32_t>> alts;  // per rule, where each alternative starts
  std::vector<std::string> rule_names;      // generated rules are "name_N"
  uint32_t root = 0;
  std::string source;  // the text it was parsed from
};

// A stack of grammar positions, top at the back; a state is a sorted set of them.
using GrammarStack = std::vector<uint32_t>;
using GrammarStacks = std::vector<GrammarStack>;

// A tokenizer's vocabulary as a byte trie (preorder, so that each subtree is a
// range), built once per tokenizer and shared.
class GrammarVocab {
 public:
  explicit GrammarVocab(const Tokenizer& tok);
  // One per tokenizer (by its contents), kept while anyone holds it.
  static std::shared_ptr<const GrammarVocab> of(const Tokenizer& tok);

  int32_t n_vocab = 0;
  // Trie nodes in preorder: the byte leading to it, its depth (bytes from the
  // root), the end of its subtree, and the token ids whose bytes end there.
  std::vector<unsigned char> byte;
  std::vector<uint16_t> depth;
  std::vector<uint32_t> end;
  std::vector<uint32_t> tok_begin, tok_end;  // into ids
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;  // per id; "" for tokens no grammar can produce
  std::vector<uint8_t> eog;         // per id: an end-of-generation token
  std::vector<uint64_t> eog_bits;   // the same as bits
};

// A grammar over a vocabulary, with the caches of its masks; thread-safe.
class GrammarIndex {
 public:
  GrammarIndex(std::shared_ptr<const Grammar> g, std::shared_ptr<const GrammarVocab> v);
  const Grammar& grammar() const { return *g_; }
  const GrammarVocab& vocab() const { return *v_; }

  // The stacks of the start state.
  GrammarStacks initial() const;
  // The whole text is a sentence of the grammar (the start rule complete after it).
  bool matches(std::string_view text) const;
  // The stacks after one more byte (empty: the byte is refused).
  void advance(const GrammarStacks& in, unsigned char b, GrammarStacks& out) const;
  // The mask of a state, one bit per id (eog ids excluded: the caller
  // allows them when the state is complete). Computed or from the cache.
  void mask(const GrammarStacks& state, std::vector<uint64_t>& bits) const;
  // The same by trying every token's bytes (for tests).
  void mask_brute_force(const GrammarStacks& state, std::vector<uint64_t>& bits) const;

  struct Stats {
    int64_t masks = 0, mask_hits = 0, tops = 0, uncertain_checked = 0;
  };
  Stats stats() const;

 private:
  struct TopInfo {
    std::vector<uint64_t> accepted;
    std::vector<std::pair<int32_t, uint16_t>> uncertain;  // (id, bytes taken in the top)
  };
  const TopInfo& top_info(std::span<const uint32_t> top) const;
  TopInfo classify(std::span<const uint32_t> top) const;
  // The walks' automaton: sets of stacks over [escape, top...] interned as
  // ids, with their transitions memoized (a string's character loop is one
  // state, so a walk is a table lookup per trie node).
  int32_t intern(GrammarStacks&& s) const;
  int32_t step(int32_t state, unsigned char b, bool* escaped) const;
  void expand(GrammarStack& s, GrammarStacks& out, int depth = 0) const;
  bool accepts(const GrammarStacks& from, std::string_view bytes) const;

  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const GrammarVocab> v_;
  mutable std::mutex mu_;
  struct VecHash {
    size_t operator()(const std::vector<uint32_t>& v) const;
  };
  mutable std::unordered_map<std::vector<uint32_t>, std::unique_ptr<TopInfo>, VecHash> tops_;
  // Whole masks by state (the stacks flattened with separators), bounded.
  mutable std::unordered_map<std::vector<uint32_t>, std::vector<uint64_t>, VecHash> masks_;
  mutable Stats stats_;
  mutable std::unordered_map<std::vector<uint32_t>, int32_t, VecHash> walk_ids_;
  mutable std::vector<GrammarStacks> walk_states_;
  mutable std::vector<std::array<int32_t, 256>> walk_next_;  // -1 unknown; else id * 2 + escaped
};

// One sequence's place in its grammar.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const GrammarIndex> idx);
  // Sets the logits of every token the grammar refuses here to -inf (an
  // end-of-generation token is refused unless the grammar is complete).
  // Returns how many tokens stay allowed.
  int64_t apply(std::span<float> logits);
  // Takes a token; false (and the state unchanged) when the grammar refuses it.
  bool accept(int32_t token);
  // The start rule can end here (end of generation is allowed).
  bool complete() const;
  // Some stack can still take bytes.
  bool can_continue() const;
  const GrammarStacks& state() const { return stacks_; }
  const GrammarIndex& index() const { return *idx_; }
  // Microseconds of each apply() (the mask and writing it into the logits).
  const std::vector<float>& apply_us() const { return apply_us_; }

 private:
  std::shared_ptr<const GrammarIndex> idx_;
  GrammarStacks stacks_, tmp_, tmp2_;
  std::vector<uint64_t> bits_;
  std::vector<float> apply_us_;
};

// The index of a GBNF text over a tokenizer's vocabulary, from a cache of
// the texts used last (so that a server's repeated schemas keep their masks).
// Throws barata::Error as Grammar::parse.
std::shared_ptr<const GrammarIndex> grammar_index(std::string_view gbnf, const Tokenizer& tok);

// A JSON Schema as GBNF (see src/grammar/json_schema.cpp for what is
// understood). Throws barata::Error naming the keyword and where it is (a
// JSON pointer) for what it cannot express.
// Properties are written in the schema's order, hence ordered_json.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
std::string json_schema_to_gbnf(std::string_view schema_json);
// Any JSON object (OpenAI's response_format {"type": "json_object"}).
std::string json_object_gbnf();

}  // namespace barata
