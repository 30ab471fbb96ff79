// Writes the seed corpora of the fuzz targets (tests/fuzz/seeds-<target>/),
// deterministically: make_fuzz_seeds DIR writes DIR/seeds-tokenizer,
// DIR/seeds-hf_checkpoint and DIR/seeds-model_forward. The committed seeds
// are its output; rerun it after changing a format.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "barata/dtype.h"
#include "barata/gguf.h"
#include "barata/half.h"
#include "fuzz_split.h"

namespace {

namespace fs = std::filesystem;
using barata::DType;
using barata::GgufValue;
using barata::GgufWriter;
using nlohmann::json;

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

std::string str(const std::vector<uint8_t>& b) {
  return {b.begin(), b.end()};
}

// ---- tokenizer: byte 0 selects the vocabulary and the flags -----------------

void tokenizer_seeds(const fs::path& dir) {
  const std::vector<std::string> texts = {
      "Hello world",
      "Once upon a time, there was a little girl.\n\nThe end.",
      "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
      "<s>[INST] <|user|> 12345 678 </s>",
      "  leading spaces\tand tabs\r\n  ",
      "caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 \xE2\x96\x81x",
      "bad utf-8: \xC3 \xFF\xFE \x80 end",
      std::string("nul\0inside", 10),
  };
  int n = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    // Vary the vocabulary (low bits) and parse-special / BOS / render flags.
    const uint8_t sel = static_cast<uint8_t>(i * 3 + (i % 2 ? 0x10 : 0) + (i % 3 ? 0x40 : 0));
    write(dir / ("text-" + std::to_string(n++)), std::string(1, static_cast<char>(sel)) + texts[i]);
  }
}

// ---- Hugging Face checkpoint --------------------------------------------------

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

std::string safetensors(const std::vector<std::pair<std::string, std::vector<int64_t>>>& ts,
                        std::mt19937& rng) {
  json header = json::object();
  std::string data;
  std::normal_distribution<float> nd(0.0f, 0.3f);
  int i = 0;
  for (const auto& [name, shape] : ts) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const char* dtype = i % 3 == 0 ? "F32" : i % 3 == 1 ? "F16" : "BF16";
    const size_t begin = data.size();
    for (int64_t k = 0; k < n; ++k) {
      const float v = nd(rng);
      if (i % 3 == 0) {
        char b[4];
        std::memcpy(b, &v, 4);
        data.append(b, 4);
      } else {
        const uint16_t h = i % 3 == 1 ? barata::fp32_to_fp16(v) : barata::fp32_to_bf16(v);
        data.push_back(static_cast<char>(h & 0xff));
        data.push_back(static_cast<char>(h >> 8));
      }
    }
    header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
    ++i;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::string out;
  for (int k = 0; k < 8; ++k) out.push_back(static_cast<char>(uint64_t(h.size()) >> (8 * k)));
  return out + h + data;
}

void hf_seeds(const fs::path& dir) {
  const int64_t d = 8, ff = 16, heads = 2, kv_heads = 1, hd = 4, layers = 1;
  for (const std::string arch : {"llama", "qwen2"}) {
    const bool llama = arch == "llama";
    json vocab = json::object();
    const auto bytes = byte_tokens();
    for (int i = 0; i < 256; ++i) vocab[bytes[i]] = i;
    vocab["he"] = 256;
    vocab["\xC4\xA0t"] = 257;
    const int64_t n_vocab = 260;
    const std::string re =
        llama
            ? R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"
            : R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    const json tokenizer = {{"version", "1.0"},
                            {"added_tokens",
                             {{{"id", 258}, {"content", "<|endoftext|>"}, {"special", true}},
                              {{"id", 259}, {"content", "<|im_start|>"}, {"special", true}}}},
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
                              {"ignore_merges", llama},
                              {"vocab", vocab},
                              {"merges", {"h e", json::array({"\xC4\xA0", "t"})}}}}};
    json config = {{"architectures", {llama ? "LlamaForCausalLM" : "Qwen2ForCausalLM"}},
                   {"num_hidden_layers", layers},
                   {"hidden_size", d},
                   {"intermediate_size", ff},
                   {"num_attention_heads", heads},
                   {"num_key_value_heads", kv_heads},
                   {"max_position_embeddings", 64},
                   {"rms_norm_eps", 1e-5},
                   {"rope_theta", 10000.0},
                   {"rope_scaling", nullptr},
                   {"tie_word_embeddings", !llama},
                   {"bos_token_id", 258},
                   {"eos_token_id", 258},
                   {"vocab_size", n_vocab}};
    const json tok_config = {{"clean_up_tokenization_spaces", llama},
                             {"eos_token", {{"content", "<|endoftext|>"}, {"special", true}}},
                             {"chat_template", "{{ messages }}"}};
    std::vector<std::pair<std::string, std::vector<int64_t>>> ts = {
        {"model.embed_tokens.weight", {n_vocab, d}}};
    for (int64_t l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      ts.push_back({p + "input_layernorm.weight", {d}});
      ts.push_back({p + "self_attn.q_proj.weight", {heads * hd, d}});
      ts.push_back({p + "self_attn.k_proj.weight", {kv_heads * hd, d}});
      ts.push_back({p + "self_attn.v_proj.weight", {kv_heads * hd, d}});
      if (!llama) {
        ts.push_back({p + "self_attn.q_proj.bias", {heads * hd}});
        ts.push_back({p + "self_attn.k_proj.bias", {kv_heads * hd}});
        ts.push_back({p + "self_attn.v_proj.bias", {kv_heads * hd}});
      }
      ts.push_back({p + "self_attn.o_proj.weight", {d, heads * hd}});
      ts.push_back({p + "post_attention_layernorm.weight", {d}});
      ts.push_back({p + "mlp.gate_proj.weight", {ff, d}});
      ts.push_back({p + "mlp.up_proj.weight", {ff, d}});
      ts.push_back({p + "mlp.down_proj.weight", {d, ff}});
    }
    ts.push_back({"model.norm.weight", {d}});
    if (llama) ts.push_back({"lm_head.weight", {n_vocab, d}});
    std::mt19937 rng(llama ? 1 : 2);
    std::vector<std::string> parts = {config.dump(1), tokenizer.dump(), safetensors(ts, rng),
                                      tok_config.dump(1)};
    if (!llama) {  // the sharded form: an index naming the shard for every tensor
      json wm = json::object();
      for (const auto& t : ts) wm[t.first] = barata::fuzz::kHfShard;
      parts.push_back(json{{"metadata", {{"total_size", 0}}}, {"weight_map", wm}}.dump());
    }
    write(dir / (arch + ".ckpt"), barata::fuzz::join(parts));
  }
}

// ---- tiny GGUF models -----------------------------------------------------------

std::vector<uint8_t> quantized(DType t, const std::vector<int64_t>& shape, std::mt19937& rng,
                               float offset = 0.0f) {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  std::normal_distribution<float> nd(0.0f, 0.2f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = offset + nd(rng);
  const int64_t rows = n / shape[0];
  std::vector<uint8_t> out(barata::tensor_bytes(t, shape));
  barata::quantize_tensor(t, v.data(), shape[0], rows, out.data());
  return out;
}

std::vector<uint8_t> tiny_model(const std::string& arch, uint32_t seed) {
  const int64_t d = 32, ff = 64, heads = 4, kv_heads = 2, hd = 8, layers = 2, vocab = 48;
  GgufWriter w;
  const std::string a = arch + ".";
  w.set("general.architecture", arch);
  w.set(a + "block_count", GgufValue(uint32_t(layers)));
  w.set(a + "context_length", GgufValue(uint32_t(64)));
  w.set(a + "embedding_length", GgufValue(uint32_t(d)));
  w.set(a + "feed_forward_length", GgufValue(uint32_t(ff)));
  w.set(a + "attention.head_count", GgufValue(uint32_t(heads)));
  w.set(a + "attention.head_count_kv", GgufValue(uint32_t(kv_heads)));
  w.set(a + "rope.freq_base", GgufValue(10000.0f));
  w.set(a + "attention.layer_norm_rms_epsilon", GgufValue(1e-5f));
  std::mt19937 rng(seed);
  // A mix of types, so that mutated type ids land among the kernels.
  const DType mats[] = {DType::Q4_0, DType::Q8_0, DType::F16, DType::Q4_1};
  int k = 0;
  auto mat = [&](const std::string& name, std::vector<int64_t> shape) {
    const DType t = mats[k++ % 4];
    w.add_tensor(name, t, shape, quantized(t, shape, rng));
  };
  auto vec = [&](const std::string& name, int64_t n, float offset) {
    w.add_tensor(name, DType::F32, {n}, quantized(DType::F32, {n}, rng, offset));
  };
  mat("token_embd.weight", {d, vocab});
  vec("output_norm.weight", d, 1.0f);
  if (arch == "llama") mat("output.weight", {d, vocab});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", d, 1.0f);
    mat(p + "attn_q.weight", {d, heads * hd});
    mat(p + "attn_k.weight", {d, kv_heads * hd});
    mat(p + "attn_v.weight", {d, kv_heads * hd});
    if (arch == "qwen2") {
      vec(p + "attn_q.bias", heads * hd, 0.0f);
      vec(p + "attn_k.bias", kv_heads * hd, 0.0f);
      vec(p + "attn_v.bias", kv_heads * hd, 0.0f);
    }
    mat(p + "attn_output.weight", {heads * hd, d});
    vec(p + "ffn_norm.weight", d, 1.0f);
    mat(p + "ffn_gate.weight", {d, ff});
    mat(p + "ffn_up.weight", {d, ff});
    mat(p + "ffn_down.weight", {ff, d});
  }
  return w.to_bytes();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  const fs::path out = argv[1];
  try {
    tokenizer_seeds(out / "seeds-tokenizer");
    hf_seeds(out / "seeds-hf_checkpoint");
    write(out / "seeds-model_forward" / "llama.gguf", str(tiny_model("llama", 1)));
    write(out / "seeds-model_forward" / "qwen2.gguf", str(tiny_model("qwen2", 2)));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
