// `barata inspect --json` on real files: the shapes it reports are the ones
// the files hold (checked against facts stated in tests/data/README.md and the
// model cards). The tiny models are committed; the vocabularies come from
// scripts/fetch-test-data.sh and SmolLM2 from scripts/fetch-model.sh.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const auto run = test::run_cli;

json inspect(const fs::path& file) {
  const test::CliResult r = run("inspect --json " + file.string());
  EXPECT_EQ(r.status, 0) << file;
  return json::parse(r.out);
}

TEST(InspectCli, SharedTinyModels) {
  const auto dir = test::data_dir() / "models";
  struct Want {
    const char* file;
    int layers, d_model, heads, kv_heads, d_ff;
    const char* type;
  };
  for (const Want& w : {Want{"aidreams260K.gguf", 4, 64, 4, 4, 172, "F32"},
                        Want{"stories260K.gguf", 5, 64, 8, 4, 172, "F32"},
                        Want{"stories260K-f16.gguf", 5, 64, 8, 4, 172, "F16"}}) {
    SCOPED_TRACE(w.file);
    const json j = inspect(dir / w.file);
    const json& m = j["model"];
    EXPECT_EQ(m["arch"], "llama");
    EXPECT_EQ(m["n_layer"], w.layers);
    EXPECT_EQ(m["d_model"], w.d_model);
    EXPECT_EQ(m["n_head"], w.heads);
    EXPECT_EQ(m["n_head_kv"], w.kv_heads);
    EXPECT_EQ(m["d_ff"], w.d_ff);
    EXPECT_EQ(m["n_vocab"], 512);
    EXPECT_EQ(m["n_ctx_train"], 128);
    const int head_dim = w.d_model / w.heads;
    EXPECT_EQ(m["head_dim"], head_dim);
    EXPECT_EQ(m["kv_bytes_per_token_f16"], 2 * w.layers * w.kv_heads * head_dim * 2);
    // Tensor shapes: 9 per layer + embeddings, final norm, output.
    EXPECT_EQ(j["tensors"].size(), static_cast<size_t>(9 * w.layers + 3));
    for (const auto& t : j["tensors"]) {
      if (t["name"] == "blk.0.ffn_up.weight")
        EXPECT_EQ(t["shape"], json::array({w.d_model, w.d_ff}));
      if (t["name"] == "blk.0.attn_k.weight")
        EXPECT_EQ(t["shape"], json::array({w.d_model, w.kv_heads * head_dim}));
      if (t["name"] == "blk.0.attn_norm.weight") EXPECT_EQ(t["type"], "F32");
      if (t["name"] == "blk.0.attn_q.weight") EXPECT_EQ(t["type"], w.type);
    }
  }
}

TEST(InspectCli, SharedVocabFiles) {
  const auto dir = test::vocab_dir();
  BARATA_NEED_FETCHED(dir, "scripts/fetch-test-data.sh");
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".gguf") continue;
    SCOPED_TRACE(e.path().filename().string());
    const json j = inspect(e.path());
    bool has_tokens = false;
    for (const auto& kv : j["metadata"])
      if (kv["key"] == "tokenizer.ggml.tokens") {
        has_tokens = true;
        EXPECT_GT(kv["count"].get<int64_t>(), 1000);
        EXPECT_LE(kv["value"].size(), 8u);  // long arrays are summarised
      }
    EXPECT_TRUE(has_tokens);
    ++n;
  }
  EXPECT_EQ(n, 17);  // the vocabularies of llama-cpp-python 0.3.16's llama.cpp
}

TEST(InspectCli, SmolLM2) {
  const auto file = test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  BARATA_NEED_FETCHED(file, "scripts/fetch-model.sh");
  const json j = inspect(file);
  const json& m = j["model"];
  // SmolLM2-135M: 30 layers, 576 wide, 9 heads / 3 kv heads, d_ff 1536, vocab 49152.
  EXPECT_EQ(m["n_layer"], 30);
  EXPECT_EQ(m["d_model"], 576);
  EXPECT_EQ(m["n_head"], 9);
  EXPECT_EQ(m["n_head_kv"], 3);
  EXPECT_EQ(m["head_dim"], 64);
  EXPECT_EQ(m["d_ff"], 1536);
  EXPECT_EQ(m["n_vocab"], 49152);
  EXPECT_EQ(m["n_ctx_train"], 8192);
  EXPECT_EQ(m["rope_base"], 100000.0);
  EXPECT_EQ(m["tied_embeddings"], true);
  EXPECT_EQ(m["kv_bytes_per_token_f16"], 2 * 30 * 3 * 64 * 2);
  EXPECT_EQ(j["totals"]["by_type"]["Q4_1"]["tensors"], 210);
  EXPECT_EQ(j["totals"]["by_type"]["Q8_0"]["tensors"], 1);
  EXPECT_EQ(j["totals"]["all"]["elements"], 134515008);
}

TEST(InspectCli, BadUsage) {
  EXPECT_NE(run("inspect").status, 0);
  EXPECT_NE(run("inspect --bogus-flag x").status, 0);
  EXPECT_NE(run("inspect /no/such/file.gguf").status, 0);
  EXPECT_NE(run("no-such-subcommand").status, 0);
  EXPECT_EQ(run("inspect --help").status, 0);
}

}  // namespace
}  // namespace barata
