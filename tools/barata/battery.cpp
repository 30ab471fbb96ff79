// barata battery: the factual battery (include/barata/battery.h), each
// question with the first line of the reply and ok / miss, then the score.
#include <cstdio>
#include <memory>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "barata/battery.h"
#include "barata/chat_template.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "commands.h"
#include "session.h"

namespace barata::cli {
namespace {

struct BatteryArgs {
  ModelOptions model;
  std::string questions, chat_template;
  int max_new_tokens = 24;
  bool no_chat = false, json = false;
};

int run(const BatteryArgs& a) {
  // The questions first: a bad file is refused before the model loads.
  const std::string path = a.questions.empty() ? default_battery_path().string() : a.questions;
  const std::vector<BatteryQuestion> qs = load_battery(path);
  Session s(session_options(a.model));
  BatteryOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.plain = a.no_chat;
  if (!a.chat_template.empty()) o.chat_family = chat_family_from_name(a.chat_template);
  std::string template_name = "none";
  if (!o.plain) {
    if (!o.chat_family) o.chat_family = detect_chat_family(s.tok.chat_template());
    if (!o.chat_family && !s.tok.chat_template().empty())
      fail(
          "{}: cannot tell the chat template family from tokenizer.chat_template; name one with "
          "--chat-template ({}) or ask without one (--no-chat)",
          s.path, fmt::join(chat_family_names(), ", "));
    if (o.chat_family) template_name = chat_family_name(*o.chat_family);
    o.plain = !o.chat_family;
  }
  const BatteryResult r = run_battery(s.engine, s.tok, qs, o);

  if (a.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const BatteryRow& row : r.rows)
      rows.push_back({{"q", row.question},
                      {"a", row.answers},
                      {"reply", row.reply},
                      {"generated_ids", row.generated},
                      {"ok", row.ok}});
    const nlohmann::json j = {{"model", s.path},           {"questions", path},
                              {"template", template_name}, {"rows", rows},
                              {"correct", r.correct},      {"total", r.total()}};
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  fmt::print("factual battery: {} questions from {}, {} (template: {})\n", r.total(), path, s.path,
             template_name);
  for (size_t i = 0; i < r.rows.size(); ++i) {
    const BatteryRow& row = r.rows[i];
    fmt::print("{:>2} {:<4}  {}\n           -> {}\n", i + 1, row.ok ? "ok" : "miss",
               printable(row.question, 120), printable(row.reply, 160));
  }
  fmt::print("score {}/{}\n", r.correct, r.total());
  return 0;
}

}  // namespace

Command add_battery(CLI::App& app) {
  auto* sub = app.add_subcommand("battery", "Ask the factual battery greedily and score it");
  auto a = std::make_shared<BatteryArgs>();
  add_model_options(sub, a->model);
  sub->add_option("--questions", a->questions,
                  "JSONL file of {\"q\": ..., \"a\": [...]} (default: tests/data/eval/"
                  "battery.jsonl)")
      ->check(CLI::ExistingFile);
  sub->add_option("-n,--max-tokens", a->max_new_tokens, "Most tokens of each reply")
      ->check(CLI::Range(1, 4096));
  auto* ct = sub->add_option("--chat-template", a->chat_template,
                             "chatml, llama3, gemma, llama2 or phi3 (default: the file's)");
  sub->add_flag("--no-chat", a->no_chat, "Ask as \"Question: ...\\nAnswer:\", without a template")
      ->excludes(ct);
  sub->add_flag("--json", a->json, "Print every row and the score as JSON");
  return {sub, [a] { return run(*a); }};
}

}  // namespace barata::cli
