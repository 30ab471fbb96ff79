// barata_synth (tools/synth): random-weight GGUF files in named shapes load as
// models with the asked shape, run, quantize, and are reproducible.
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/dtype.h"
#include "barata/gguf.h"
#include "barata/model.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata::test {
namespace {

namespace fs = std::filesystem;

// barata_synth ARGS (quoted by the caller as needed); stdout and stderr apart.
CliResult run_synth(const std::string& args) {
  TempDir dir;
  const std::string cmd = "timeout -k 5 120 " + std::string(BARATA_SYNTH_PATH) + " " + args + " >" +
                          (dir / "out").string() + " 2>" + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  const auto out = read_bytes(dir / "out"), err = read_bytes(dir / "err");
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(out.begin(), out.end()),
          std::string(err.begin(), err.end())};
}

fs::path make(const TempDir& dir, const std::string& name, const std::string& args) {
  const fs::path out = dir / name;
  const CliResult r = run_synth(args + " -o " + out.string());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(out)) << r.err;
  return out;
}

// Mean and standard deviation of a tensor's values, dequantized to float.
std::pair<double, double> moments(const GgufTensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements));
  dtype_traits(t.type).dequantize_row(t.data, v.data(), t.n_elements);
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += static_cast<double>(x) * x;
  const double n = static_cast<double>(v.size()), mean = s / n;
  return {mean, std::sqrt(s2 / n - mean * mean)};
}

TEST(Synth, TinyPresetLoadsWithItsShape) {
  TempDir dir;
  const fs::path f = make(dir, "tiny.gguf", "--preset tiny --type F16");
  const Model m = Model::load(f);
  const ModelConfig& c = m.config();
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.d_model, 128);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.d_ff, 384);
  EXPECT_EQ(c.n_vocab, 1024);
  EXPECT_EQ(c.n_ctx_train, 512);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FLOAT_EQ(c.rope_base, 1e6f);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(m.file().find_tensor("blk.1.ffn_down.weight")->type, DType::F16);
  EXPECT_EQ(m.file().find_tensor("blk.1.ffn_norm.weight")->type, DType::F32);
  EXPECT_EQ(m.file().find_tensor("output.weight"), nullptr);

  // The vocabulary: SentencePiece with byte fallback, so any text round-trips.
  const Tokenizer tok = Tokenizer::from_gguf(m.file());
  EXPECT_EQ(tok.n_vocab(), 1024);
  EXPECT_EQ(tok.model(), "llama");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  for (const std::string text : {"hello world", "Hello, World! 123", "caf\xC3\xA9 \xE2\x82\xAC"}) {
    const auto ids = tok.encode(text, true, false);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], 1);
    EXPECT_EQ(tok.decode(std::span(ids).subspan(1), false), text);
  }
}

// Qwen2.5-0.5B's shape, one layer kept (the embedding alone is 136 M values;
// Q4_0 keeps the file at 88 MB).
TEST(Synth, Qwen25HalfBillionShape) {
  TempDir dir;
  const Model m = Model::load(make(dir, "q.gguf", "--preset qwen2.5-0.5b --layers 1 --type Q4_0"));
  const ModelConfig& c = m.config();
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_EQ(c.n_layer, 1);
  EXPECT_EQ(c.d_model, 896);
  EXPECT_EQ(c.n_head, 14);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_ff, 4864);
  EXPECT_EQ(c.n_vocab, 151936);
  EXPECT_EQ(c.n_ctx_train, 32768);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FLOAT_EQ(c.rope_base, 1e6f);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(m.file().find_tensor("blk.0.attn_k.bias")->shape, std::vector<int64_t>{128});
  EXPECT_EQ(Tokenizer::from_gguf(m.file()).n_vocab(), 151936);
}

// The GPU check's default: a 0.5B llama whose every row length is a
// multiple of 256 (the K-quants' block), one layer kept.
TEST(Synth, KQuantFriendlyHalfBillionShape) {
  TempDir dir;
  const Model m = Model::load(make(dir, "k.gguf", "--preset llama-0.5b --layers 1 --type Q4_0"));
  const ModelConfig& c = m.config();
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.d_model, 1024);
  EXPECT_EQ(c.n_head, 16);
  EXPECT_EQ(c.n_head_kv, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_ff, 3072);
  EXPECT_EQ(c.n_vocab, 151936);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  for (int64_t k : {c.d_model, c.n_head * c.head_dim, c.d_ff}) EXPECT_EQ(k % 256, 0) << k;
}

// The mixtures of experts: the committed tiny ones are this tool's output
// (tests/data/README.md says how they were made), and the benchmark shapes
// are listed.
TEST(Synth, MixtureOfExpertsPresets) {
  TempDir dir;
  for (const char* name : {"tiny-qwen3moe", "tiny-mixtral"}) {
    const auto made = read_bytes(make(dir, std::string(name) + ".gguf",
                                      std::string("--preset ") + name + " --type F16 --std 0.2"));
    EXPECT_EQ(made,
              read_bytes(test::data_dir() / "models" / "arch" / (std::string(name) + ".gguf")))
        << name;
  }
  // The benchmark shapes (17 GB and 3.9 GB in Q4_0: too big to write in a test).
  const CliResult list = run_synth("--list");
  for (const char* name :
       {"qwen3-30b-a3b ", "olmoe-like ", "qwen3-30b-a3b-dense", "olmoe-like-dense"})
    EXPECT_NE(list.out.find(name), std::string::npos) << list.out;
}

TEST(Synth, OtherPresetsAndLayerOverride) {
  TempDir dir;
  const Model a = Model::load(make(dir, "a.gguf", "--preset tiny-llama --type F32 --layers 3"));
  EXPECT_EQ(a.config().arch, "llama");
  EXPECT_EQ(a.config().n_layer, 3);
  EXPECT_FALSE(a.config().tied_embeddings);
  EXPECT_FALSE(a.config().qkv_bias);
  EXPECT_EQ(a.file().find_tensor("output.weight")->type, DType::F32);

  const Model q = Model::load(make(dir, "q.gguf", "--preset tiny --type Q8_0"));
  EXPECT_EQ(q.file().find_tensor("blk.0.attn_q.weight")->type, DType::Q8_0);

  const CliResult list = run_synth("--list");
  EXPECT_EQ(list.status, 0);
  EXPECT_NE(list.out.find("qwen2.5-0.5b"), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("llama-0.5b"), std::string::npos) << list.out;
}

// Values are a function of (seed, tensor name, index): the same for any
// thread count, and the layers kept by --layers hold the same values.
TEST(Synth, ReproducibleAndThreadIndependent) {
  TempDir dir;
  const auto one = read_bytes(make(dir, "1.gguf", "--preset tiny --seed 7 -t 1"));
  const auto two = read_bytes(make(dir, "2.gguf", "--preset tiny --seed 7 -t 2"));
  const auto other = read_bytes(make(dir, "3.gguf", "--preset tiny --seed 8"));
  EXPECT_EQ(one, two);
  EXPECT_NE(one, other);

  const GgufFile two_layers = GgufFile::open(dir / "2.gguf");
  const GgufFile three_layers =
      GgufFile::open(make(dir, "4.gguf", "--preset tiny --seed 7 --layers 3"));
  for (const char* name : {"token_embd.weight", "blk.1.attn_q.weight", "blk.1.attn_k.bias"}) {
    const GgufTensorInfo* x = two_layers.find_tensor(name);
    const GgufTensorInfo* y = three_layers.find_tensor(name);
    ASSERT_TRUE(x && y) << name;
    ASSERT_EQ(x->n_bytes, y->n_bytes);
    EXPECT_EQ(std::memcmp(x->data, y->data, x->n_bytes), 0) << name;
  }
  // Different tensors get different values.
  const GgufTensorInfo* k = two_layers.find_tensor("blk.0.attn_k.weight");
  const GgufTensorInfo* v = two_layers.find_tensor("blk.0.attn_v.weight");
  EXPECT_NE(std::memcmp(k->data, v->data, k->n_bytes), 0);
}

TEST(Synth, WeightStatistics) {
  TempDir dir;
  const GgufFile f = GgufFile::open(make(dir, "s.gguf", "--preset tiny --type F32"));
  const auto [em, es] = moments(*f.find_tensor("token_embd.weight"));  // 131072 values
  EXPECT_NEAR(em, 0.0, 0.001);
  EXPECT_NEAR(es, 0.02, 0.0005);
  const auto [gm, gs] = moments(*f.find_tensor("blk.0.attn_norm.weight"));
  EXPECT_NEAR(gm, 1.0, 0.01);
  EXPECT_NEAR(gs, 0.02, 0.005);

  const GgufFile g = GgufFile::open(make(dir, "w.gguf", "--preset tiny --type F32 --std 0.05"));
  EXPECT_NEAR(moments(*g.find_tensor("blk.0.ffn_up.weight")).second, 0.05, 0.001);
}

TEST(Synth, RunsAndQuantizes) {
  TempDir dir;
  const fs::path f = make(dir, "tiny.gguf", "--preset tiny --type F16");
  const CliResult r = run_cli_within("run -m " + f.string() + " -p hello -n 4 --temp 0 -t 1", 60);
  ASSERT_EQ(r.status, 0) << r.err;

  const CliResult j =
      run_cli_within("run -m " + f.string() + " -p hello -n 4 --temp 0 -t 1 --json", 60);
  ASSERT_EQ(j.status, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_FALSE(doc["prompt_ids"].empty());
  EXPECT_GE(doc["generated_ids"].size(), 1u);
  EXPECT_LE(doc["generated_ids"].size(), 4u);

  const fs::path q = dir / "tiny-q8_0.gguf";
  const CliResult qr =
      run_cli_within("quantize " + f.string() + " " + q.string() + " --type q8_0 -t 1", 60);
  ASSERT_EQ(qr.status, 0) << qr.err;
  const Model m = Model::load(q);
  EXPECT_EQ(m.file().find_tensor("blk.0.ffn_up.weight")->type, DType::Q8_0);
  EXPECT_EQ(m.config().n_vocab, 1024);
  const CliResult rq = run_cli_within("run -m " + q.string() + " -p hello -n 4 --temp 0 -t 1", 60);
  EXPECT_EQ(rq.status, 0) << rq.err;
}

TEST(Synth, BadArguments) {
  TempDir dir;
  const std::string out = " -o " + (dir / "x.gguf").string();
  const CliResult unknown = run_synth("--preset nope" + out);
  EXPECT_EQ(unknown.status, 1);
  EXPECT_NE(unknown.err.find("error: unknown preset 'nope'"), std::string::npos) << unknown.err;
  EXPECT_NE(unknown.err.find("qwen2.5-0.5b"), std::string::npos) << unknown.err;

  const CliResult priv = run_synth("--preset tiny --type NF4_B64" + out);
  EXPECT_EQ(priv.status, 1);
  EXPECT_NE(priv.err.find("barata quantize"), std::string::npos) << priv.err;

  const CliResult missing = run_synth("--preset tiny");
  EXPECT_EQ(missing.status, 1);
  EXPECT_FALSE(fs::exists(dir / "x.gguf"));
}

}  // namespace
}  // namespace barata::test
