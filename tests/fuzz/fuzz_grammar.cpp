// libFuzzer target for the grammars: arbitrary text parsed as GBNF (byte 0
// even) or converted from a JSON Schema first (byte 0 odd); a grammar that
// compiles is walked a few tokens over a small SentencePiece vocabulary
// (tests/data/models/stories260K.gguf's, 512 tokens), and at each step its
// token mask must equal the brute-force check of every token. Only
// barata::Error may escape; a mask that differs aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/grammar.h"
#include "barata/tokenizer.h"

namespace {

std::shared_ptr<const barata::GrammarVocab> vocab() {
  static const std::shared_ptr<const barata::GrammarVocab> v = [] {
    const barata::GgufFile f = barata::GgufFile::open(std::filesystem::path(BARATA_SOURCE_DIR) /
                                                      "tests/data/models/stories260K.gguf");
    const barata::Tokenizer tok = barata::Tokenizer::from_gguf(f);
    return std::make_shared<const barata::GrammarVocab>(tok);
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const std::string gbnf = (mode & 1) ? barata::json_schema_to_gbnf(text) : std::string(text);
    auto ix = std::make_shared<barata::GrammarIndex>(barata::Grammar::parse(gbnf), vocab());
    barata::GrammarMatcher m(ix);
    std::vector<uint64_t> fast, slow;
    for (int step = 0; step < 4; ++step) {
      ix->mask(m.state(), fast);
      ix->mask_brute_force(m.state(), slow);
      if (fast != slow) std::abort();
      // The ((mode >> 1) + step)-th allowed token, cyclically.
      std::vector<int32_t> ok;
      for (size_t i = 0; i < fast.size() * 64; ++i)
        if ((fast[i >> 6] >> (i & 63)) & 1) ok.push_back(static_cast<int32_t>(i));
      if (ok.empty()) break;
      const int32_t pick =
          ok[(static_cast<size_t>(mode >> 1) + static_cast<size_t>(step) * 7) % ok.size()];
      if (!m.accept(pick)) std::abort();
    }
  } catch (const barata::Error&) {
  }
  return 0;
}
