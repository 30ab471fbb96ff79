// Teacher-forced agreement (include/barata/agreement.h, `barata agreement`):
// a model against itself agrees everywhere, the F16 copy of stories260K agrees
// almost everywhere and gives prompts x N observations, the traces are the
// greedy ids of `barata run`, a vocabulary mismatch is an error, and the CLI's
// --json carries the library's numbers.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/agreement.h"
#include "barata/battery.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/model.h"
#include "barata/tokenizer.h"
#include "loaded_model.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using Loaded = test::LoadedModel;  // tiny models at a context of 128

const std::vector<std::string> kPrompts = {"Once upon a time", "The little dog ran",
                                           "She had a red ball and", "One day, Tom went to",
                                           "The sun was"};

std::vector<std::vector<int32_t>> encode_all(const Tokenizer& tok,
                                             const std::vector<std::string>& texts) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& t : texts) out.push_back(tok.encode(t, tok.add_bos_default(), false));
  return out;
}

TEST(Agreement, AModelAgainstItselfIsFull) {
  Loaded m(test::tiny_model("stories260K.gguf"));
  const auto prompts = encode_all(m.tok, kPrompts);
  const auto traces = greedy_traces(m.engine, prompts, 12);
  ASSERT_EQ(traces.size(), prompts.size());
  for (size_t i = 0; i < traces.size(); ++i) {
    EXPECT_EQ(traces[i].prompt, prompts[i]);
    EXPECT_EQ(traces[i].generated.size(), 12u);
  }
  const AgreementResult r = teacher_forced_agreement(m.engine, traces);
  EXPECT_EQ(r.n, static_cast<int64_t>(prompts.size()) * 12);
  EXPECT_EQ(r.matches, r.n);
  EXPECT_DOUBLE_EQ(r.rate(), 1.0);
  ASSERT_EQ(r.per_prompt.size(), prompts.size());
  for (const auto& p : r.per_prompt) EXPECT_EQ(p.matches, p.n);
  // Every sequence was freed: the whole pool is free again.
  EXPECT_EQ(m.engine.blocks().blocks_in_use(), 0);
}

TEST(Agreement, TracesAreTheGreedyIdsOfRun) {
  const fs::path path = test::tiny_model("stories260K.gguf");
  Loaded m(path);
  const auto traces = greedy_traces(m.engine, encode_all(m.tok, {kPrompts[0]}), 10);
  const test::CliResult r = test::run_cli_within(
      "run -m " + path.string() + " -p \"" + kPrompts[0] + "\" -n 10 -c 128 -t 1 --temp 0 --json",
      60);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int32_t>>(), traces[0].prompt);
  // run stops at an end-of-generation token; the trace goes on past it.
  const auto ids = j["generated_ids"].get<std::vector<int32_t>>();
  ASSERT_FALSE(ids.empty());
  EXPECT_TRUE(std::equal(ids.begin(), ids.end(), traces[0].generated.begin()));
}

TEST(Agreement, F16CopyAgreesAlmostEverywhere) {
  Loaded base(test::tiny_model("stories260K.gguf"));
  Loaded cand(test::tiny_model("stories260K-f16.gguf"));
  const auto prompts = encode_all(base.tok, kPrompts);
  const AgreementResult r = teacher_forced_agreement(base.engine, cand.engine, prompts, 16);
  EXPECT_EQ(r.n, static_cast<int64_t>(kPrompts.size()) * 16);
  EXPECT_GE(r.rate(), 0.9) << r.matches << "/" << r.n;
  int64_t sum = 0;
  for (const auto& p : r.per_prompt) {
    EXPECT_EQ(p.n, 16);
    EXPECT_LE(p.matches, p.n);
    sum += p.matches;
  }
  EXPECT_EQ(sum, r.matches);
}

TEST(Agreement, ADifferentModelDisagreesSomewhere) {
  // aidreams260K has the same vocabulary size but other weights: the measure
  // is not trivially 1.
  Loaded base(test::tiny_model("stories260K.gguf"));
  Loaded cand(test::tiny_model("aidreams260K.gguf"));
  const auto prompts = encode_all(base.tok, kPrompts);
  const AgreementResult r = teacher_forced_agreement(base.engine, cand.engine, prompts, 16);
  EXPECT_EQ(r.n, static_cast<int64_t>(kPrompts.size()) * 16);
  EXPECT_LT(r.matches, r.n);
}

TEST(Agreement, StopsOnlyAtTheEndOfTheContext) {
  Loaded m(test::tiny_model("stories260K.gguf"), 16);
  const auto prompt = m.tok.encode("Once upon a time", true, false);
  ASSERT_LT(prompt.size(), 16u);
  const auto traces = greedy_traces(m.engine, {prompt}, 100);
  // Generated token i sits at position P + i; the last one need not be cached.
  EXPECT_EQ(traces[0].generated.size(), 16 - prompt.size() + 1);
  const AgreementResult r = teacher_forced_agreement(m.engine, traces);
  EXPECT_EQ(r.n, static_cast<int64_t>(traces[0].generated.size()));
  EXPECT_EQ(r.matches, r.n);
}

TEST(Agreement, BadInputIsAnError) {
  Loaded m(test::tiny_model("stories260K.gguf"));
  EXPECT_THROW(greedy_traces(m.engine, {{1, 2}}, 0), Error);
  EXPECT_THROW(greedy_traces(m.engine, {{}}, 4), Error);
  EXPECT_THROW(greedy_traces(m.engine, {std::vector<int32_t>(129, 5)}, 4), Error);
  auto traces = greedy_traces(m.engine, {{1, 2}}, 4);
  traces[0].n_vocab = 1000;  // from a base with another vocabulary
  try {
    teacher_forced_agreement(m.engine, traces);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
}

TEST(Agreement, VocabularyMismatchIsAnError) {
  // A random-weight llama with a vocabulary of 768 against the 512 of stories260K.
  test::TempDir dir;
  const fs::path other = dir / "tiny-llama.gguf";
  const std::string synth =
      std::string(BARATA_SYNTH_PATH) + " --preset tiny-llama --type F32 -q -o " + other.string();
  ASSERT_EQ(std::system(synth.c_str()), 0) << synth;
  const std::string tiny = test::tiny_model("stories260K.gguf").string();
  const test::CliResult r = test::run_cli_within(
      "agreement --base " + tiny + " -m " + other.string() + " -c 64 -t 1 -n 2", 60);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("vocabulary has 768 tokens but the base model's has 512"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
  Loaded a(test::tiny_model("stories260K.gguf"), 64), b(other, 64);
  EXPECT_THROW(teacher_forced_agreement(a.engine, b.engine, {{1, 2}}, 2), Error);
}

TEST(Agreement, CliJsonEqualsTheLibrary) {
  const fs::path base = test::tiny_model("stories260K.gguf");
  const fs::path cand = test::tiny_model("stories260K-f16.gguf");
  test::TempDir dir;
  {
    std::ofstream f(dir / "prompts.txt");
    for (const auto& p : kPrompts) f << p << "\n\n";  // blank lines are skipped
  }
  const test::CliResult r = test::run_cli_within(
      "agreement --base " + base.string() + " -m " + cand.string() + " --prompts " +
          (dir / "prompts.txt").string() + " -n 7 -c 128 -t 1 --json",
      60);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);

  Loaded b(base), c(cand);
  const auto traces = greedy_traces(b.engine, encode_all(b.tok, kPrompts), 7);
  const AgreementResult lib = teacher_forced_agreement(c.engine, traces);
  EXPECT_EQ(j["n_gen"], 7);
  EXPECT_EQ(j["matches"].get<int64_t>(), lib.matches);
  EXPECT_EQ(j["n"].get<int64_t>(), lib.n);
  EXPECT_DOUBLE_EQ(j["agreement"].get<double>(), lib.rate());
  ASSERT_EQ(j["prompts"].size(), kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const json& p = j["prompts"][i];
    EXPECT_EQ(p["prompt"], kPrompts[i]);
    EXPECT_EQ(p["prompt_ids"].get<std::vector<int32_t>>(), traces[i].prompt);
    EXPECT_EQ(p["generated_ids"].get<std::vector<int32_t>>(), traces[i].generated);
    EXPECT_EQ(p["matches"].get<int64_t>(), lib.per_prompt[i].matches);
    EXPECT_EQ(p["n"].get<int64_t>(), lib.per_prompt[i].n);
  }
}

TEST(Agreement, CliDefaultsToTheBatteryQuestions) {
  const fs::path base = test::tiny_model("stories260K.gguf");
  const test::CliResult r = test::run_cli_within(
      "agreement --base " + base.string() + " -m " + base.string() + " -c 128 -t 1", 60);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto qs = load_battery(test::data_dir() / "eval" / "battery.jsonl");
  const std::string overall = "overall " + std::to_string(qs.size() * 9) + "/" +
                              std::to_string(qs.size() * 9) + " = 100.00%";
  EXPECT_NE(r.out.find(overall), std::string::npos) << r.out;
  for (const auto& q : qs) EXPECT_NE(r.out.find(q.q), std::string::npos) << q.q;
}

TEST(Agreement, CliUsageErrors) {
  const std::string base = test::tiny_model("stories260K.gguf").string();
  test::TempDir dir;
  std::ofstream(dir / "empty.txt") << "\n  \n";
  const auto empty = test::run_cli_within(
      "agreement --base " + base + " -m " + base + " --prompts " + (dir / "empty.txt").string(),
      60);
  EXPECT_EQ(empty.status, 1);
  EXPECT_NE(empty.err.find("error: "), std::string::npos) << empty.err;
  EXPECT_NE(empty.err.find("no prompts"), std::string::npos) << empty.err;
  const auto no_base = test::run_cli_within("agreement -m " + base, 60);
  EXPECT_NE(no_base.status, 0);
  EXPECT_NE(no_base.err.find("error: "), std::string::npos) << no_base.err;
  const auto zero = test::run_cli_within("agreement --base " + base + " -m " + base + " -n 0", 60);
  EXPECT_NE(zero.status, 0);
  EXPECT_NE(zero.err.find("error: "), std::string::npos) << zero.err;
  // A model without a chat template cannot be asked with --chat.
  const auto chat =
      test::run_cli_within("agreement --base " + base + " -m " + base + " --chat -t 1", 60);
  EXPECT_EQ(chat.status, 1);
  EXPECT_NE(chat.err.find("chat template"), std::string::npos) << chat.err;
}

TEST(Agreement, SmolLM2AgainstItselfWithTheChatTemplate) {
  const fs::path smol = test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  BARATA_NEED_FETCHED(smol, test::fetch_script_for(smol));
  // Four prompts, not the 16 defaults: this runs under the sanitizers too.
  test::TempDir dir;
  const std::string p =
      "What is the capital of France?\nHow many legs does a spider have?\n"
      "What is 2 + 2?\nWho wrote Romeo and Juliet?\n";
  test::write_bytes(dir / "p.txt", std::vector<uint8_t>(p.begin(), p.end()));
  const test::CliResult r =
      test::run_cli_within("agreement --base " + smol.string() + " -m " + smol.string() +
                               " --chat -n 3 -c 256 --json --prompts " + (dir / "p.txt").string(),
                           300);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["n"].get<int64_t>(), 4 * 3);
  EXPECT_EQ(j["matches"], j["n"]);
}

}  // namespace
}  // namespace barata
