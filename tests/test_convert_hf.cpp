// load_hf_checkpoint on small synthetic Hugging Face checkpoints written by
// the test: the converted model must run bit-for-bit like a GGUF the test
// builds by hand from the same fp32 values (GGUF names, q/k rows permuted for
// llama by the test's own code), and tokenize the same. Plus shards and the
// errors a broken checkpoint gives.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include <sys/stat.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/convert.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/half.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// One tensor of the checkpoint: Hugging Face name, dtype, shape as stored
// ([out, in]) and the values it holds (already rounded to the dtype).
struct HfTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

std::vector<uint8_t> safetensors_bytes(const std::vector<HfTensor>& ts) {
  json header = json::object();
  std::vector<uint8_t> data;
  for (const auto& t : ts) {
    const size_t begin = data.size();
    for (float v : t.values) {
      if (t.dtype == "F32") {
        uint8_t b[4];
        std::memcpy(b, &v, 4);
        data.insert(data.end(), b, b + 4);
      } else {
        const uint16_t h = t.dtype == "BF16" ? fp32_to_bf16(v) : fp32_to_fp16(v);
        data.push_back(static_cast<uint8_t>(h & 0xff));
        data.push_back(static_cast<uint8_t>(h >> 8));
      }
    }
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::vector<uint8_t> out;
  out.reserve(8 + h.size() + data.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(uint64_t(h.size()) >> (8 * i)));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_json(const fs::path& p, const json& j) {
  const std::string s = j.dump(2);
  test::write_bytes(p, std::vector<uint8_t>(s.begin(), s.end()));
}

// GPT-2's byte-to-unicode table (the printable Latin-1 bytes stand for
// themselves, the rest map to U+0100 upwards), as UTF-8.
std::vector<std::string> byte_tokens() {
  std::vector<std::string> out(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = keep ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out[b] = s;
  }
  return out;
}

const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Byte tokens 0..255, five merges (256..260), then added tokens: two special,
// one not.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {"l", "l"}, {"\xC4\xA0", "t"}, {"\xC4\xA0t", "he"}, {"o", "r"}};
const std::vector<std::pair<std::string, bool>> kAdded = {
    {"<|endoftext|>", true}, {"<|im_start|>", true}, {"<extra>", false}};
constexpr int64_t kVocab = 256 + 5 + 3;

json tokenizer_json(const std::string& arch) {
  json vocab = json::object();
  const auto bytes = byte_tokens();
  for (int i = 0; i < 256; ++i) vocab[bytes[i]] = i;
  json merges = json::array();
  for (size_t i = 0; i < kMerges.size(); ++i) {
    vocab[kMerges[i].first + kMerges[i].second] = 256 + i;
    // Both spellings of a merge occur in the wild.
    if (i % 2 == 0)
      merges.push_back(kMerges[i].first + " " + kMerges[i].second);
    else
      merges.push_back({kMerges[i].first, kMerges[i].second});
  }
  json added = json::array();
  for (size_t i = 0; i < kAdded.size(); ++i)
    added.push_back({{"id", 261 + i}, {"content", kAdded[i].first}, {"special", kAdded[i].second}});
  const std::string re = arch == "llama" ? kLlama3Regex : kQwen2Regex;
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern", {{"Regex", re}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"},
               {"add_prefix_space", false},
               {"trim_offsets", false},
               {"use_regex", false}}}}}},
          {"model",
           {{"type", "BPE"},
            {"ignore_merges", arch == "llama"},
            {"vocab", vocab},
            {"merges", merges}}}};
}

struct Spec {
  std::string arch;
  int64_t n_layer, d_model, n_head, n_head_kv, head_dim, d_ff;
  bool tied, bias;
};

const Spec kLlama{"llama", 2, 32, 4, 2, 8, 48, false, false};  // GQA 2:1, untied
const Spec kQwen2{"qwen2", 2, 32, 4, 2, 16, 40, true, true};   // biases, head_dim != d/heads

// A checkpoint directory's contents, written by write().
struct Checkpoint {
  json config, tokenizer, tok_config;
  std::vector<HfTensor> tensors;

  void write(const fs::path& dir) const {
    write_json(dir / "config.json", config);
    write_json(dir / "tokenizer.json", tokenizer);
    write_json(dir / "tokenizer_config.json", tok_config);
    test::write_bytes(dir / "model.safetensors", safetensors_bytes(tensors));
  }
};

Checkpoint make_checkpoint(const Spec& s, uint32_t seed) {
  Checkpoint c;
  c.config = {{"architectures", {s.arch == "llama" ? "LlamaForCausalLM" : "Qwen2ForCausalLM"}},
              {"num_hidden_layers", s.n_layer},
              {"hidden_size", s.d_model},
              {"intermediate_size", s.d_ff},
              {"num_attention_heads", s.n_head},
              {"num_key_value_heads", s.n_head_kv},
              {"max_position_embeddings", 64},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"rope_scaling", nullptr},
              {"tie_word_embeddings", s.tied},
              {"bos_token_id", 261},
              {"eos_token_id", 261},
              {"vocab_size", kVocab}};
  if (s.head_dim != s.d_model / s.n_head) c.config["head_dim"] = s.head_dim;
  c.tokenizer = tokenizer_json(s.arch);
  c.tok_config = {{"clean_up_tokenization_spaces", s.arch == "llama"},
                  {"eos_token", {{"content", "<|endoftext|>"}, {"special", true}}},
                  {"chat_template", "{{ messages }}"}};
  if (s.arch == "llama") c.tok_config["bos_token"] = "<|im_start|>";

  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale,
                 const std::string& dtype = "F32", float offset = 0.0f) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    HfTensor t{name, dtype, std::move(shape), std::vector<float>(static_cast<size_t>(n))};
    for (auto& v : t.values) {
      v = offset + nd(rng) * scale;
      if (dtype == "BF16") v = bf16_to_fp32(fp32_to_bf16(v));
      if (dtype == "F16") v = fp16_to_fp32(fp32_to_fp16(v));
    }
    c.tensors.push_back(std::move(t));
  };
  const int64_t qd = s.n_head * s.head_dim, kvd = s.n_head_kv * s.head_dim, d = s.d_model;
  add("model.embed_tokens.weight", {kVocab, d}, 1.0f, "BF16");
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {d}, 0.2f, "F32", 1.0f);
    add(p + "self_attn.q_proj.weight", {qd, d}, 0.3f, l == 0 ? "F16" : "F32");
    add(p + "self_attn.k_proj.weight", {kvd, d}, 0.3f, l == 1 ? "BF16" : "F32");
    add(p + "self_attn.v_proj.weight", {kvd, d}, 0.3f);
    if (s.bias) {
      add(p + "self_attn.q_proj.bias", {qd}, 0.5f);
      add(p + "self_attn.k_proj.bias", {kvd}, 0.5f);
      add(p + "self_attn.v_proj.bias", {kvd}, 0.5f);
    }
    add(p + "self_attn.o_proj.weight", {d, qd}, 0.3f);
    add(p + "post_attention_layernorm.weight", {d}, 0.2f, "F32", 1.0f);
    add(p + "mlp.gate_proj.weight", {s.d_ff, d}, 0.3f);
    add(p + "mlp.up_proj.weight", {s.d_ff, d}, 0.3f, "F16");
    add(p + "mlp.down_proj.weight", {d, s.d_ff}, 0.3f);
    if (l == 0) add(p + "self_attn.rotary_emb.inv_freq", {s.head_dim / 2}, 1.0f);  // skipped
  }
  add("model.norm.weight", {d}, 0.2f, "F32", 1.0f);
  if (!s.tied) add("lm_head.weight", {kVocab, d}, 0.5f);
  return c;
}

void PrintTo(const Spec& s, std::ostream* os) {
  *os << s.arch;
}

// The GGUF the converter should amount to, built by hand. With `as_neox`, a
// llama checkpoint is written unpermuted as a qwen2 GGUF instead (NeoX RoPE on
// the rows as Hugging Face stores them, which is what the checkpoint means):
// the same function, computed in another order.
std::vector<uint8_t> expected_gguf(const Spec& s, const Checkpoint& c, bool as_neox = false) {
  GgufWriter w;
  const std::string arch = as_neox ? "qwen2" : s.arch;
  const std::string a = arch + ".";
  w.set("general.architecture", arch);
  w.set(a + "block_count", GgufValue(uint32_t(s.n_layer)));
  w.set(a + "context_length", GgufValue(uint32_t(64)));
  w.set(a + "embedding_length", GgufValue(uint32_t(s.d_model)));
  w.set(a + "feed_forward_length", GgufValue(uint32_t(s.d_ff)));
  w.set(a + "attention.head_count", GgufValue(uint32_t(s.n_head)));
  w.set(a + "attention.head_count_kv", GgufValue(uint32_t(s.n_head_kv)));
  w.set(a + "rope.freq_base", GgufValue(10000.0f));
  w.set(a + "attention.layer_norm_rms_epsilon", GgufValue(1e-5f));
  if (s.head_dim != s.d_model / s.n_head)
    w.set(a + "attention.key_length", GgufValue(uint32_t(s.head_dim)));
  std::vector<GgufValue> tokens, types, merges;
  for (const auto& b : byte_tokens()) tokens.emplace_back(b), types.emplace_back(int32_t(1));
  for (const auto& [l, r] : kMerges) {
    tokens.emplace_back(l + r), types.emplace_back(int32_t(1));
    merges.emplace_back(l + " " + r);
  }
  for (const auto& [t, special] : kAdded)
    tokens.emplace_back(t), types.emplace_back(int32_t(special ? 3 : 4));
  w.set("tokenizer.ggml.model", "gpt2");
  w.set("tokenizer.ggml.pre", s.arch == "llama" ? "llama3" : "qwen2");
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, tokens));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::INT32, types));
  w.set("tokenizer.ggml.merges", GgufValue::array(GgufType::STRING, merges));
  w.set("tokenizer.ggml.bos_token_id", GgufValue(uint32_t(s.arch == "llama" ? 262 : 261)));
  w.set("tokenizer.ggml.eos_token_id", GgufValue(uint32_t(261)));

  const std::map<std::string, std::string> names = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  for (const HfTensor& t : c.tensors) {
    std::string name;
    if (t.name == "model.embed_tokens.weight") name = "token_embd.weight";
    if (t.name == "model.norm.weight") name = "output_norm.weight";
    if (t.name == "lm_head.weight") name = "output.weight";
    const size_t dot = t.name.find('.', 13);
    if (t.name.starts_with("model.layers.") && names.count(t.name.substr(dot + 1)))
      name = "blk." + t.name.substr(13, dot - 13) + "." + names.at(t.name.substr(dot + 1));
    if (name.empty()) continue;
    std::vector<float> v = t.values;
    const bool q = name.find("attn_q") != std::string::npos;
    if (arch == "llama" && (q || name.find("attn_k") != std::string::npos)) {
      // Row r of head h comes from rotary pair member r % 2 of index (r % hd) / 2.
      const int64_t hd = s.head_dim, cols = t.shape.size() == 2 ? t.shape[1] : 1;
      for (int64_t r = 0; r < t.shape[0]; ++r) {
        const int64_t h = r / hd, i = (r % hd) / 2, j = r % 2;
        const int64_t src = h * hd + j * (hd / 2) + i;
        std::copy_n(t.values.begin() + src * cols, cols, v.begin() + r * cols);
      }
    }
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add_tensor(name, DType::F32, std::vector<int64_t>(t.shape.rbegin(), t.shape.rend()),
                 std::move(bytes));
    // qwen2 files always carry q/k/v biases (llama.cpp requires them too):
    // a llama checkpoint written as qwen2 gets zero ones, the same function.
    if (as_neox && s.arch == "llama" && name.ends_with(".weight") &&
        (q || name.find("attn_k.") != std::string::npos ||
         name.find("attn_v.") != std::string::npos)) {
      std::string bias = name.substr(0, name.size() - 6) + "bias";
      w.add_tensor(bias, DType::F32, {t.shape[0]}, std::vector<uint8_t>(t.shape[0] * 4, 0));
    }
  }
  return w.to_bytes();
}

std::vector<uint8_t> to_gguf(const SourceModel& m) {
  GgufWriter w;
  for (const auto& [k, v] : m.metadata) w.set(k, v);
  for (const auto& t : m.tensors) {
    const std::vector<float> v = t.load();
    EXPECT_EQ(static_cast<int64_t>(v.size()), t.n_elements()) << t.name;
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add_tensor(t.name, DType::F32, t.shape, std::move(bytes));
  }
  return w.to_bytes();
}

const GgufValue* find_key(const SourceModel& m, const std::string& key) {
  for (const auto& [k, v] : m.metadata)
    if (k == key) return &v;
  return nullptr;
}

class ConvertHfModel : public ::testing::TestWithParam<Spec> {};

TEST_P(ConvertHfModel, RunsLikeHandBuiltGguf) {
  const Spec& s = GetParam();
  test::TempDir dir;
  const Checkpoint c = make_checkpoint(s, 42);
  c.write(dir.path());

  const SourceModel src = load_hf_checkpoint(dir.path());
  EXPECT_EQ(src.tensors.front().name, "token_embd.weight");
  EXPECT_EQ(src.tensors.size(), 1 + s.n_layer * (s.bias ? 12u : 9u) + (s.tied ? 1 : 2));
  const auto q0 = std::find_if(src.tensors.begin(), src.tensors.end(),
                               [](const auto& t) { return t.name == "blk.0.attn_q.weight"; });
  ASSERT_NE(q0, src.tensors.end());
  EXPECT_EQ(q0->source_type, "F16");
  ASSERT_NE(find_key(src, "tokenizer.chat_template"), nullptr);
  EXPECT_EQ(std::get<std::string>(find_key(src, "general.name")->v),
            dir.path().filename().string());
  EXPECT_EQ(std::get<uint32_t>(find_key(src, s.arch + ".rope.dimension_count")->v), s.head_dim);

  const std::vector<uint8_t> got_bytes = to_gguf(src);
  const std::vector<uint8_t> want_bytes = expected_gguf(s, c);
  const Model got = Model::from_gguf(GgufFile::from_memory(got_bytes, "converted.gguf"));
  const Model want = Model::from_gguf(GgufFile::from_memory(want_bytes, "expected.gguf"));
  EXPECT_EQ(got.config().tied_embeddings, s.tied);
  EXPECT_EQ(got.config().qkv_bias, s.bias);
  EXPECT_EQ(got.config().head_dim, s.head_dim);

  const std::vector<int32_t> toks = {5, 261, 100, 7, 259, 33, 200, 1, 262};
  auto logits = [&](const Model& m) {
    Engine e(m, {.n_threads = 2, .n_ctx = 64});
    std::vector<float> out(toks.size() * kVocab);
    e.prefill(e.new_sequence(), toks, out.data(), true);
    return out;
  };
  const auto lg = logits(got), lw = logits(want);
  ASSERT_EQ(lg.size(), lw.size());
  for (size_t i = 0; i < lg.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(lg[i]), std::bit_cast<uint32_t>(lw[i]))
        << "logit " << i % kVocab << " of position " << i / kVocab << ": " << lg[i] << " vs "
        << lw[i];
  if (s.arch == "llama") {
    // The permutation is the right one: NeoX RoPE on the unpermuted rows agrees.
    const std::vector<uint8_t> neox_bytes = expected_gguf(s, c, true);
    const Model neox = Model::from_gguf(GgufFile::from_memory(neox_bytes, "neox.gguf"));
    const auto ln = logits(neox);
    float scale = 0;
    for (float v : lw) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < lg.size(); ++i)
      ASSERT_NEAR(lg[i], ln[i], 1e-4f * scale)
          << "logit " << i % kVocab << " of position " << i / kVocab;
  }

  const Tokenizer tg = Tokenizer::from_gguf(got.file()), tw = Tokenizer::from_gguf(want.file());
  EXPECT_EQ(tg.pre(), s.arch == "llama" ? "llama3" : "qwen2");
  const std::string text = "the hello<|im_start|> world's 12345 <extra> the\n\nor";
  const auto ids = tg.encode(text, true, true);
  EXPECT_EQ(ids, tw.encode(text, true, true));
  EXPECT_NE(std::find(ids.begin(), ids.end(), 259), ids.end());  // " the" merged
  EXPECT_NE(std::find(ids.begin(), ids.end(), 262), ids.end());  // special parsed
  EXPECT_EQ(tg.bos_id(), tw.bos_id());
  EXPECT_EQ(tg.eos_id(), 261);
}

// The same through `barata quantize DIR OUT`: F32 output runs bit-equal to
// the hand-built GGUF; a quantized output runs close to it.
TEST_P(ConvertHfModel, QuantizeCommandConvertsTheDirectory) {
  const Spec& s = GetParam();
  test::TempDir dir, out;
  const Checkpoint c = make_checkpoint(s, 7);
  c.write(dir.path());
  const std::vector<uint8_t> want_bytes = expected_gguf(s, c);
  const Model want = Model::from_gguf(GgufFile::from_memory(want_bytes, "expected.gguf"));
  const std::vector<int32_t> toks = {5, 261, 100, 7, 259, 33};
  auto logits = [&](const Model& m) {
    Engine e(m, {.n_threads = 2, .n_ctx = 64});
    std::vector<float> v(toks.size() * kVocab);
    e.prefill(e.new_sequence(), toks, v.data(), true);
    return v;
  };
  const auto lw = logits(want);
  float scale = 0;
  for (float v : lw) scale = std::max(scale, std::fabs(v));
  for (const char* type : {"f32", "int8-row"}) {
    SCOPED_TRACE(type);
    const auto path = out / (std::string(type) + ".gguf");
    const auto r = test::run_cli("quantize '" + dir.path().string() + "' '" + path.string() +
                                 "' --type " + type + " -t 2");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("Hugging Face"), std::string::npos) << r.out;
    const Model got = Model::load(path);
    const auto lg = logits(got);
    for (size_t i = 0; i < lg.size(); ++i) {
      if (std::string(type) == "f32")
        ASSERT_EQ(std::bit_cast<uint32_t>(lg[i]), std::bit_cast<uint32_t>(lw[i])) << i;
      else
        ASSERT_NEAR(lg[i], lw[i], 0.1f * scale) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ConvertHf, ConvertHfModel, ::testing::Values(kLlama, kQwen2),
                         [](const auto& info) { return info.param.arch; });

TEST(ConvertHf, ShardedMatchesSingleFile) {
  test::TempDir single, sharded;
  Checkpoint c = make_checkpoint(kLlama, 3);
  c.write(single.path());
  c.write(sharded.path());
  fs::remove(sharded / "model.safetensors");
  const size_t half = c.tensors.size() / 2;
  const std::vector<HfTensor> a(c.tensors.begin(), c.tensors.begin() + half),
      b(c.tensors.begin() + half, c.tensors.end());
  json wm = json::object();
  for (const auto& t : a) wm[t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) wm[t.name] = "model-00002-of-00002.safetensors";
  write_json(sharded / "model.safetensors.index.json",
             {{"metadata", {{"total_size", 0}}}, {"weight_map", wm}});
  test::write_bytes(sharded / "model-00001-of-00002.safetensors", safetensors_bytes(a));
  test::write_bytes(sharded / "model-00002-of-00002.safetensors", safetensors_bytes(b));

  const SourceModel x = load_hf_checkpoint(single.path());
  const SourceModel y = load_hf_checkpoint(sharded.path());
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (size_t i = 0; i < x.tensors.size(); ++i) {
    EXPECT_EQ(x.tensors[i].name, y.tensors[i].name);
    EXPECT_EQ(x.tensors[i].shape, y.tensors[i].shape);
    EXPECT_EQ(x.tensors[i].load(), y.tensors[i].load()) << x.tensors[i].name;
  }
  EXPECT_EQ(y.inputs.size(), x.inputs.size() + 2);  // index + two shards vs one file

  // A shard named by the index but not on disk.
  fs::remove(sharded / "model-00002-of-00002.safetensors");
  try {
    load_hf_checkpoint(sharded.path());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00002.safetensors"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("model.safetensors.index.json"), std::string::npos)
        << e.what();
  }
}

// Writes `c` (after `edit`) and expects load_hf_checkpoint to fail with a
// message holding every one of `needles`.
void expect_error(const std::function<void(Checkpoint&, const fs::path&)>& edit,
                  const std::vector<std::string>& needles) {
  test::TempDir dir;
  Checkpoint c = make_checkpoint(kLlama, 9);
  c.write(dir.path());
  edit(c, dir.path());
  try {
    load_hf_checkpoint(dir.path());
    ADD_FAILURE() << "no error; expected one naming " << needles.front();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << n << " in: " << msg;
  }
}

TEST(ConvertHfErrors, UnsupportedArchitecture) {
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.config["architectures"] = {"MistralForCausalLM"};
        write_json(d / "config.json", c.config);
      },
      {"config.json", "architectures", "MistralForCausalLM"});
}

TEST(ConvertHfErrors, MissingConfigKey) {
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.config.erase("hidden_size");
        write_json(d / "config.json", c.config);
      },
      {"config.json", "hidden_size"});
}

TEST(ConvertHfErrors, RopeScalingRejected) {
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.config["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
        write_json(d / "config.json", c.config);
      },
      {"config.json", "rope_scaling"});
}

TEST(ConvertHfErrors, TruncatedHeader) {
  expect_error(
      [](Checkpoint&, const fs::path& d) {
        std::vector<uint8_t> b(8 + 10, ' ');
        b[0] = 0xe8, b[1] = 0x03;  // 1000 header bytes promised, 10 there
        for (int i = 2; i < 8; ++i) b[i] = 0;
        test::write_bytes(d / "model.safetensors", b);
      },
      {"model.safetensors", "header length 1000"});
  expect_error(
      [](Checkpoint&, const fs::path& d) {
        test::write_bytes(d / "model.safetensors", {1, 2, 3});
      },
      {"model.safetensors", "too short"});
}

TEST(ConvertHfErrors, OffsetsOutOfRange) {
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        auto bytes = safetensors_bytes(c.tensors);
        bytes.resize(bytes.size() - 4);  // the last tensor now runs past the end
        test::write_bytes(d / "model.safetensors", bytes);
      },
      {"model.safetensors", "lm_head.weight", "data_offsets"});
}

TEST(ConvertHfErrors, OffsetsDisagreeWithShape) {
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.tensors[1].shape = {c.tensors[1].shape[0] + 1};  // norm claims one more element
        test::write_bytes(d / "model.safetensors", safetensors_bytes(c.tensors));
      },
      {"model.safetensors", "model.layers.0.input_layernorm.weight", "data_offsets"});
}

TEST(ConvertHfErrors, UnknownDtype) {
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        auto bytes = safetensors_bytes(c.tensors);
        const std::string from = "\"dtype\":\"BF16\"", to = "\"dtype\":\"I16\" ";
        auto it = std::search(bytes.begin(), bytes.end(), from.begin(), from.end());
        ASSERT_NE(it, bytes.end());
        std::copy(to.begin(), to.end(), it);
        test::write_bytes(d / "model.safetensors", bytes);
      },
      {"model.safetensors", "model.embed_tokens.weight", "I16"});
}

TEST(ConvertHfErrors, UnknownTensorName) {
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.tensors.push_back({"model.layers.0.mlp.experts.weight", "F32", {2}, {1.0f, 2.0f}});
        test::write_bytes(d / "model.safetensors", safetensors_bytes(c.tensors));
      },
      {"model.safetensors", "model.layers.0.mlp.experts.weight"});
}

TEST(ConvertHfErrors, Tokenizer) {
  expect_error([](Checkpoint&, const fs::path& d) { fs::remove(d / "tokenizer.json"); },
               {"tokenizer.json", "not found"});
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.tokenizer["model"]["type"] = "Unigram";
        write_json(d / "tokenizer.json", c.tokenizer);
      },
      {"tokenizer.json", "model.type", "Unigram"});
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.tokenizer["model"]["byte_fallback"] = true;
        write_json(d / "tokenizer.json", c.tokenizer);
      },
      {"tokenizer.json", "byte_fallback"});
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.tokenizer["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
        write_json(d / "tokenizer.json", c.tokenizer);
      },
      {"tokenizer.json", "pre_tokenizer"});
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.tokenizer["added_tokens"][2]["id"] = 300;  // a hole at 263
        write_json(d / "tokenizer.json", c.tokenizer);
      },
      {"tokenizer.json", "dense"});
  expect_error(
      [](Checkpoint& c, const fs::path& d) {
        c.tokenizer["added_tokens"][2]["content"] = "<|endoftext|>";
        write_json(d / "tokenizer.json", c.tokenizer);
      },
      {"tokenizer.json", "<|endoftext|>", "two ids"});
}

TEST(ConvertHf, VocabPaddedToConfigVocabSize) {
  test::TempDir dir;
  Checkpoint c = make_checkpoint(kQwen2, 6);
  c.config["vocab_size"] = kVocab + 3;
  // The embedding (and lm_head) have the padded rows, as in Qwen2's checkpoints.
  for (HfTensor& t : c.tensors)
    if (t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight") {
      t.shape[0] = kVocab + 3;
      t.values.resize(static_cast<size_t>(t.shape[0] * t.shape[1]), 0.0f);
    }
  c.write(dir.path());
  const SourceModel m = load_hf_checkpoint(dir.path());
  const auto& tokens = std::get<GgufArray>(find_key(m, "tokenizer.ggml.tokens")->v).items;
  const auto& types = std::get<GgufArray>(find_key(m, "tokenizer.ggml.token_type")->v).items;
  ASSERT_EQ(tokens.size(), size_t(kVocab + 3));
  ASSERT_EQ(types.size(), tokens.size());
  EXPECT_EQ(std::get<std::string>(tokens[kVocab].v), "[PAD264]");
  EXPECT_EQ(std::get<int32_t>(types[kVocab + 2].v), 5);
  EXPECT_EQ(std::get<int32_t>(types[261].v), 3);  // special added token: control
  EXPECT_EQ(std::get<int32_t>(types[263].v), 4);  // plain added token: user-defined
  EXPECT_EQ(std::get<int32_t>(types[10].v), 1);
}

TEST(ConvertHf, SmolLmStylePreTokenizer) {
  // Digits + ByteLevel(use_regex) is SmolLM2's; clean_up_tokenization_spaces
  // false picks "smollm" over "starcoder", which has the same regexes.
  test::TempDir dir;
  Checkpoint c = make_checkpoint(kQwen2, 5);
  c.tokenizer["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Digits"}, {"individual_digits", true}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
  c.tok_config["add_bos_token"] = true;
  c.write(dir.path());
  const SourceModel m = load_hf_checkpoint(dir.path());
  // "command-r" and "smollm" select the same pre-tokenizer; the table's first name is taken.
  const auto pre = std::get<std::string>(find_key(m, "tokenizer.ggml.pre")->v);
  EXPECT_TRUE(pre == "smollm" || pre == "command-r") << pre;
  EXPECT_TRUE(std::get<bool>(find_key(m, "tokenizer.ggml.add_bos_token")->v));
}

// The converter refuses, before writing anything, a checkpoint whose GGUF
// barata would refuse to load: each case names what is wrong.
TEST(ConvertHf, RefusesWhatWouldNotLoad) {
  struct Case {
    const char* name;
    std::function<void(Checkpoint&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"padded vocab without embedding rows",
       [](Checkpoint& c) { c.config["vocab_size"] = kVocab + 3; },
       "the tokenizer has 267 tokens but token_embd.weight has 264 rows"},
      {"a layer tensor missing",
       [](Checkpoint& c) {
         std::erase_if(c.tensors, [](const HfTensor& t) {
           return t.name == "model.layers.1.mlp.up_proj.weight";
         });
       },
       "tensor blk.1.ffn_up.weight is missing"},
      {"embedding width is not hidden_size",
       [](Checkpoint& c) { c.config["hidden_size"] = c.config["hidden_size"].get<int64_t>() * 2; },
       "would not load"},
      {"rope_theta zero", [](Checkpoint& c) { c.config["rope_theta"] = 0.0; }, "rope.freq_base"},
      {"a negative rms eps", [](Checkpoint& c) { c.config["rms_norm_eps"] = -1e-5; },
       "layer_norm_rms_epsilon"},
      {"config value of the wrong type", [](Checkpoint& c) { c.tokenizer["model"]["type"] = 7; },
       "tokenizer.json"},
      {"tokenizer_config of the wrong type",
       [](Checkpoint& c) { c.tok_config["clean_up_tokenization_spaces"] = "yes"; },
       "tokenizer_config.json"},
      {"absurd vocab_size", [](Checkpoint& c) { c.config["vocab_size"] = 2000000000; },
       "vocab_size"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    test::TempDir dir;
    Checkpoint c = make_checkpoint(kQwen2, 7);
    k.edit(c);
    c.write(dir.path());
    try {
      load_hf_checkpoint(dir.path());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(k.expect), std::string::npos) << e.what();
    }
  }
}

// A FIFO where a file of the checkpoint should be is refused at once (the
// open does not block), whichever file it replaces.
TEST(ConvertHf, FifoInTheCheckpointIsRefused) {
  for (const char* name : {"config.json", "tokenizer.json", "model.safetensors"}) {
    SCOPED_TRACE(name);
    test::TempDir dir;
    make_checkpoint(kQwen2, 8).write(dir.path());
    fs::remove(dir / name);
    ASSERT_EQ(::mkfifo((dir / name).c_str(), 0600), 0);
    try {
      load_hf_checkpoint(dir.path());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FIFO"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace barata
