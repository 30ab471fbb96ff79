// The tokenizer of a Hugging Face checkpoint as GGUF tokenizer.ggml.* keys.
// Byte-level BPE only (GPT-2, Llama 3, Qwen2, SmolLM2 style). Key names and
// token types: llama.cpp's gguf-py constants and convert_hf_to_gguf.py
// (facts about the format, no code taken from it).
#include <map>
#include <optional>

#include "barata/error.h"
#include "barata/file_io.h"
#include "convert/hf_json.h"
#include "tokenizer/pretokenizer.h"

namespace barata::hf {

using nlohmann::json;

namespace {

// Hugging Face's ByteLevel pre-tokenizer regex (tokenizers, byte_level.rs),
// used when ByteLevel has use_regex: true.
const std::string kByteLevelRegex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The case-insensitive contraction group of the Llama 3 / Qwen2 patterns, as
// tokenizer.json writes it and as pretokenizer.cpp spells it out.
const std::string kCaseGroupHf = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
const std::string kCaseGroupPcre = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

std::string normalize_regex(std::string re) {
  for (size_t p; (p = re.find(kCaseGroupHf)) != std::string::npos;)
    re.replace(p, kCaseGroupHf.size(), kCaseGroupPcre);
  return re;
}

struct PreInfo {
  std::vector<std::string> regexes;
  bool byte_level = false;
};

void collect_pre(const json& pt, const std::string& file, PreInfo& out) {
  if (pt.is_null()) return;
  const std::string type = pt.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : pt.value("pretokenizers", json::array())) collect_pre(p, file, out);
  } else if (type == "ByteLevel") {
    if (pt.value("add_prefix_space", false))
      fail("{}: pre_tokenizer ByteLevel with add_prefix_space is not supported", file);
    if (pt.value("use_regex", true)) out.regexes.push_back(kByteLevelRegex);
    out.byte_level = true;
  } else if (type == "Split") {
    const auto pat = pt.find("pattern");
    if (pat == pt.end() || !pat->is_object() || !pat->contains("Regex") ||
        !(*pat)["Regex"].is_string() || pt.value("behavior", "") != "Isolated" ||
        pt.value("invert", false))
      fail("{}: pre_tokenizer Split {} is not supported (only an isolating Regex split)", file,
           pt.dump());
    out.regexes.push_back(normalize_regex((*pat)["Regex"].get<std::string>()));
  } else if (type == "Digits") {
    out.regexes.push_back(pt.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)");
  } else {
    fail("{}: pre_tokenizer type '{}' is not supported", file, type);
  }
}

// The tokenizer.ggml.pre name whose regexes are exactly `regexes`; among
// equals, the one whose decoding and merge flags match best.
std::string choose_pre(const std::vector<std::string>& regexes, bool clean_spaces,
                       bool ignore_merges, const std::string& file) {
  const tok::PreSpec* best = nullptr;
  int best_score = -1;
  for (const auto& name : tok::supported_pre_names()) {
    const tok::PreSpec* s = tok::find_pre_spec(name);
    if (s == nullptr || s->regexes != regexes) continue;
    const int score = (s->clean_spaces == clean_spaces) + (s->ignore_merges == ignore_merges);
    if (score > best_score) best = s, best_score = score;
  }
  if (best == nullptr) {
    std::string list;
    for (const auto& r : regexes) list += (list.empty() ? "" : ", ") + json(r).dump();
    fail("{}: pre_tokenizer regexes [{}] match no supported tokenizer.ggml.pre", file, list);
  }
  return std::string(best->names.front());
}

// "bos_token": "<s>" or {"content": "<s>", ...}.
std::optional<std::string> token_content(const json& cfg, const char* key) {
  const auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

// Whether tokenizer.json's post-processor puts a special token first.
bool post_processor_adds_bos(const json& pp) {
  if (!pp.is_object()) return false;
  const std::string type = pp.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : pp.value("processors", json::array()))
      if (post_processor_adds_bos(p)) return true;
    return false;
  }
  if (type != "TemplateProcessing") return false;
  const auto single = pp.find("single");
  return single != pp.end() && single->is_array() && !single->empty() &&
         (*single)[0].contains("SpecialToken");
}

}  // namespace

namespace {

void add_tokenizer_metadata_from(const std::filesystem::path& dir, const json& config, Metadata& md,
                                 std::vector<std::filesystem::path>& inputs) {
  const auto tok_path = dir / "tokenizer.json";
  const std::string file = tok_path.string();
  const json tj = read_json(tok_path);
  inputs.push_back(tok_path);
  json tc = json::object();
  const auto tc_path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(tc_path, ec)) {
    tc = read_json(tc_path);
    inputs.push_back(tc_path);
    if (!tc.is_object()) fail("{}: not a JSON object", tc_path.string());
  }

  if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object())
    fail("{}: missing key 'model'", file);
  const json& model = tj["model"];
  const std::string type = model.value("type", "");
  if (type != "BPE")
    fail("{}: model.type is '{}': only byte-level BPE tokenizers are supported", file, type);
  if (model.value("byte_fallback", false))
    fail(
        "{}: model.byte_fallback is true (a SentencePiece-style BPE): only byte-level BPE "
        "tokenizers are supported",
        file);
  PreInfo pre;
  collect_pre(tj.value("pre_tokenizer", json()), file, pre);
  if (!pre.byte_level)
    fail("{}: pre_tokenizer has no ByteLevel step: only byte-level BPE tokenizers are supported",
         file);

  // Tokens by id: the vocabulary, then the added tokens.
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) fail("{}: missing key 'model.vocab'", file);
  std::map<int64_t, std::string> by_id;
  std::map<int64_t, int32_t> types;  // added tokens only
  auto put = [&](int64_t id, const std::string& text, const char* where) {
    if (id < 0 || id >= INT32_MAX) fail("{}: {} token {:?} has id {}", file, where, text, id);
    auto [it, fresh] = by_id.emplace(id, text);
    if (!fresh && it->second != text)
      fail("{}: {} token {:?} has id {}, which {:?} already has", file, where, text, id,
           it->second);
  };
  for (const auto& [text, id] : vocab->items()) {
    if (!id.is_number_integer()) fail("{}: model.vocab[{:?}] is not an integer id", file, text);
    put(id.get<int64_t>(), text, "model.vocab");
  }
  for (const auto& at : tj.value("added_tokens", json::array())) {
    if (!at.is_object() || !at.contains("id") || !at["id"].is_number_integer() ||
        !at.contains("content") || !at["content"].is_string())
      fail("{}: added_tokens entry {} lacks an integer id or a content string", file, at.dump());
    const int64_t id = at["id"].get<int64_t>();
    put(id, at["content"].get<std::string>(), "added_tokens");
    types[id] = at.value("special", false) ? 3 : 4;  // control : user-defined
  }
  const auto n_tok = static_cast<int64_t>(by_id.size());
  if (n_tok == 0) fail("{}: model.vocab is empty", file);
  if (by_id.rbegin()->first != n_tok - 1)
    fail("{}: token ids are not dense: {} tokens but the largest id is {}", file, n_tok,
         by_id.rbegin()->first);
  // An embedding table wider than the tokenizer (config.json vocab_size, e.g.
  // Qwen2's rounded-up 151936): the extra ids become unused "[PAD<id>]" tokens,
  // as llama.cpp's converter names them.
  const auto vs = config.find("vocab_size");
  // Padding is a rounding-up (Qwen2: 271 ids); a config asking for millions
  // more ids than the tokenizer has is refused before they are made.
  constexpr int64_t kMaxPadding = int64_t{1} << 16;
  if (vs != config.end() && vs->is_number_integer() && vs->get<int64_t>() > n_tok + kMaxPadding)
    fail("{}: vocab_size {} is {} more than the {} tokens of {} (at most {} padding ids)",
         (dir / "config.json").string(), vs->get<int64_t>(), vs->get<int64_t>() - n_tok, n_tok,
         file, kMaxPadding);
  if (vs != config.end() && vs->is_number_integer() && vs->get<int64_t>() > n_tok) {
    for (int64_t id = n_tok; id < vs->get<int64_t>(); ++id) {
      put(id, "[PAD" + std::to_string(id) + "]", "padding");
      types[id] = 5;  // unused
    }
  }
  const auto n = static_cast<int64_t>(by_id.size());
  std::map<std::string, int64_t> id_of;
  std::vector<GgufValue> tokens, token_types;
  tokens.reserve(static_cast<size_t>(n));
  token_types.reserve(static_cast<size_t>(n));
  for (const auto& [id, text] : by_id) {
    if (const auto [it, fresh] = id_of.emplace(text, id); !fresh)
      fail("{}: token {:?} has two ids, {} and {}", file, text, it->second, id);
    tokens.emplace_back(text);
    const auto t = types.find(id);
    token_types.emplace_back(static_cast<int32_t>(t == types.end() ? 1 : t->second));
  }

  std::vector<GgufValue> merges;
  for (const auto& m : model.value("merges", json::array())) {
    if (m.is_string()) {
      merges.emplace_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      const auto a = m[0].get<std::string>(), b = m[1].get<std::string>();
      if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
        fail("{}: merge {} has a space inside a token, which GGUF merges cannot hold", file,
             m.dump());
      merges.emplace_back(a + " " + b);
    } else {
      fail("{}: model.merges entry {} is neither \"a b\" nor [a, b]", file, m.dump());
    }
  }
  if (merges.empty()) fail("{}: model.merges is empty", file);

  bool clean = true;
  if (const auto it = tc.find("clean_up_tokenization_spaces"); it != tc.end()) {
    if (!it->is_boolean())
      fail("{}: clean_up_tokenization_spaces is {}, expected true or false", tc_path.string(),
           printable(it->dump()));
    clean = it->get<bool>();
  }
  const std::string pre_name =
      choose_pre(pre.regexes, clean, model.value("ignore_merges", false), file);

  md.emplace_back("tokenizer.ggml.model", "gpt2");
  md.emplace_back("tokenizer.ggml.pre", pre_name);
  md.emplace_back("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, std::move(tokens)));
  md.emplace_back("tokenizer.ggml.token_type",
                  GgufValue::array(GgufType::INT32, std::move(token_types)));
  md.emplace_back("tokenizer.ggml.merges", GgufValue::array(GgufType::STRING, std::move(merges)));

  // Special ids: tokenizer_config.json's token strings, else config.json's ids.
  auto special = [&](const char* tc_key, const char* cfg_key, const char* gguf_key) {
    if (const auto content = token_content(tc, tc_key)) {
      const auto it = id_of.find(*content);
      if (it == id_of.end())
        fail("{}: {} {:?} is not in the vocabulary of {}", tc_path.string(), tc_key, *content,
             file);
      md.emplace_back(gguf_key, GgufValue(static_cast<uint32_t>(it->second)));
      return;
    }
    const auto it = config.find(cfg_key);
    if (it != config.end() && it->is_number_integer() && it->get<int64_t>() >= 0 &&
        it->get<int64_t>() < n)
      md.emplace_back(gguf_key, GgufValue(static_cast<uint32_t>(it->get<int64_t>())));
  };
  special("bos_token", "bos_token_id", "tokenizer.ggml.bos_token_id");
  special("eos_token", "eos_token_id", "tokenizer.ggml.eos_token_id");

  bool add_bos = false;
  if (const auto it = tc.find("add_bos_token"); it != tc.end() && it->is_boolean())
    add_bos = it->get<bool>();
  else
    add_bos = post_processor_adds_bos(tj.value("post_processor", json()));
  md.emplace_back("tokenizer.ggml.add_bos_token", add_bos);
  if (const auto it = tc.find("chat_template"); it != tc.end() && it->is_string())
    md.emplace_back("tokenizer.chat_template", it->get<std::string>());
}

}  // namespace

void add_tokenizer_metadata(const std::filesystem::path& dir, const json& config, Metadata& md,
                            std::vector<std::filesystem::path>& inputs) {
  // tokenizer_config.json's values are type-checked where read; any other
  // JSON type error comes from tokenizer.json's structure.
  with_json_errors(dir / "tokenizer.json",
                   [&] { add_tokenizer_metadata_from(dir, config, md, inputs); });
}

}  // namespace barata::hf
