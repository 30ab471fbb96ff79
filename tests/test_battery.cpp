// The factual battery (include/barata/battery.h, `barata battery`): the
// committed questions parse, normalization and whole-word matching, a
// malformed file names its line, and runs on the tiny model (library and CLI)
// and on SmolLM2 when fetched. No score is asserted: the rows and the count
// of ok rows must agree with each other.
#include <algorithm>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/battery.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/model.h"
#include "barata/sampler.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path battery_file() {
  return test::data_dir() / "eval" / "battery.jsonl";
}

// The message of the barata::Error f throws, or "" when it throws none.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Battery, CommittedFileParses) {
  const auto qs = load_battery(battery_file());
  ASSERT_EQ(qs.size(), 16u);
  for (size_t i = 0; i < qs.size(); ++i) {
    EXPECT_EQ(qs[i].line, static_cast<int>(i) + 1);
    EXPECT_FALSE(qs[i].q.empty());
    ASSERT_FALSE(qs[i].answers.empty());
    for (const auto& a : qs[i].answers) EXPECT_FALSE(normalize_answer(a).empty()) << a;
    // Every question is different.
    for (size_t j = 0; j < i; ++j) EXPECT_NE(qs[i].q, qs[j].q);
  }
}

TEST(Battery, Normalization) {
  EXPECT_EQ(normalize_answer("Paris"), "paris");
  EXPECT_EQ(normalize_answer("  The capital is PARIS!  "), "the capital is paris");
  EXPECT_EQ(normalize_answer("H2O."), "h2o");
  EXPECT_EQ(normalize_answer("carbon-dioxide,\tCO2"), "carbon dioxide co2");
  EXPECT_EQ(normalize_answer("\"Au\""), "au");
  EXPECT_EQ(normalize_answer("...!?"), "");
  EXPECT_EQ(normalize_answer("Zürich"), "z\xc3\xbcrich");  // letters of UTF-8 kept
  EXPECT_EQ(normalize_answer("It is 0°C \xe2\x80\x94 “cold”…"), "it is 0 c cold");
  EXPECT_EQ(normalize_answer("100\xe2\x84\x83"), "100");  // U+2103 DEGREE CELSIUS
  EXPECT_EQ(normalize_answer("a\xff b"), "a\xff b");      // an invalid byte is kept, one byte
}

TEST(Battery, AnswerMatchesWholeWords) {
  EXPECT_TRUE(answer_in("The capital of France is Paris.", {"Paris"}));
  EXPECT_TRUE(answer_in("paris", {"Paris"}));
  EXPECT_TRUE(answer_in("2 + 2 = 4.", {"4", "four"}));
  EXPECT_TRUE(answer_in("It has Eight legs", {"8", "eight"}));
  EXPECT_TRUE(answer_in("Plants take in carbon dioxide.", {"carbon dioxide", "CO2"}));
  EXPECT_TRUE(answer_in("Carbon-Dioxide!", {"carbon dioxide"}));
  EXPECT_TRUE(answer_in("Water freezes at 0°C.", {"0", "zero"}));
  EXPECT_FALSE(answer_in("There are 40 of them", {"4", "four"}));
  EXPECT_FALSE(answer_in("Parisian food", {"Paris"}));
  EXPECT_FALSE(answer_in("carbon and dioxide", {"carbon dioxide"}));
  EXPECT_FALSE(answer_in("", {"Paris"}));
}

TEST(Battery, MalformedFileNamesTheLine) {
  const std::string good = "{\"q\": \"What is 1 + 1?\", \"a\": [\"2\", \"two\"]}\n";
  // Blank lines count, and are skipped.
  const auto qs = parse_battery(good + "\n" + good, "b.jsonl");
  ASSERT_EQ(qs.size(), 2u);
  EXPECT_EQ(qs[1].line, 3);
  EXPECT_EQ(qs[1].answers, (std::vector<std::string>{"2", "two"}));

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"q\": \"x?\", \"a\": [\"y\"]", "not valid JSON"},
      {"[1, 2]", "expected an object"},
      {"{\"a\": [\"y\"]}", "\"q\" must be a non-empty string"},
      {"{\"q\": \"  \", \"a\": [\"y\"]}", "\"q\" must be a non-empty string"},
      {"{\"q\": \"x?\"}", "\"a\" must be a non-empty array"},
      {"{\"q\": \"x?\", \"a\": []}", "\"a\" must be a non-empty array"},
      {"{\"q\": \"x?\", \"a\": \"y\"}", "\"a\" must be a non-empty array"},
      {"{\"q\": \"x?\", \"a\": [3]}", "must be a string"},
      {"{\"q\": \"x?\", \"a\": [\"?!\"]}", "could never match"},
      {"{\"q\": \"x?\", \"a\": [\"y\"], \"answer\": 1}", "unknown key \"answer\""},
  };
  for (const auto& entry : bad) {
    // Not a structured binding: clang 14 cannot capture one in a lambda.
    const std::string& line = entry.first;
    const std::string& what = entry.second;
    const std::string msg = error_of([&] { parse_battery(good + "\n" + line + "\n", "b.jsonl"); });
    EXPECT_NE(msg.find("b.jsonl:3: "), std::string::npos) << line << " -> " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << line << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([] { parse_battery("\n \n", "e.jsonl"); }).find("e.jsonl: no questions"),
            std::string::npos);
}

TEST(Battery, MalformedFileIsACliError) {
  test::TempDir dir;
  std::ofstream(dir / "bad.jsonl")
      << "{\"q\": \"x?\", \"a\": [\"y\"]}\n{\"q\": 5, \"a\": [\"y\"]}\n";
  const test::CliResult r =
      test::run_cli_within("battery -m " + test::tiny_model("aidreams260K.gguf").string() +
                               " --questions " + (dir / "bad.jsonl").string(),
                           60);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("error: " + (dir / "bad.jsonl").string() + ":2: \"q\""), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(Battery, PromptUsesTheChatTemplateOnlyWhereThereIsOne) {
  const Model m = Model::load(test::tiny_model("aidreams260K.gguf"));
  const Tokenizer tok = Tokenizer::from_gguf(m.file());
  ASSERT_TRUE(tok.chat_template().empty());
  const BatteryPrompt plain = battery_prompt(tok, "Why?", {});
  EXPECT_EQ(plain.text, "Question: Why?\nAnswer:");
  EXPECT_FALSE(plain.parse_special);
  BatteryOptions o;
  o.chat_family = ChatFamily::kChatML;
  const BatteryPrompt chat = battery_prompt(tok, "Why?", o);
  EXPECT_TRUE(chat.parse_special);
  EXPECT_EQ(chat.text, apply_chat_template(ChatFamily::kChatML, {{"user", "Why?"}}, true));
}

TEST(Battery, TinyModelGivesARowPerQuestion) {
  const Model m = Model::load(test::tiny_model("aidreams260K.gguf"));
  const Tokenizer tok = Tokenizer::from_gguf(m.file());
  Engine e(m, {.n_threads = 1, .n_ctx = 128});
  const auto qs = load_battery(battery_file());
  const BatteryResult r = run_battery(e, tok, qs);
  ASSERT_EQ(r.total(), 16);
  int ok = 0;
  for (size_t i = 0; i < qs.size(); ++i) {
    const BatteryRow& row = r.rows[i];
    EXPECT_EQ(row.question, qs[i].q);
    EXPECT_EQ(row.answers, qs[i].answers);
    ASSERT_FALSE(row.generated.empty());
    EXPECT_LE(row.generated.size(), 24u);
    EXPECT_EQ(row.reply.find('\n'), std::string::npos) << row.reply;
    EXPECT_EQ(row.ok, answer_in(row.reply, row.answers));
    ok += row.ok ? 1 : 0;
  }
  EXPECT_EQ(r.correct, ok);
  EXPECT_EQ(e.blocks().blocks_in_use(), 0);

  BatteryOptions one;
  one.max_new_tokens = 1;
  const BatteryResult short_r = run_battery(e, tok, qs, one);
  for (const BatteryRow& row : short_r.rows) EXPECT_EQ(row.generated.size(), 1u);
  one.max_new_tokens = 0;
  EXPECT_THROW(run_battery(e, tok, qs, one), Error);
}

// The battery runs on the scheduler, several questions per step, its
// replies cut at their first line by a stop string. The loop it replaced,
// one question at a time (prefill, then greedy decode until the trimmed
// text holds a newline), gives the same replies; the scheduler stops at the
// newline itself, where the old loop ran until the next visible byte.
TEST(Battery, RepliesEqualTheOneQuestionAtATimeLoop) {
  const Model m = Model::load(test::tiny_model("aidreams260K.gguf"));
  const Tokenizer tok = Tokenizer::from_gguf(m.file());
  Engine e(m, {.n_threads = 1, .n_ctx = 128});
  const auto qs = load_battery(battery_file());
  const BatteryResult r = run_battery(e, tok, qs);
  auto trimmed = [](std::string_view v) {
    const size_t b = v.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return std::string_view();
    return v.substr(b, v.find_last_not_of(" \t\r\n") - b + 1);
  };
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  for (size_t i = 0; i < qs.size(); ++i) {
    SCOPED_TRACE(qs[i].q);
    const BatteryPrompt p = battery_prompt(tok, qs[i].q, {});
    const std::vector<int32_t> ids = tok.encode(p.text, tok.add_bos_default(), p.parse_special);
    const int seq = e.new_sequence();
    e.prefill(seq, ids, logits.data());
    StreamDecoder dec(tok);
    std::string text;
    std::vector<int32_t> generated;
    for (int k = 0; k < 24; ++k) {
      const int32_t t = argmax(logits);
      generated.push_back(t);
      if (tok.is_eog(t)) break;
      text += dec.push(t);
      if (trimmed(text).find('\n') != std::string_view::npos) break;
      if (k + 1 == 24 || e.length(seq) >= e.n_ctx()) break;
      e.decode(std::span<const int>(&seq, 1), std::span<const int32_t>(&t, 1), logits.data());
    }
    text += dec.flush();
    e.free_sequence(seq);
    std::string_view reply = trimmed(text);
    reply = trimmed(reply.substr(0, reply.find('\n')));
    EXPECT_EQ(r.rows[i].reply, std::string(reply));
    const std::vector<int32_t>& now = r.rows[i].generated;
    ASSERT_LE(now.size(), generated.size());
    EXPECT_TRUE(std::equal(now.begin(), now.end(), generated.begin()));
  }
  EXPECT_EQ(e.blocks().blocks_in_use(), 0);
}

TEST(Battery, CliPrintsEveryQuestionAndTheScore) {
  const std::string model = test::tiny_model("aidreams260K.gguf").string();
  const test::CliResult j = test::run_cli_within("battery -m " + model + " -t 1 --json", 60);
  ASSERT_EQ(j.status, 0) << j.err;
  const json doc = json::parse(j.out);
  ASSERT_EQ(doc["rows"].size(), 16u);
  EXPECT_EQ(doc["total"], 16);
  EXPECT_EQ(doc["template"], "none");
  int ok = 0;
  for (const json& row : doc["rows"]) ok += row["ok"].get<bool>() ? 1 : 0;
  EXPECT_EQ(doc["correct"], ok);

  const test::CliResult t = test::run_cli_within("battery -m " + model + " -t 1", 60);
  ASSERT_EQ(t.status, 0) << t.err;
  for (const json& row : doc["rows"]) {
    EXPECT_NE(t.out.find(row["q"].get<std::string>()), std::string::npos);
  }
  EXPECT_NE(t.out.find("score " + std::to_string(ok) + "/16"), std::string::npos) << t.out;
}

TEST(Battery, SmolLM2UsesItsChatTemplate) {
  const fs::path smol = test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  BARATA_NEED_FETCHED(smol, test::fetch_script_for(smol));
  // Three questions of the committed set: the whole battery is 16 greedy
  // generations, minutes under the sanitizers.
  test::TempDir dir;
  const std::string all = read_regular_file(default_battery_path(), "battery");
  size_t cut = 0;
  for (int i = 0; i < 3; ++i) cut = all.find('\n', cut) + 1;
  const std::vector<uint8_t> three(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(cut));
  test::write_bytes(dir / "three.jsonl", three);
  const test::CliResult r =
      test::run_cli_within("battery -m " + smol.string() + " -c 512 --json --questions " +
                               (dir / "three.jsonl").string(),
                           300);
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  EXPECT_EQ(doc["template"], "chatml");
  ASSERT_EQ(doc["rows"].size(), 3u);
  for (const json& row : doc["rows"]) EXPECT_FALSE(row["reply"].get<std::string>().empty());
}

}  // namespace
}  // namespace barata
