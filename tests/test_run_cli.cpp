// `barata run` end to end on the shared tiny models: reference ids from text,
// cache vs no cache through the CLI, --json fields, and the bad-input errors.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using Result = test::CliResult;
const auto run = test::run_cli;

fs::path tiny(const char* name) {
  return test::shared_dir() / "models" / name;
}

#define REQUIRE_SHARED()                     \
  if (!fs::exists(tiny("stories260K.gguf"))) \
    GTEST_SKIP() << "../shared/models is absent on this machine";

TEST(RunCli, GreedyFromTextMatchesTheReference) {
  REQUIRE_SHARED();
  std::ifstream f(test::shared_dir() / "reference/public_aidreams260K.jsonl");
  std::string line;
  std::getline(f, line);
  const json ref = json::parse(line);
  const Result r = run("run -m " + tiny("aidreams260K.gguf").string() + " -p \"" +
                       ref["prompt"].get<std::string>() + "\" -n 48 -c 128 --temp 0 --json -t 1");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"], ref["prompt_ids"]);
  EXPECT_EQ(j["generated_ids"], ref["generated_ids"]);
  EXPECT_EQ(j["text"], ref["text"]);
  EXPECT_GT(j["timings"]["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_EQ(j["timings"]["prefill_tokens"], ref["prompt_ids"].size());
}

TEST(RunCli, NoKvCacheGivesIdenticalIds) {
  REQUIRE_SHARED();
  const std::string base = "run -m " + tiny("stories260K.gguf").string() +
                           " -p \"Lily and Tom went to the park\" -n 40 -c 128 --temp 0 --json";
  const Result a = run(base), b = run(base + " --no-kv-cache");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  const json ja = json::parse(a.out), jb = json::parse(b.out);
  EXPECT_EQ(ja["generated_ids"], jb["generated_ids"]);
  EXPECT_EQ(ja["generated_ids"].size(), 40u);
  EXPECT_EQ(jb["timings"]["kv_cache"], false);
}

TEST(RunCli, TopLogitsAndProbsPerStep) {
  REQUIRE_SHARED();
  const Result r = run("run -m " + tiny("stories260K.gguf").string() +
                       " -p Once -n 5 --temp 0 --json --top-logits 3 --show-probs 4");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  ASSERT_EQ(j["steps"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(j["steps"][i]["top_logits"].size(), 3u);
    EXPECT_EQ(j["steps"][i]["probs"].size(), 4u);
    // greedy: the chosen token is the top logit
    EXPECT_EQ(j["steps"][i]["top_logits"][0][0], j["generated_ids"][i]);
  }
}

TEST(RunCli, SeededSamplingIsReproducible) {
  REQUIRE_SHARED();
  const std::string cmd = "run -m " + tiny("aidreams260K.gguf").string() +
                          " -p \"I sense\" -n 30 --temp 1.0 --seed 7 --json";
  const Result a = run(cmd), b = run(cmd);
  ASSERT_EQ(a.status, 0);
  EXPECT_EQ(json::parse(a.out)["generated_ids"], json::parse(b.out)["generated_ids"]);
}

TEST(RunCli, PromptLongerThanTheContextIsAnError) {
  REQUIRE_SHARED();
  std::string words;
  for (int i = 0; i < 40; ++i) words += "the dog ran ";
  const Result r =
      run("run -m " + tiny("stories260K.gguf").string() + " -c 16 -p \"" + words + "\"");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.rfind("error: the prompt has ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("the context holds 16"), std::string::npos) << r.err;
  const Result t = run("run -m " + tiny("stories260K.gguf").string() +
                       " -c 16 -n 4 --temp 0 --truncate -p \"" + words + "\"");
  EXPECT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.err.find("truncated"), std::string::npos);
}

TEST(RunCli, GenerationStopsAtTheContextLimit) {
  REQUIRE_SHARED();
  const Result r =
      run("run -m " + tiny("stories260K.gguf").string() + " -c 24 -n 100 --temp 0 --json -p Once");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["stop"], "context_full");
  EXPECT_EQ(j["prompt_ids"].size() + j["generated_ids"].size(), 24u);
  EXPECT_NE(r.err.find("context limit of 24"), std::string::npos);
}

TEST(RunCli, BadInput) {
  REQUIRE_SHARED();
  const std::string m = " -m " + tiny("stories260K.gguf").string();
  Result r = run("run" + m + " -p hi --chat-template vicuna");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("unknown chat template 'vicuna' (known: chatml, llama3, gemma, llama2)"),
            std::string::npos)
      << r.err;
  r = run("run" + m + " -p hi --chat");  // the tiny models carry no chat template
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("--chat-template"), std::string::npos) << r.err;
  EXPECT_NE(run("run -m /no/such.gguf -p hi").status, 0);
  EXPECT_NE(run("run" + m).status, 0);  // no prompt
  EXPECT_NE(run("run" + m + " -p hi -n abc").status, 0);
  test::TempDir dir;
  std::vector<uint8_t> trunc = test::read_bytes(tiny("stories260K.gguf"));
  trunc.resize(trunc.size() / 2);
  test::write_bytes(dir / "half.gguf", trunc);
  r = run("run -m " + (dir / "half.gguf").string() + " -p hi");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("past the end of the file"), std::string::npos) << r.err;
}

TEST(RunCli, SmolLM2ChatAnswersInEnglish) {
  const auto model = test::source_dir() / "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "default model not fetched (scripts/fetch-model.sh)";
  const Result r = run("run -m " + model.string() +
                       " --chat -p \"Write one sentence about cats.\" -n 40 --temp 0 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  const std::string text = j["text"];
  // Greedy output of this model (and of llama.cpp on the same file) is an English sentence.
  EXPECT_NE(text.find("cat"), std::string::npos) << text;
  EXPECT_GT(j["generated_ids"].size(), 5u);
}

}  // namespace
}  // namespace barata
