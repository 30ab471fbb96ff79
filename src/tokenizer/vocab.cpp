// Tokenizer::from_gguf: the vocabulary, its special tokens and flags, read from
// `tokenizer.ggml.*`. The defaults and the special-token rules are llama.cpp's
// (release b4748, src/llama-vocab.cpp, llama_vocab::impl::load), restated.
#include <algorithm>
#include <cctype>

#include <spdlog/spdlog.h>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/tokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

namespace barata {
namespace tok {

Vocab::Vocab() {
  byte_token.fill(-1);
}
Vocab::~Vocab() = default;

void SpecialTrie::insert(std::string_view text, int32_t id) {
  int32_t node = 0;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    int32_t n = child(node, c);
    if (n < 0) {
      n = static_cast<int32_t>(nodes.size());
      nodes.emplace_back();
      if (node == 0)
        root[c] = n;
      else
        nodes[node].next.emplace_back(c, n);
    }
    node = n;
  }
  nodes[node].token = id;
}

int32_t SpecialTrie::child(int32_t node, unsigned char c) const {
  if (node == 0) return root[c];
  for (const auto& [b, n] : nodes[node].next)
    if (b == c) return n;
  return -1;
}

namespace {

uint32_t attr_from_type(int32_t type) {
  switch (type) {  // tokenizer.ggml.token_type values (llama.cpp llama_token_type)
    case 1:
      return kAttrNormal;
    case 2:
      return kAttrUnknown;
    case 3:
      return kAttrControl;
    case 4:
      return kAttrUserDefined;
    case 5:
      return kAttrUnused;
    case 6:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

// An id-valued key: kept when inside the vocabulary, otherwise (llama.cpp
// writes 0xFFFFFFFF for "none") the default stays.
void read_id(const GgufFile& f, const std::string& key, int32_t n_vocab, int32_t& id) {
  const auto v = f.get_int_opt(key);
  if (!v) return;
  if (*v >= 0 && *v < n_vocab) {
    id = static_cast<int32_t>(*v);
  } else if (*v != 0xFFFFFFFFll && *v != -1) {  // "none" is said quietly; anything else is not
    spdlog::warn("{}: {} = {} is outside the vocabulary of {}; keeping {}", f.name(), key, *v,
                 n_vocab, id);
  }
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void load_tokens(const GgufFile& f, Vocab& v) {
  const std::string kTokens = "tokenizer.ggml.tokens";
  if (!f.has(kTokens)) fail("{}: no {} (the file carries no vocabulary)", f.name(), kTokens);
  std::vector<std::string> texts = f.get_array<std::string>(kTokens);
  const size_t n = texts.size();
  if (n == 0 || n > static_cast<size_t>(INT32_MAX))
    fail("{}: {} has {} entries", f.name(), kTokens, n);
  std::vector<float> scores;
  if (f.has("tokenizer.ggml.scores")) scores = f.get_array<float>("tokenizer.ggml.scores");
  std::vector<int32_t> types;
  if (f.has("tokenizer.ggml.token_type")) types = f.get_array<int32_t>("tokenizer.ggml.token_type");
  if (!scores.empty() && scores.size() != n)
    fail("{}: tokenizer.ggml.scores has {} entries, expected {} (one per token)", f.name(),
         scores.size(), n);
  if (!types.empty() && types.size() != n)
    fail("{}: tokenizer.ggml.token_type has {} entries, expected {} (one per token)", f.name(),
         types.size(), n);

  v.tokens.resize(n);
  v.text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = v.tokens[i];
    t.text = std::move(texts[i]);
    if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp names it
    t.score = scores.empty() ? 0.0f : scores[i];
    t.attr = types.empty() ? kAttrNormal : attr_from_type(types[i]);
    const auto id = static_cast<int32_t>(i);
    const int32_t held = v.text_to_id.insert(Vocab::Texts{v.tokens}, id);
    if (held != id)
      fail("{}: {}: token {} duplicates token {} ({:?})", f.name(), kTokens, i, held, t.text);
    v.max_token_bytes = std::max(v.max_token_bytes, t.text.size());
  }
}

// Special ids, EOG set and the attribute fix-ups llama.cpp applies.
void load_specials(const GgufFile& f, Vocab& v) {
  const auto n = static_cast<int32_t>(v.tokens.size());
  int32_t eot = -1, eom = -1, fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1,
          fim_sep = -1;
  read_id(f, "tokenizer.ggml.bos_token_id", n, v.bos);
  read_id(f, "tokenizer.ggml.eos_token_id", n, v.eos);
  read_id(f, "tokenizer.ggml.eot_token_id", n, eot);
  read_id(f, "tokenizer.ggml.eom_token_id", n, eom);
  read_id(f, "tokenizer.ggml.unknown_token_id", n, v.unk);
  read_id(f, "tokenizer.ggml.fim_pre_token_id", n, fim_pre);
  read_id(f, "tokenizer.ggml.fim_suf_token_id", n, fim_suf);
  read_id(f, "tokenizer.ggml.fim_mid_token_id", n, fim_mid);
  read_id(f, "tokenizer.ggml.fim_pad_token_id", n, fim_pad);
  read_id(f, "tokenizer.ggml.fim_rep_token_id", n, fim_rep);
  read_id(f, "tokenizer.ggml.fim_sep_token_id", n, fim_sep);
  read_id(f, "tokenizer.ggml.prefix_token_id", n, fim_pre);  // deprecated spellings
  read_id(f, "tokenizer.ggml.suffix_token_id", n, fim_suf);
  read_id(f, "tokenizer.ggml.middle_token_id", n, fim_mid);
  for (int32_t* id : {&v.bos, &v.eos, &v.unk})
    if (*id >= n) *id = -1;  // a default that this small vocabulary does not reach
  if (f.has("tokenizer.ggml.add_bos_token"))
    v.add_bos = f.get<bool>("tokenizer.ggml.add_bos_token");

  // Tokens recognised by their text when the file names no id. llama.cpp walks
  // a hash map, so with several candidates its pick is unspecified; barata takes
  // the lowest id. A recognised token becomes a control token.
  auto detect = [&](int32_t& id, std::initializer_list<std::string_view> texts) {
    if (id >= 0) return;
    for (int32_t i = 0; i < n && id < 0; ++i)
      for (auto t : texts)
        if (v.tokens[i].text == t) {
          id = i;
          v.tokens[i].attr = kAttrControl;
          break;
        }
  };
  detect(eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
               "<｜end▁of▁sentence｜>"});
  detect(eom, {"<|eom_id|>"});
  detect(fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<｜fim▁begin｜>", "<PRE>"});
  detect(fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<｜fim▁hole｜>", "<SUF>"});
  detect(fim_mid, {"<|fim_middle|>", "<fim-middle>", "<｜fim▁end｜>", "<MID>"});
  detect(fim_pad, {"<|fim_pad|>", "<fim-pad>", "<PAD>"});
  detect(fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"});
  detect(fim_sep, {"<|file_sep|>"});

  for (int32_t id : {fim_pad, fim_rep, fim_sep, v.eos, eot, eom})
    if (id >= 0) v.eog.insert(id);
  for (std::string_view t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                             "<|endoftext|>", "<|eom_id|>", "<EOT>"}) {
    const int32_t id = v.find(t);
    if (id < 0) continue;
    v.eog.insert(id);
    if ((v.tokens[id].attr & kAttrControl) == 0) v.tokens[id].attr = kAttrControl;
  }

  // The tokens split out of the text before tokenizing, longest first. Same
  // starting order and the same std::sort as llama.cpp, so that equal lengths
  // tie the same way.
  for (int32_t id = 0; id < n; ++id)
    if (v.tokens[id].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown))
      v.special_tokens.push_back(id);
  std::sort(v.special_tokens.begin(), v.special_tokens.end(), [&](int32_t a, int32_t b) {
    return v.tokens[a].text.size() > v.tokens[b].text.size();
  });
  for (int32_t id : v.special_tokens) v.special_trie.insert(v.tokens[id].text, id);

  // Per-model attributes llama.cpp sets by name (the GGUF has no field for them).
  std::string name = f.get_or<std::string>("general.name", "");
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::string pre = f.get_or<std::string>("tokenizer.ggml.pre", "");
  auto set_attr = [&](std::string_view text, uint32_t attr, bool on) {
    const int32_t id = v.find(text);
    if (id < 0) return;
    v.tokens[id].attr = on ? (v.tokens[id].attr | attr) : (v.tokens[id].attr & ~attr);
  };
  auto contains = [](const std::string& s, std::initializer_list<std::string_view> subs) {
    return std::any_of(subs.begin(), subs.end(),
                       [&](std::string_view x) { return s.find(x) != std::string::npos; });
  };
  if (contains(pre, {"jina-v2-de", "jina-v2-es", "jina-v2-code"})) {
    set_attr("<mask>", kAttrLstrip, true);
  } else if (contains(name, {"phi-3", "phi3"})) {
    for (int32_t id : v.special_tokens) v.tokens[id].attr |= kAttrRstrip;
    set_attr("</s>", kAttrRstrip, true);
    for (auto t : {"<unk>", "<s>", "<|endoftext|>"}) set_attr(t, kAttrRstrip, false);
  }
}

void load_merges(const GgufFile& f, Vocab& v) {
  const std::string kMerges = "tokenizer.ggml.merges";
  if (!f.has(kMerges))
    fail("{}: tokenizer.ggml.model is gpt2 but there is no {}", f.name(), kMerges);
  const auto merges = f.get_array<std::string>(kMerges);
  v.merges.reserve(merges.size());
  size_t unusable = 0;
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string& m = merges[i];
    const size_t sp = m.find(' ', 1);  // the first space after the first character
    if (sp == std::string::npos) {
      ++unusable;
      continue;
    }
    const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
    const int32_t l = v.find(left), r = v.find(right);
    joined.assign(left);
    joined += right;
    const int32_t result = v.find(joined);
    // llama.cpp ranks merges by their two strings; barata by the two token
    // ids, which needs both halves and the result in the vocabulary (true of
    // every file tested; counted below otherwise).
    if (l < 0 || r < 0 || result < 0) {
      ++unusable;
      continue;
    }
    v.merges.insert(l, r, Merge{static_cast<int32_t>(i), result});  // the first rank wins
  }
  if (unusable > 0)
    spdlog::warn("{}: {} of {} merges name strings outside the vocabulary; they are ignored",
                 f.name(), unusable, merges.size());
}

}  // namespace
}  // namespace tok

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  using namespace tok;
  auto v = std::make_shared<Vocab>();
  const std::string kModel = "tokenizer.ggml.model";
  if (!f.has(kModel)) fail("{}: no {} (the file carries no tokenizer)", f.name(), kModel);
  v->model = f.get<std::string>(kModel);
  const std::string pre = f.get_or<std::string>("tokenizer.ggml.pre", "");
  const PreSpec* spec = nullptr;
  if (v->model == "llama") {
    v->kind = Kind::kSpm;
    v->pre = pre.empty() ? "default" : pre;  // SentencePiece has no pre-tokenizer
    v->bos = 1, v->eos = 2, v->unk = 0;
    v->add_bos = true;
    v->add_space_prefix = true;
    v->clean_spaces = false;
  } else if (v->model == "gpt2") {
    v->kind = Kind::kBpe;
    if (pre.empty()) {
      spdlog::warn(
          "{}: no tokenizer.ggml.pre; using the 'default' pre-tokenizer as llama.cpp "
          "does (token ids may differ from the model's own tokenizer)",
          f.name());
    }
    v->pre = pre.empty() ? "default" : pre;
    spec = find_pre_spec(v->pre);
    if (spec == nullptr)
      fail("{}: unknown tokenizer.ggml.pre '{}'; supported: {}", f.name(), v->pre,
           join(supported_pre_names()));
    v->bos = spec->no_bos ? -1 : 11, v->eos = 11, v->unk = -1;  // llama.cpp's gpt2 defaults
    v->add_bos = spec->add_bos;
    v->clean_spaces = spec->clean_spaces;
    v->ignore_merges = spec->ignore_merges;
  } else {
    fail("{}: unsupported {} '{}'; supported: llama (SentencePiece), gpt2 (byte-level BPE)",
         f.name(), kModel, v->model);
  }
  if (f.has("tokenizer.ggml.add_space_prefix"))
    v->add_space_prefix = f.get<bool>("tokenizer.ggml.add_space_prefix");
  v->chat_template = f.get_or<std::string>("tokenizer.chat_template", "");

  load_tokens(f, *v);
  load_specials(f, *v);

  for (int b = 0; b < 256; ++b) {
    if (v->kind == Kind::kSpm) {
      v->byte_token[b] = v->find(fmt::format("<0x{:02X}>", b));
      if (v->byte_token[b] < 0) v->byte_token[b] = v->find(std::string(1, static_cast<char>(b)));
    } else {
      v->byte_token[b] = v->find(byte_to_unicode()[b]);
    }
  }
  if (v->kind == Kind::kBpe) {
    // Bytes without a token are lost from any text that holds them (llama.cpp
    // drops them too; falcon's vocabulary lacks 0x0B): `inspect` says so, and
    // a load only under -v (the default model lacks 21 bytes, and a warning
    // on every run of it tells a user nothing they can act on).
    std::string missing;
    int n_missing = 0;
    for (int b = 0; b < 256; ++b)
      if (v->byte_token[b] < 0) {
        if (n_missing++ < 16) missing += fmt::format("{}0x{:02X}", missing.empty() ? "" : " ", b);
      }
    if (n_missing > 0)
      spdlog::debug(
          "{}: the vocabulary has no token for {} byte(s) ({}{}); text holding them is "
          "encoded {}",
          f.name(), n_missing, missing, n_missing > 16 ? " ..." : "",
          v->unk >= 0 ? "with the unknown token in their place" : "without them");
  }
  if (v->kind == Kind::kSpm) {
    v->spm_words_independent =
        std::none_of(v->tokens.begin(), v->tokens.end(), [](const TokenData& t) {
          const std::string_view s = t.text, space = "\xE2\x96\x81";
          for (size_t p = s.find(space, 1); p != std::string_view::npos; p = s.find(space, p + 1))
            if (p < 3 || s.substr(p - 3, 3) != space) return true;
          return false;
        });
  }
  if (v->kind == Kind::kBpe) {
    load_merges(f, *v);
    v->pre_tokenizer = std::make_unique<PreTokenizer>(spec->regexes);
  }

  v->pieces.resize(v->tokens.size());
  for (size_t i = 0; i < v->tokens.size(); ++i)
    v->pieces[i] = piece_for(*v, static_cast<int32_t>(i));
  return Tokenizer(std::move(v));
}

const std::vector<std::string>& Tokenizer::supported_pre() {
  return tok::supported_pre_names();
}

std::vector<int> Tokenizer::bytes_without_token() const {
  std::vector<int> out;
  if (v_->kind != tok::Kind::kBpe) return out;  // SentencePiece spells them with <0xXX>
  for (int b = 0; b < 256; ++b)
    if (v_->byte_token[b] < 0) out.push_back(b);
  return out;
}

int32_t Tokenizer::n_vocab() const {
  return static_cast<int32_t>(v_->tokens.size());
}
int32_t Tokenizer::bos_id() const {
  return v_->bos;
}
int32_t Tokenizer::eos_id() const {
  return v_->eos;
}
bool Tokenizer::add_bos_default() const {
  return v_->add_bos && v_->bos >= 0;
}
bool Tokenizer::is_eog(int32_t id) const {
  return v_->eog.count(id) > 0;
}
bool Tokenizer::is_text(int32_t id) const {
  if (id < 0 || id >= n_vocab()) return false;
  return (v_->tokens[static_cast<size_t>(id)].attr &
          (tok::kAttrNormal | tok::kAttrByte | tok::kAttrUserDefined)) != 0;
}
std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  const int32_t id = v_->find(text);
  return id < 0 ? std::nullopt : std::optional<int32_t>(id);
}
const std::string& Tokenizer::chat_template() const {
  return v_->chat_template;
}
const std::string& Tokenizer::model() const {
  return v_->model;
}
const std::string& Tokenizer::pre() const {
  return v_->pre;
}
const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab())
    fail("token id {} is outside the vocabulary [0, {})", id, n_vocab());
  return v_->tokens[id].text;
}

}  // namespace barata
