// barata eval-quant on the tiny F32 model: one row per scheme, the reference
// first, the measures ordered as the schemes' precision says they must be.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace barata {
namespace {

using test::run_cli;

std::string tiny_args() {
  return "-m " + test::tiny_model("aidreams260K.gguf").string() + " -f " +
         (test::data_dir() / "models" / "eval_sample.txt").string() + " -c 64 --chunks 6 -t 1";
}

TEST(EvalQuantCli, RowsAreOrderedByPrecision) {
  test::TempDir dir;
  const auto r =
      run_cli("eval-quant " + tiny_args() + " --schemes int8-row,int4-tensor --json --work-dir " +
              dir.path().string());
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schema"], "barata.eval_quant/1");
  const auto& rows = j["rows"];
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0]["scheme"], "reference");
  EXPECT_EQ(rows[0]["type"], "f32");  // an F32 file is its own reference
  EXPECT_EQ(rows[1]["scheme"], "int8-row");
  EXPECT_EQ(rows[2]["scheme"], "int4-tensor");
  // The reference agrees with itself everywhere and has no KL row.
  EXPECT_EQ(rows[0]["agreement_matches"], rows[0]["agreement_n"]);
  EXPECT_EQ(rows[0]["agreement_n"].get<int>(), 16 * 9);
  EXPECT_FALSE(rows[0].contains("kl_mean"));
  EXPECT_EQ(rows[0]["battery_total"], 16);
  EXPECT_EQ(rows[0]["battery"].size(), 16u);
  // 8 bits per row beat 4 bits per tensor on every measure.
  EXPECT_LT(rows[1]["rel_error_mean"].get<double>(), rows[2]["rel_error_mean"].get<double>());
  EXPECT_LT(rows[1]["kl_mean"].get<double>(), rows[2]["kl_mean"].get<double>());
  EXPECT_GE(rows[1]["agreement_matches"].get<int>(), rows[2]["agreement_matches"].get<int>());
  EXPECT_LT(rows[1]["bits_per_weight"].get<double>(), 9.0);
  EXPECT_LT(rows[2]["bits_per_weight"].get<double>(), 4.5);
  EXPECT_LT(std::abs(rows[1]["ppl"].get<double>() / rows[0]["ppl"].get<double>() - 1), 0.02);
  // --work-dir keeps the quantized files.
  EXPECT_TRUE(std::filesystem::exists(dir / "int4-tensor.gguf"));
}

// KV cache rows (kv:K/V, WEIGHTS+kv:K/V) in the same table, on a tiny
// llama3 whose 32-value heads quantized cache blocks need: the weights stay
// the reference's, and 8 bits of cache cost less than 4 on every measure.
TEST(EvalQuantCli, CacheTypeRows) {
  const auto r = run_cli("eval-quant -m " + test::tiny_model("arch/tiny-llama3.gguf").string() +
                         " -f " + (test::data_dir() / "models" / "eval_sample.txt").string() +
                         " -c 64 --chunks 4 -t 1 --json --schemes "
                         "kv:q8_0/q8_0,kv:q4_0/q4_0,q8_0+kv:q8_0s/iq4_nl");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& rows = j["rows"];
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[1]["scheme"], "kv:q8_0/q8_0");
  EXPECT_EQ(rows[1]["type"], rows[0]["type"]) << "a cache row keeps the reference weights";
  EXPECT_EQ(rows[3]["type"], "q8_0");
  EXPECT_GT(rows[1]["kl_mean"].get<double>(), 0.0);
  EXPECT_LT(rows[1]["kl_mean"].get<double>(), rows[2]["kl_mean"].get<double>());
  EXPECT_GT(rows[1]["agreement_matches"].get<int>(), rows[2]["agreement_matches"].get<int>());
  const auto bad = run_cli("eval-quant -m " + test::tiny_model("arch/tiny-llama3.gguf").string() +
                           " --schemes kv:q9_0");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("q9_0"), std::string::npos) << bad.err;
}

TEST(EvalQuantCli, MarkdownTableAndBadInput) {
  const auto r = run_cli("eval-quant " + tiny_args() + " --schemes q8_0");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("| reference (f32) |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| q8_0 (4 fallback) |"), std::string::npos) << r.out;  // d_ff 172
  EXPECT_NE(r.out.find("| What is the capital of France? |"), std::string::npos) << r.out;
  auto bad = run_cli("eval-quant " + tiny_args() + " --schemes int3");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("int3"), std::string::npos) << bad.err;
  bad = run_cli("eval-quant -m " + test::tiny_model("aidreams260K.gguf").string() + " -f " +
                (test::data_dir() / "models" / "eval_sample.txt").string() +
                " -c 1024 --schemes q8_0");
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("needs at least 2048"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace barata
