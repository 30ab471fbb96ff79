// The pre-tokenizer regexes of byte-level BPE vocabularies and the PCRE2
// splitter that runs them.
//
// The patterns and the `pre` names that select them are facts from llama.cpp
// release b4748 (src/llama-vocab.cpp, llm_tokenizer_bpe); llama.cpp in turn
// took most of them from each model's tokenizer.json. llama.cpp runs them three
// ways (hand-written matchers for the GPT-2 and Llama-3 patterns, std::regex
// over a text whose non-ASCII code points are collapsed to one byte per
// Unicode category, std::wregex otherwise); here PCRE2 runs them all, on the
// real text, with its own Unicode tables. Three places need care so that the
// words come out the same:
//
//  1. `\s`. llama.cpp's whitespace is a fixed set (unicode-data.cpp,
//     unicode_set_whitespace) that all three of its paths use; PCRE2's UCP `\s`
//     lacks U+0085 from it. Every `\s` / `\S` below is rewritten to that set
//     (expand_space) before compiling.
//  2. Explicit non-ASCII ranges. llama.cpp's std::wregex path first replaces
//     every non-ASCII whitespace code point by U+000B, so a range such as
//     U+0800-U+4E00 never matches the U+2000..U+3000 spaces inside it.
//     PCRE2 has no class subtraction, so such classes are written
//     `(?:(?!\s)[...])`, and the one range whose only whitespace member is
//     U+3000 (deepseek-llm's U+3000-U+3002) starts at U+3001 instead.
//  3. `$` (deepseek-llm's `\s+$`) means the end of the fragment: every match
//     runs on one fragment as its whole subject, with PCRE2_DOLLAR_ENDONLY.
//
// No pattern needs a construct PCRE2 lacks: lookahead, `(?i:...)`, `\p{..}`
// and bounded repeats are all native. The one construct that is not a regex
// feature at all, applying several patterns in sequence with each splitting
// the previous one's pieces, is PreTokenizer::split.
//
// Unicode versions: PCRE2 10.42 (Debian 12) knows Unicode 14; llama.cpp's
// tables are newer. Code points assigned since (a few hundred letters and
// symbols) may be classed differently; no test string uses them.
#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "barata/error.h"
#include "tokenizer/unicode.h"

namespace barata::tok {
namespace {

// llama.cpp's whitespace set, as the inside of a character class.
constexpr std::string_view kSpaceSet =
    R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Rewrites `\s` and `\S` to kSpaceSet (see the file comment, point 1).
std::string expand_space(std::string_view re) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && i + 1 < re.size()) {
      const char e = re[++i];
      if (e == 's') {
        out += in_class ? std::string(kSpaceSet) : "[" + std::string(kSpaceSet) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kSpaceSet) + "]";
      } else if (e == 'S') {
        fail("tokenizer: \\S inside a character class is not supported: {}", re);
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < re.size() && re[i + 1] == '^') out += re[++i];
      if (i + 1 < re.size() && re[i + 1] == ']') out += re[++i];  // a literal ']' first
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// GPT-2's pattern. llama.cpp's copy leaves out the final `|\s+`; a lone
// whitespace character before a non-space is then a gap of its own, which is
// the same word either way.
const std::string kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's pattern with the case-insensitive group spelled out, as llama.cpp
// adapts it: PCRE2's (?i:'s) would also match "'ſ" (U+017F), which case-folds
// to 's'.
const std::string kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: Llama 3's with single digits.
const std::string kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// CJK ranges of the DeepSeek patterns, whitespace excluded (point 2).
const std::string kCjk = R"((?:(?!\s)[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}])+)";
const std::string kPunctSplit =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";

std::vector<PreSpec> make_specs() {
  std::vector<PreSpec> s;
  s.push_back({{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}});
  s.push_back({{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3}, true, true, true});
  s.push_back({{"dbrx", "smaug-bpe"}, {kLlama3}});
  s.push_back({{"chatglm-bpe"}, {kLlama3}, true, false, false, true});
  s.push_back(
      {{"deepseek-llm"},
       {"[\r\n]",
        R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)",
        // llama.cpp's range ends U+3000-U+3002; U+3000 left out (point 2).
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3001}-\x{3002}]+)",
        R"(\s+$)", kCjk, R"(\p{N}+)"},
       false});
  s.push_back(
      {{"deepseek-coder"}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kCjk, R"(\p{N})"}, false});
  // llama.cpp's category collapsing leaves '~' out of \p{S}; PCRE2 (and the
  // Hugging Face tokenizer this pattern comes from) count it as a symbol.
  s.push_back(
      {{"deepseek-v3"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       false});
  s.push_back({{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}});
  s.push_back({{"starcoder", "refact", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}});
  s.push_back({{"command-r", "smollm"}, {R"(\p{N})", kGpt2}, false});
  s.push_back({{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es",
                "jina-v2-de", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais"},
               {kGpt2}});
  s.push_back({{"qwen2", "deepseek-r1-qwen"}, {kQwen2}, false});
  s.push_back({{"megrez", "stablelm2"}, {kQwen2}});
  s.push_back({{"poro-chat"}, {kPunctSplit}, false});
  s.push_back({{"bloom", "gpt3-finnish"}, {kPunctSplit}});
  s.push_back({{"viking"}, {kPunctSplit, R"(\p{N})"}, false});
  s.push_back(
      {{"tekken"},
       {R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       false,
       true,
       true});
  s.push_back({{"chameleon"},
               {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
                R"(\p{N})", R"([\p{P}!-/:-@\[-`{-~])", kGpt2},
               false,
               false,
               true});
  return s;
}

const std::vector<PreSpec>& specs() {
  static const std::vector<PreSpec> s = make_specs();
  return s;
}

// Per-thread match resources: a JIT stack that grows to 64 MiB (long runs of
// one character class backtrack deeply) and the match context holding it.
struct MatchResources {
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  MatchResources() {
    if (stack != nullptr && context != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchResources() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

MatchResources& match_resources() {
  thread_local MatchResources r;
  return r;
}

}  // namespace

const PreSpec* find_pre_spec(std::string_view pre) {
  for (const auto& s : specs())
    for (auto n : s.names)
      if (n == pre) return &s;
  return nullptr;
}

const std::vector<std::string>& supported_pre_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& s : specs())
      for (auto n : s.names) v.emplace_back(n);
    return v;
  }();
  return names;
}

struct PreTokenizer::Compiled {
  std::string source;
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(const std::vector<std::string>& regexes) {
  for (const auto& re : regexes) {
    auto c = std::make_unique<Compiled>();
    c->source = re;
    const std::string pattern = expand_space(re);
    int err = 0;
    PCRE2_SIZE err_offset = 0;
    c->code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_offset, nullptr);
    if (c->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("tokenizer: pre-tokenizer regex does not compile at offset {}: {}: {}", err_offset,
           reinterpret_cast<const char*>(msg), re);
    }
    // Without JIT (an unsupported CPU) pcre2_match interprets: slower, same words.
    pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE);
    regexes_.push_back(std::move(c));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words) const {
  if (text.empty()) return;
  using Span = std::pair<size_t, size_t>;  // byte offset, length
  std::vector<Span> cur{{0, text.size()}}, next;
  MatchResources& res = match_resources();
  for (const auto& re : regexes_) {
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
        pcre2_match_data_create_from_pattern(re->code, nullptr), pcre2_match_data_free);
    next.clear();
    next.reserve(cur.size() * 2);
    for (const auto& [off, len] : cur) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + off);
      size_t pos = 0, gap = 0;
      while (pos < len) {
        const int rc =
            pcre2_match(re->code, subject, len, pos, PCRE2_NO_UTF_CHECK, md.get(), res.context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          fail("tokenizer: pre-tokenizer regex failed on a {}-byte piece: {}: {}", len,
               reinterpret_cast<const char*>(msg), re->source);
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t b = ov[0], e = ov[1];
        if (e == b) {  // an empty match makes no word; step over one character
          pos = b + utf8_lead_len(static_cast<unsigned char>(text[off + b]));
          continue;
        }
        if (b > gap) next.emplace_back(off + gap, b - gap);
        next.emplace_back(off + b, e - b);
        gap = pos = e;
      }
      if (gap < len) next.emplace_back(off + gap, len - gap);
    }
    std::swap(cur, next);
  }
  words.reserve(words.size() + cur.size());
  for (const auto& [off, len] : cur) words.push_back(text.substr(off, len));
}

}  // namespace barata::tok
