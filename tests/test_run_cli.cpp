// `barata run` end to end on the committed tiny models (tests/data/models,
// llama.cpp's ids in tests/data/reference) and on SmolLM2
// (scripts/fetch-model.sh): reference ids from text, cache vs no cache through
// the CLI, --json fields, and the bad-input errors.
#include <fstream>

#include <sys/stat.h>

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
  return test::tiny_model(name);
}

// The tiny models are committed: their absence is a broken checkout, not a skip.
#define REQUIRE_MODELS() \
  ASSERT_TRUE(fs::exists(tiny("stories260K.gguf"))) << tiny("stories260K.gguf");

TEST(RunCli, GreedyFromTextMatchesTheReference) {
  REQUIRE_MODELS();
  std::ifstream f(test::data_dir() / "reference/public_aidreams260K.jsonl");
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
  // The prefill is timed (it once read 0 ms: the first token had been counted before the check).
  EXPECT_GT(j["timings"]["prefill_ms"].get<double>(), 0.0);
  EXPECT_LE(j["timings"]["prefill_ms"].get<double>(),
            j["timings"]["time_to_first_token_ms"].get<double>());
}

TEST(RunCli, NoKvCacheGivesIdenticalIds) {
  REQUIRE_MODELS();
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

// Stop strings (llama.cpp's -r / --reverse-prompt): the text ends before
// the first one, which is not printed, and "stop" says why.
TEST(RunCli, StopStringEndsTheText) {
  REQUIRE_MODELS();
  const std::string base = "run -m " + tiny("stories260K.gguf").string() +
                           " -p \"Lily and Tom went to the park\" -n 40 -c 128 --temp 0";
  const Result free_run = run(base + " --json");
  ASSERT_EQ(free_run.status, 0) << free_run.err;
  const json jf = json::parse(free_run.out);
  const std::string text = jf["text"];
  ASSERT_GT(text.size(), 30u) << text;
  const std::string stop = text.substr(text.size() / 2, 5);
  const std::string cut = text.substr(0, text.find(stop));
  for (const std::string flag : {"--stop", "-r"}) {
    SCOPED_TRACE(flag);
    const Result r =
        run(base + " --json " + flag + " '" + stop + "' --stop 'a string never written'");
    ASSERT_EQ(r.status, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["text"], cut);
    EXPECT_EQ(j["stop"], "stop");
    EXPECT_LT(j["generated_ids"].size(), jf["generated_ids"].size());
  }
  // The same cut with a drafter: speculation is a mode of the one loop, and
  // a verify pass's kept tokens meet the stop string one by one.
  for (const std::string drafter :
       {" --lookup 3", " --lookup 2 --draft-auto", " --draft-self int4-tensor --draft-max 4"}) {
    SCOPED_TRACE(drafter);
    const Result r = run(base + " --json --stop '" + stop + "'" + drafter);
    ASSERT_EQ(r.status, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["text"], cut);
    EXPECT_EQ(j["stop"], "stop");
    ASSERT_TRUE(j.contains("speculative")) << r.out;
    EXPECT_LE(j["speculative"]["accepted"].get<int64_t>(),
              j["speculative"]["drafted"].get<int64_t>());
  }
  const Result plain = run(base + " --stop '" + stop + "'");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(plain.out.find(stop), std::string::npos) << "the stop string is not printed";
  EXPECT_NE(plain.out.find(cut.substr(0, cut.size() / 2)), std::string::npos) << plain.out;
}

// -ctk / -ctv on run (llama.cpp's spellings and the long ones): a tiny
// llama3 with 32-value heads generates with each, the KV line names the
// types, and greedy decoding with q8_0 s-keys stays close to fp16's first
// tokens; a quantized type on 8-value heads (stories260K) is one error line.
TEST(RunCli, CacheTypes) {
  REQUIRE_MODELS();
  const std::string base =
      "run -m " + tiny("arch/tiny-llama3.gguf").string() + " -p \"hello\" -n 12 --temp 0 -t 1";
  const Result f16 = run(base + " --json");
  ASSERT_EQ(f16.status, 0) << f16.err;
  for (const std::string types : {std::string(" -ctk q8_0 -ctv q8_0"),
                                  std::string(" --cache-type-k q8_0s --cache-type-v iq4_nl"),
                                  std::string(" -ctk fp8 -ctv q4_0")}) {
    SCOPED_TRACE(types);
    const Result r = run(base + " --json" + types);
    ASSERT_EQ(r.status, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["generated_ids"].size(), json::parse(f16.out)["generated_ids"].size());
    EXPECT_NE(r.err.find("KV pool"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("fp16"), std::string::npos) << "the pool line names the types: " << r.err;
  }
  const Result bad = run("run -m " + tiny("stories260K.gguf").string() + " -p hi -n 2 -ctk q8_0");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("error: "), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}

// -n 0: the prompt is read (and timed), nothing is generated.
TEST(RunCli, ZeroPredictPrefillsOnly) {
  REQUIRE_MODELS();
  for (const char* extra : {"", " --no-kv-cache"}) {
    const Result r = run("run -m " + tiny("stories260K.gguf").string() +
                         " -p \"Lily and Tom went to the park\" -n 0 -c 128 --json" + extra);
    ASSERT_EQ(r.status, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_TRUE(j["generated_ids"].empty());
    EXPECT_EQ(j["text"], "");
    EXPECT_GT(j["timings"]["prefill_ms"].get<double>(), 0.0);
    EXPECT_EQ(j["timings"]["prefill_tokens"], j["prompt_ids"].size());
  }
}

TEST(RunCli, TopLogitsAndProbsPerStep) {
  REQUIRE_MODELS();
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
  REQUIRE_MODELS();
  const std::string cmd = "run -m " + tiny("aidreams260K.gguf").string() +
                          " -p \"I sense\" -n 30 --temp 1.0 --seed 7 --json";
  const Result a = run(cmd), b = run(cmd);
  ASSERT_EQ(a.status, 0);
  EXPECT_EQ(json::parse(a.out)["generated_ids"], json::parse(b.out)["generated_ids"]);
}

TEST(RunCli, PromptLongerThanTheContextIsAnError) {
  REQUIRE_MODELS();
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
  // A context too small for any prompt and its reply: one clear error.
  const Result one =
      run("run -m " + tiny("stories260K.gguf").string() + " -c 1 --truncate -p \"" + words + "\"");
  EXPECT_EQ(one.status, 1);
  EXPECT_NE(one.err.find("need -c 2 or more"), std::string::npos) << one.err;
  EXPECT_EQ(one.err.find("truncated to"), std::string::npos) << one.err;
}

TEST(RunCli, GenerationStopsAtTheContextLimit) {
  REQUIRE_MODELS();
  const Result r =
      run("run -m " + tiny("stories260K.gguf").string() + " -c 24 -n 100 --temp 0 --json -p Once");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["stop"], "context_full");
  EXPECT_EQ(j["prompt_ids"].size() + j["generated_ids"].size(), 24u);
  EXPECT_NE(r.err.find("context limit of 24"), std::string::npos);
}

TEST(RunCli, BadInput) {
  REQUIRE_MODELS();
  const std::string m = " -m " + tiny("stories260K.gguf").string();
  Result r = run("run" + m + " -p hi --chat-template vicuna");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(
      r.err.find("unknown chat template 'vicuna' (known: chatml, llama3, gemma, llama2, phi3)"),
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
  const auto model = test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  BARATA_NEED_FETCHED(model, "scripts/fetch-model.sh");
  const Result r = run("run -m " + model.string() +
                       " --chat -p \"Write one sentence about cats.\" -n 40 --temp 0 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  const std::string text = j["text"];
  // Greedy output of this model (and of llama.cpp on the same file) is an English sentence.
  EXPECT_NE(text.find("cat"), std::string::npos) << text;
  EXPECT_GT(j["generated_ids"].size(), 5u);
}

// ---- flag and prompt-file validation (no model needed: refused first) -------

// The command under `timeout 20`, so that a regression (a read that blocks on
// a FIFO or never ends on /dev/zero) fails instead of hanging the suite.
Result run_bounded(const std::string& args) {
  test::TempDir dir;
  const std::string cmd = "timeout 20 " + std::string(BARATA_CLI_PATH) + " " + args + " >" +
                          (dir / "out").string() + " 2>" + (dir / "err").string() + " </dev/null";
  const int status = std::system(cmd.c_str());
  const auto out = test::read_bytes(dir / "out"), err = test::read_bytes(dir / "err");
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(out.begin(), out.end()),
          std::string(err.begin(), err.end())};
}

// The first line of stderr, without the "error: " a usage error may carry.
std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  if (line.rfind("error: ", 0) == 0) line.erase(0, 7);
  return line;
}

TEST(RunCliValidation, SamplingValuesOutsideTheirDomainAreUsageErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"--temp nan", "--temp"},
      {"--temp -0.5", "--temp"},
      {"--temp inf", "--temp"},
      {"--top-p nan", "--top-p"},
      {"--top-p 0", "--top-p"},
      {"--top-p 1.5", "--top-p"},
      {"--min-p nan", "--min-p"},
      {"--min-p -0.1", "--min-p"},
      {"--repeat-penalty 0", "--repeat-penalty"},
      {"--repeat-penalty -1", "--repeat-penalty"},
      {"--repeat-penalty nan", "--repeat-penalty"},
      {"--top-k -5", "--top-k"},
      {"--repeat-last-n -1", "--repeat-last-n"},
      {"-s 18446744073709551616", "--seed"},
      {"-s -1", "--seed"},
      {"--seed 12abc", "--seed"},
  };
  for (const auto& [flag, name] : cases) {
    const Result r = run_bounded(std::string("run -p hi -n 1 ") + flag);
    EXPECT_NE(r.status, 0) << flag;
    EXPECT_NE(r.status, 124) << flag << ": timed out";
    EXPECT_NE(r.status, 1) << flag << ": refused at run time, not as a usage error";
    // One line naming the flag and the value (CLI11 adds its --help hint after it).
    const std::string line = first_line(r.err);
    EXPECT_EQ(line.rfind(std::string(name) + ": ", 0), 0u) << flag << ": " << r.err;
    const std::string value = std::string(flag).substr(std::string(flag).find(' ') + 1);
    EXPECT_NE(line.find(value), std::string::npos) << flag << ": " << r.err;
    EXPECT_EQ(r.err.find("error: internal"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << flag;
  }
}

TEST(RunCliValidation, EdgesOfTheRangesAreAccepted) {
  // Accepted: the parse goes on to --show-probs -1 (checked after the sampling
  // flags), whose error is then the first line.
  for (const char* flag : {"--temp 0", "--top-p 1", "--min-p 0", "--min-p 1", "--top-k 0",
                           "--repeat-penalty 1e-3", "-s 18446744073709551615", "-s 0"}) {
    const Result r = run_bounded(std::string("run -p hi -n 1 --show-probs -1 ") + flag);
    EXPECT_NE(r.status, 0);
    EXPECT_EQ(first_line(r.err).rfind("--show-probs: ", 0), 0u) << flag << ": " << r.err;
  }
}

TEST(RunCliValidation, PromptTogetherWithFileIsAUsageError) {
  test::TempDir dir;
  std::ofstream(dir / "p.txt") << "hello";
  const Result r = run_bounded("run -p hi -f " + (dir / "p.txt").string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, 1);
  EXPECT_NE(first_line(r.err).find("--prompt excludes --file"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(RunCliValidation, PromptFileMustBeARegularFile) {
  test::TempDir dir;
  const fs::path fifo = dir / "prompt.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Result r = run_bounded("run -n 1 -f " + fifo.string());  // nobody writes: a read would block
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, "error: " + fifo.string() + ": the prompt file is a FIFO, not a regular file\n");
  r = run_bounded("run -n 1 -f /dev/zero");  // a read would never end
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.err, "error: /dev/zero: the prompt file is a character device, not a regular file\n");
  r = run_bounded("run -n 1 -f " + dir.path().string());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, 124);
}

}  // namespace
}  // namespace barata
