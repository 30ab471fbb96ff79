// barata inspect FILE: header, metadata, tensor table, totals per type and the
// model shape, as text or (--json) as one JSON document.
#include <map>
#include <memory>
#include <optional>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/kv_cache.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/gguf.h"
#include "barata/model_config.h"
#include "barata/tokenizer.h"
#include "commands.h"

namespace barata::cli {
namespace {

using nlohmann::json;

constexpr size_t kArrayPreview = 8;  // items shown of a long array

// The shortest decimal that reads back as this float32 (1e-05, not
// 9.999999747378752e-06).
json json_float(float x) {
  return json(std::stod(fmt::format("{}", x)));
}

json value_json(const GgufValue& v, size_t max_items) {
  return std::visit(
      [&](const auto& x) -> json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, GgufArray>) {
          json items = json::array();
          for (size_t i = 0; i < x.items.size() && i < max_items; ++i)
            items.push_back(value_json(x.items[i], max_items));
          return items;
        } else if constexpr (std::is_same_v<T, float>) {
          return json_float(x);
        } else {  // strings may hold invalid UTF-8: every dump() uses the replace handler
          return json(x);
        }
      },
      v.v);
}

std::string value_text(const GgufValue& v) {
  if (const auto* a = std::get_if<GgufArray>(&v.v)) {
    std::string s = "[";
    for (size_t i = 0; i < a->items.size() && i < kArrayPreview; ++i) {
      if (i) s += ", ";
      s += value_text(a->items[i]);
    }
    if (a->items.size() > kArrayPreview) s += ", ...";
    return s + fmt::format("] ({} items)", a->items.size());
  }
  if (const auto* s = std::get_if<std::string>(&v.v)) {
    std::string one = json(*s).dump(-1, ' ', false, json::error_handler_t::replace);
    if (one.size() > 120) one = one.substr(0, 117) + "...";
    return one;
  }
  if (const auto* f = std::get_if<float>(&v.v)) return fmt::format("{}", *f);
  return value_json(v, 0).dump();
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? " x " : "") + std::to_string(shape[i]);
  return s;
}

struct TypeTotal {
  int64_t n_tensors = 0;
  int64_t n_elements = 0;
  uint64_t n_bytes = 0;
};

// The optional steps of the architecture's layer this file turns on.
std::vector<std::string> layer_steps(const ModelConfig& c) {
  std::vector<std::string> s;
  if (c.qkv_bias) s.push_back("q/k/v biases");
  if (c.embed_scale != 1.0f) s.push_back(fmt::format("embedding x {:g}", c.embed_scale));
  if (c.qk_norm) s.push_back("per-head q/k RMSNorm before RoPE");
  if (c.post_norms) s.push_back("RMSNorm after attention and after the FFN");
  if (c.glu == Glu::kGeGLU) s.push_back("GeGLU (tanh GELU)");
  if (c.n_swa > 0) {
    s.push_back(fmt::format("sliding window of {} on {} of {} layers (RoPE base {:g} there)",
                            c.n_swa, c.n_swa_layers, c.n_layer, c.rope_base_swa));
  }
  if (!c.rope_freq_factors.empty())
    s.push_back(fmt::format("RoPE frequency factors (rope_freqs.weight, {} pairs)",
                            c.rope_freq_factors.size()));
  const RopeScaling& r = c.rope_scaling;
  if (r.freq_scale != 1.0f || r.type == RopeScalingType::kYarn)
    s.push_back(fmt::format(
        "RoPE scaling {} x{:g}{}", rope_scaling_name(r.type), 1.0 / r.freq_scale,
        r.type == RopeScalingType::kYarn ? fmt::format(" (original context {})", r.n_ctx_orig)
                                         : ""));
  if (r.attn_factor != 1.0f) s.push_back(fmt::format("RoPE attention factor {:g}", r.attn_factor));
  return s;
}

json build(const GgufFile& f) {
  json j;
  j["file"] = f.name();
  j["version"] = f.version();
  j["file_bytes"] = f.file_size();
  j["alignment"] = f.alignment();
  j["data_offset"] = f.data_offset();
  json meta = json::array();
  for (const auto& [k, v] : f.metadata()) {
    json e = {{"key", k}, {"type", v.type_name()}, {"value", value_json(v, kArrayPreview)}};
    if (const auto* a = std::get_if<GgufArray>(&v.v)) e["count"] = a->items.size();
    meta.push_back(std::move(e));
  }
  j["metadata"] = std::move(meta);
  json tensors = json::array();
  std::map<std::string, TypeTotal> totals;
  TypeTotal all;
  for (const auto& t : f.tensors()) {
    tensors.push_back({{"name", t.name},
                       {"type", dtype_name(t.type)},
                       {"shape", t.shape},
                       {"n_elements", t.n_elements},
                       {"bytes", t.n_bytes},
                       {"offset", f.data_offset() + t.offset}});
    for (TypeTotal* tt : {&totals[dtype_name(t.type)], &all}) {
      tt->n_tensors += 1;
      tt->n_elements += t.n_elements;
      tt->n_bytes += t.n_bytes;
    }
  }
  j["tensors"] = std::move(tensors);
  auto total_json = [](const TypeTotal& t) {
    return json{{"tensors", t.n_tensors},
                {"elements", t.n_elements},
                {"bytes", t.n_bytes},
                {"bits_per_weight", t.n_elements ? 8.0 * t.n_bytes / t.n_elements : 0.0}};
  };
  json by_type = json::object();
  for (const auto& [name, t] : totals) by_type[name] = total_json(t);
  j["totals"] = {{"by_type", by_type}, {"all", total_json(all)}};

  const std::string arch = f.get_or<std::string>("general.architecture", "");
  const auto& archs = ModelConfig::supported_architectures();
  std::optional<ModelConfig> config;
  if (std::find(archs.begin(), archs.end(), arch) != archs.end()) {
    // A file whose hyperparameters are incomplete is still shown, with why
    // it cannot be run.
    try {
      config = ModelConfig::from_gguf(f);
    } catch (const Error& e) {
      j["model_error"] = e.what();
    }
  }
  if (config) {
    const ModelConfig& c = *config;
    j["model"] = {{"arch", c.arch},
                  {"n_layer", c.n_layer},
                  {"d_model", c.d_model},
                  {"n_head", c.n_head},
                  {"n_head_kv", c.n_head_kv},
                  {"head_dim", c.head_dim},
                  {"d_ff", c.d_ff},
                  {"n_ctx_train", c.n_ctx_train},
                  {"n_vocab", c.n_vocab},
                  {"rope_base", json_float(c.rope_base)},
                  {"rope_dims", c.rope_dims},
                  {"rope_style", c.rope_style == RopeStyle::kNeox ? "neox" : "normal"},
                  {"norm_eps", json_float(c.norm_eps)},
                  {"tied_embeddings", c.tied_embeddings},
                  {"qkv_bias", c.qkv_bias},
                  {"qk_norm", c.qk_norm},
                  {"rope_scaling", rope_scaling_name(c.rope_scaling.type)},
                  {"rope_freq_scale", json_float(c.rope_scaling.freq_scale)},
                  {"rope_freq_factors", !c.rope_freq_factors.empty()},
                  {"about", std::string(c.spec->about)},
                  {"steps", layer_steps(c)},
                  {"kv_bytes_per_token_f16", c.kv_bytes_per_token()}};
    // The KV cache's layer groups (kv_cache.h) and what a sequence at the
    // full context holds with the sliding layers' blocks freed.
    const KvLayout L = kv_layout_for(c, false);
    int64_t n_sliding_groups = 0;
    for (int64_t g = 0; g < L.n_groups(); ++g) n_sliding_groups += L.window(g) > 0 ? 1 : 0;
    j["model"]["kv_groups"] = {
        {"groups", L.n_groups()},
        {"layers_per_group", L.layers_per_block()},
        {"sliding_groups", n_sliding_groups},
        {"bytes_at_full_context", kv_sequence_bytes(c, c.n_ctx_train, false)}};
  }
  if (f.has("tokenizer.ggml.tokens")) {
    try {
      const Tokenizer tok = Tokenizer::from_gguf(f);
      j["tokenizer"] = {{"n_vocab", tok.n_vocab()},
                        {"bytes_without_token", tok.bytes_without_token()}};
    } catch (const Error& e) {
      j["tokenizer"] = {{"error", e.what()}};
    }
  }
  return j;
}

std::string human_bytes(uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.2f} KiB", b / double(1ull << 10));
  return fmt::format("{} B", b);
}

void print_text(const GgufFile& f, const json& j, bool show_tensors) {
  fmt::print("file: {}\n", f.name());
  fmt::print("  GGUF v{}, {} ({} bytes), alignment {}, tensor data at byte {}\n", f.version(),
             human_bytes(f.file_size()), f.file_size(), f.alignment(), f.data_offset());
  fmt::print("\nmetadata ({} keys):\n", f.metadata().size());
  size_t w = 0;
  // Keys and names from the file are escaped: a newline or ESC in them must
  // not forge a line or drive the terminal.
  for (const auto& [k, v] : f.metadata()) w = std::max(w, printable(k).size());
  for (const auto& [k, v] : f.metadata())
    fmt::print("  {:<{}}  {:<14} {}\n", printable(k), w, v.type_name(), value_text(v));

  fmt::print("\ntensors ({}):\n", f.tensors().size());
  if (show_tensors) {
    size_t nw = 4;
    for (const auto& t : f.tensors()) nw = std::max(nw, printable(t.name).size());
    fmt::print("  {:<{}}  {:<6} {:>22} {:>12} {:>12}\n", "name", nw, "type", "shape", "bytes",
               "offset");
    for (const auto& t : f.tensors())
      fmt::print("  {:<{}}  {:<6} {:>22} {:>12} {:>12}\n", printable(t.name), nw,
                 dtype_name(t.type), shape_text(t.shape), t.n_bytes, f.data_offset() + t.offset);
  } else {
    fmt::print("  (table hidden by --no-tensors)\n");
  }
  fmt::print("\ntotals by type:\n");
  fmt::print("  {:<6} {:>8} {:>14} {:>14} {:>10}\n", "type", "tensors", "elements", "bytes",
             "bits/w");
  auto row = [](const std::string& name, const json& t) {
    fmt::print("  {:<6} {:>8} {:>14} {:>14} {:>10.4f}\n", name, t["tensors"].get<int64_t>(),
               t["elements"].get<int64_t>(), t["bytes"].get<uint64_t>(),
               t["bits_per_weight"].get<double>());
  };
  for (const auto& [name, t] : j["totals"]["by_type"].items()) row(name, t);
  row("all", j["totals"]["all"]);
  fmt::print("  parameters: {:.2f} M, tensor data: {}\n",
             j["totals"]["all"]["elements"].get<int64_t>() / 1e6,
             human_bytes(j["totals"]["all"]["bytes"].get<uint64_t>()));

  if (j.contains("model")) {
    const json& m = j["model"];
    fmt::print("\nmodel ({}: {}):\n", m["arch"].get<std::string>(), m["about"].get<std::string>());
    fmt::print("  layers {}, d_model {}, heads {} / kv heads {}, head dim {}, d_ff {}\n",
               m["n_layer"].get<int64_t>(), m["d_model"].get<int64_t>(), m["n_head"].get<int64_t>(),
               m["n_head_kv"].get<int64_t>(), m["head_dim"].get<int64_t>(),
               m["d_ff"].get<int64_t>());
    fmt::print("  context {}, vocab {}, rope base {} ({} dims, {}), rms eps {}\n",
               m["n_ctx_train"].get<int64_t>(), m["n_vocab"].get<int64_t>(),
               m["rope_base"].get<double>(), m["rope_dims"].get<int64_t>(),
               m["rope_style"].get<std::string>(), m["norm_eps"].get<double>());
    fmt::print("  embeddings {}, q/k/v bias {}\n",
               m["tied_embeddings"].get<bool>() ? "tied (logits reuse token_embd)" : "untied",
               m["qkv_bias"].get<bool>() ? "yes" : "no");
    std::string steps;
    for (const auto& s : m["steps"]) steps += (steps.empty() ? "" : "; ") + s.get<std::string>();
    fmt::print("  optional steps: {}\n", steps.empty() ? "none" : steps);
    const int64_t kv = m["kv_bytes_per_token_f16"].get<int64_t>();
    fmt::print(
        "  KV cache (fp16): {} bytes per token = 2 x {} layers x {} kv heads x {} x 2; "
        "{} at the full context\n",
        kv, m["n_layer"].get<int64_t>(), m["n_head_kv"].get<int64_t>(),
        m["head_dim"].get<int64_t>(),
        human_bytes(static_cast<uint64_t>(kv * m["n_ctx_train"].get<int64_t>())));
    if (m.contains("kv_groups") && m["kv_groups"]["sliding_groups"].get<int64_t>() > 0) {
      const auto& g = m["kv_groups"];
      fmt::print(
          "  KV layer groups: {} of {} layers, {} of them sliding (their blocks behind the window "
          "are freed): {} at the full context (--swa-full keeps every block)\n",
          g["groups"].get<int64_t>(), g["layers_per_group"].get<int64_t>(),
          g["sliding_groups"].get<int64_t>(),
          human_bytes(static_cast<uint64_t>(g["bytes_at_full_context"].get<int64_t>())));
    }
  }
  if (j.contains("model_error"))
    fmt::print("\nmodel: cannot be run: {}\n", j["model_error"].get<std::string>());
  if (j.contains("tokenizer")) {
    const json& t = j["tokenizer"];
    if (t.contains("error")) {
      fmt::print("\ntokenizer: cannot be built: {}\n", t["error"].get<std::string>());
    } else {
      fmt::print("\ntokenizer: {} tokens", t["n_vocab"].get<int64_t>());
      const auto missing = t["bytes_without_token"].get<std::vector<int>>();
      if (missing.empty()) {
        fmt::print(", every byte has a token\n");
      } else {
        std::string list;
        for (size_t i = 0; i < missing.size() && i < 32; ++i)
          list += fmt::format("{}0x{:02X}", i ? " " : "", missing[i]);
        fmt::print(
            "; {} byte value(s) have no token ({}{}): text holding them loses them "
            "or gets the unknown token\n",
            missing.size(), list, missing.size() > 32 ? " ..." : "");
      }
    }
  }
}

}  // namespace

Command add_inspect(CLI::App& app) {
  auto* sub =
      app.add_subcommand("inspect", "Show a GGUF file's header, metadata, tensors and model shape");
  auto path = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  auto no_tensors = std::make_shared<bool>(false);
  sub->add_option("file", *path, "GGUF file")->required()->check(CLI::ExistingFile);
  sub->add_flag("--json", *as_json, "Print one JSON document instead of text");
  sub->add_flag("--no-tensors", *no_tensors, "Leave out the per-tensor table (text output)");
  return {sub, [=]() {
            const GgufFile f = GgufFile::open(*path);
            const json j = build(f);
            if (*as_json)
              fmt::print("{}\n", j.dump(1, ' ', false, json::error_handler_t::replace));
            else
              print_text(f, j, !*no_tensors);
            return 0;
          }};
}

}  // namespace barata::cli
