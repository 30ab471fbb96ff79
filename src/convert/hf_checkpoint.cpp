// load_hf_checkpoint: a Hugging Face checkpoint directory seen as GGUF
// metadata plus lazily loaded fp32 tensors in GGUF naming.
//
// Key names, value types and tensor names follow what llama.cpp's
// convert_hf_to_gguf.py writes for LlamaForCausalLM and Qwen2ForCausalLM
// (facts about the format, no code taken from it).
#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <fmt/ranges.h>

#include "barata/convert.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/model.h"
#include "convert/hf_json.h"
#include "convert/safetensors.h"

namespace barata {

using nlohmann::json;

namespace hf {

json read_json(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("{}: not found", path.string());
  const std::string text = read_regular_file(path, "JSON file");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), printable(e.what()));
  }
}

void throw_json_error(const std::filesystem::path& file, const nlohmann::json::exception& e) {
  // e.what() is "[json.exception.type_error.302] type must be string, but is number".
  std::string what = e.what();
  if (const auto p = what.find("] "); what.rfind("[json.", 0) == 0 && p != std::string::npos)
    what = what.substr(p + 2);
  fail("{}: unexpected JSON structure: {}", file.string(), printable(what));
}

}  // namespace hf

namespace {

struct Config {
  std::string arch;  // GGUF architecture
  int64_t n_layer = 0, d_model = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  bool tied = false;
};

// Reads config.json into `c` and the model's GGUF keys into `md`.
class ConfigReader {
 public:
  ConfigReader(const std::filesystem::path& path, const json& j) : file_(path.string()), j_(j) {
    if (!j_.is_object()) fail("{}: not a JSON object", file_);
  }

  const json* find(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  const json& need(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) fail("{}: missing key '{}'", file_, key);
    return *v;
  }
  int64_t positive(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr && fallback) return *fallback;
    if (v == nullptr) fail("{}: missing key '{}'", file_, key);
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > UINT32_MAX)
      fail("{}: key '{}' is {}, expected a positive integer", file_, key, v->dump());
    return v->get<int64_t>();
  }
  double number(const char* key, std::optional<double> fallback = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr && fallback) return *fallback;
    if (v == nullptr) fail("{}: missing key '{}'", file_, key);
    if (!v->is_number()) fail("{}: key '{}' is {}, expected a number", file_, key, v->dump());
    return v->get<double>();
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  const json& j_;
};

Config read_config(const ConfigReader& r, const std::string& model_name, hf::Metadata& md) {
  Config c;
  const json& archs = r.need("architectures");
  if (!archs.is_array() || archs.empty() || !archs[0].is_string())
    fail("{}: key 'architectures' is {}, expected a list of class names", r.file(), archs.dump());
  const std::string cls = archs[0].get<std::string>();
  if (cls == "LlamaForCausalLM") {
    c.arch = "llama";
  } else if (cls == "Qwen2ForCausalLM") {
    c.arch = "qwen2";
  } else {
    fail(
        "{}: key 'architectures' is {}: unsupported (supported: LlamaForCausalLM, "
        "Qwen2ForCausalLM)",
        r.file(), archs.dump());
  }
  if (const json* rs = r.find("rope_scaling"))
    fail("{}: key 'rope_scaling' is {}: RoPE scaling is not supported", r.file(), rs->dump());
  if (const json* sw = r.find("use_sliding_window"); sw && sw->is_boolean() && sw->get<bool>())
    fail("{}: key 'use_sliding_window' is true: sliding-window attention is not supported",
         r.file());

  c.n_layer = r.positive("num_hidden_layers");
  const int64_t n_ctx = r.positive("max_position_embeddings");
  c.d_model = r.positive("hidden_size");
  const int64_t d_ff = r.positive("intermediate_size");
  c.n_head = r.positive("num_attention_heads");
  c.n_head_kv = r.positive("num_key_value_heads", c.n_head);
  if (c.n_head % c.n_head_kv != 0)
    fail("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", r.file(),
         c.n_head, c.n_head_kv);
  c.head_dim = r.positive("head_dim", c.d_model / c.n_head);
  const double rope_theta = r.number("rope_theta", 10000.0);
  const double eps = r.number("rms_norm_eps");
  if (const json* t = r.find("tie_word_embeddings")) {
    if (!t->is_boolean())
      fail("{}: key 'tie_word_embeddings' is {}, expected true or false", r.file(), t->dump());
    c.tied = t->get<bool>();
  }

  auto u32 = [](int64_t v) { return GgufValue(static_cast<uint32_t>(v)); };
  const std::string a = c.arch + ".";
  md.emplace_back("general.architecture", c.arch);
  md.emplace_back("general.name", model_name);
  md.emplace_back(a + "block_count", u32(c.n_layer));
  md.emplace_back(a + "context_length", u32(n_ctx));
  md.emplace_back(a + "embedding_length", u32(c.d_model));
  md.emplace_back(a + "feed_forward_length", u32(d_ff));
  md.emplace_back(a + "attention.head_count", u32(c.n_head));
  md.emplace_back(a + "attention.head_count_kv", u32(c.n_head_kv));
  md.emplace_back(a + "rope.freq_base", GgufValue(static_cast<float>(rope_theta)));
  md.emplace_back(a + "attention.layer_norm_rms_epsilon", GgufValue(static_cast<float>(eps)));
  if (c.head_dim != c.d_model / c.n_head) {
    md.emplace_back(a + "attention.key_length", u32(c.head_dim));
    md.emplace_back(a + "attention.value_length", u32(c.head_dim));
  }
  md.emplace_back(a + "rope.dimension_count", u32(c.head_dim));
  return c;
}

// Per-layer tensors: Hugging Face suffix -> GGUF suffix, in GGUF file order.
constexpr std::pair<const char*, const char*> kLayerNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};
constexpr int kLayerNameCount = static_cast<int>(std::size(kLayerNames));

// Where a tensor goes: its GGUF name and a sort key giving llama.cpp's order
// (token_embd, the blocks in order, output_norm, output). Nullopt: skipped.
struct Target {
  std::string name;
  int64_t order;
  int64_t layer = -1;
  int index = -1;
};

std::optional<Target> map_name(const std::string& hf, const std::string& file, const Config& c) {
  const int64_t block_span = kLayerNameCount + 1;
  const int64_t end = 1 + c.n_layer * block_span;
  if (hf == "model.embed_tokens.weight") return Target{"token_embd.weight", 0};
  if (hf == "model.norm.weight") return Target{"output_norm.weight", end};
  if (hf == "lm_head.weight") return Target{"output.weight", end + 1};
  const std::string prefix = "model.layers.";
  if (hf.starts_with(prefix)) {
    size_t p = prefix.size();
    int64_t layer = 0;
    const size_t digits = p;
    while (p < hf.size() && p - digits < 9 && hf[p] >= '0' && hf[p] <= '9')
      layer = layer * 10 + (hf[p++] - '0');
    if (p > digits && p < hf.size() && hf[p] == '.') {
      const std::string rest = hf.substr(p + 1);
      if (layer >= c.n_layer)
        fail("{}: tensor '{}' is for layer {}, but config.json has num_hidden_layers {}", file, hf,
             layer, c.n_layer);
      if (rest == "self_attn.rotary_emb.inv_freq") return std::nullopt;  // recomputed
      for (int i = 0; i < kLayerNameCount; ++i)
        if (rest == kLayerNames[i].first)
          return Target{"blk." + std::to_string(layer) + "." + kLayerNames[i].second,
                        1 + layer * block_span + i, layer, i};
    }
  }
  fail("{}: tensor '{}' is not a {} tensor this converter knows", file, hf, c.arch);
}

// llama.cpp's rotary layout for llama q/k (convert_hf_to_gguf.py,
// LlamaModel.permute): rows viewed as (n_head, 2, head_dim/2) with the last two
// axes swapped, so that rotary pairs are adjacent rows.
std::vector<float> permute_rows(const std::vector<float>& src, int64_t n_head, int64_t rows,
                                int64_t cols) {
  std::vector<float> dst(src.size());
  const int64_t hd = rows / n_head, half = hd / 2;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::copy_n(src.begin() + (h * hd + j * half + i) * cols, cols,
                    dst.begin() + (h * hd + 2 * i + j) * cols);
  return dst;
}

struct Located {
  std::shared_ptr<SafetensorsFile> file;
  const SafetensorsTensor* tensor;
};

// Every tensor of the checkpoint with the file it lives in; the files read
// are appended to `inputs`.
std::vector<Located> locate_tensors(const std::filesystem::path& dir,
                                    std::vector<std::filesystem::path>& inputs) {
  std::vector<Located> out;
  const auto single = dir / "model.safetensors";
  const auto index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (std::filesystem::exists(index, ec)) {
    const json j = hf::read_json(index);
    inputs.push_back(index);
    const auto wm = j.find("weight_map");
    if (!j.is_object() || wm == j.end() || !wm->is_object())
      fail("{}: missing key 'weight_map'", index.string());
    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
    for (const auto& [name, shard] : wm->items()) {
      if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos)
        fail("{}: weight_map['{}'] is {}, expected a file name", index.string(), name,
             shard.dump());
      const std::string s = shard.get<std::string>();
      auto& f = shards[s];
      if (!f) {
        const auto path = dir / s;
        if (!std::filesystem::is_regular_file(path, ec))
          fail("{}: shard '{}' (weight_map['{}']) does not exist", index.string(), s, name);
        f = SafetensorsFile::open(path);
        inputs.push_back(path);
      }
      const SafetensorsTensor* t = f->find(name);
      if (t == nullptr) fail("{}: tensor '{}' is not in shard '{}'", index.string(), name, s);
      out.push_back({f, t});
    }
  } else if (std::filesystem::exists(single, ec)) {
    auto f = SafetensorsFile::open(single);
    inputs.push_back(single);
    for (const auto& t : f->tensors()) out.push_back({f, &t});
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json", dir.string());
  }
  return out;
}

std::string model_name(const std::filesystem::path& dir) {
  auto p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

SourceModel load_hf_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) fail("{}: not a directory", dir.string());
  SourceModel m;
  m.description = "Hugging Face checkpoint " + dir.string();
  const auto config_path = dir / "config.json";
  const json config = hf::read_json(config_path);
  m.inputs.push_back(config_path);
  const Config c = hf::with_json_errors(config_path, [&] {
    return read_config(ConfigReader(config_path, config), model_name(dir), m.metadata);
  });
  hf::add_tokenizer_metadata(dir, config, m.metadata, m.inputs);

  const std::vector<Located> found = hf::with_json_errors(
      dir / "model.safetensors.index.json", [&] { return locate_tensors(dir, m.inputs); });
  auto files = std::make_shared<std::vector<std::shared_ptr<SafetensorsFile>>>();
  std::vector<std::pair<int64_t, SourceTensor>> mapped;
  std::set<std::string> seen;
  for (const Located& l : found) {
    const SafetensorsTensor& t = *l.tensor;
    const std::optional<Target> target = map_name(t.name, l.file->name(), c);
    if (!target) continue;
    if (target->name == "output.weight" && c.tied) continue;  // same as token_embd
    if (!seen.insert(target->name).second)
      fail("{}: tensor '{}' appears twice in the checkpoint", l.file->name(), t.name);
    if (t.shape.empty() || t.shape.size() > 4 || t.n_elements == 0)
      fail("{}: tensor '{}' has shape [{}]: expected 1 to 4 non-zero dimensions", l.file->name(),
           t.name, fmt::join(t.shape, ", "));
    if (files->empty() || files->back() != l.file) files->push_back(l.file);

    SourceTensor st;
    st.name = target->name;
    st.shape.assign(t.shape.rbegin(), t.shape.rend());  // [out, in] -> ggml {in, out}
    st.source_type = t.dtype;
    // q/k rows (weight and bias) of llama go to llama.cpp's rotary layout.
    const bool q = target->index >= 1 && target->index <= 2;
    const bool k = target->index >= 3 && target->index <= 4;
    if (c.arch == "llama" && (q || k)) {
      const int64_t heads = q ? c.n_head : c.n_head_kv;
      const int64_t rows = t.shape[0];
      const int64_t cols = t.n_elements / rows;
      if (rows != heads * c.head_dim || c.head_dim % 2 != 0)
        fail("{}: tensor '{}' has {} rows, expected {} heads x {} (head_dim, even)", l.file->name(),
             t.name, rows, heads, c.head_dim);
      st.load = [f = l.file, p = &t, heads, rows, cols] {
        return permute_rows(safetensors_to_f32(*p), heads, rows, cols);
      };
    } else {
      st.load = [f = l.file, p = &t] { return safetensors_to_f32(*p); };
    }
    mapped.emplace_back(target->order, std::move(st));
  }
  if (!seen.count("token_embd.weight"))
    fail("{}: the checkpoint has no model.embed_tokens.weight", dir.string());
  std::stable_sort(mapped.begin(), mapped.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  for (auto& [order, st] : mapped) m.tensors.push_back(std::move(st));
  m.keep_alive = files;
  check_source_layout(m);
  return m;
}

void check_source_layout(const SourceModel& m) {
  // The file about to be written must be one barata loads: the same checks,
  // on the metadata and shapes alone, before a byte is written.
  std::vector<GgufTensorInfo> infos;
  infos.reserve(m.tensors.size());
  for (const SourceTensor& t : m.tensors) {
    GgufTensorInfo ti;
    ti.name = t.name;
    ti.type = DType::F32;
    ti.shape = t.shape;
    ti.n_elements = t.n_elements();
    ti.offset = 0;
    ti.n_bytes = 0;
    ti.data = nullptr;
    infos.push_back(std::move(ti));
  }
  try {
    Model::check_layout(GgufFile::from_parts(m.description, m.metadata, std::move(infos)));
  } catch (const Error& e) {
    fail("the converted model would not load: {}", e.what());
  }
}

}  // namespace barata
