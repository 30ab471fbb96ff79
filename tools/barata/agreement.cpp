// barata agreement: teacher-forced top-1 agreement of a candidate model with
// a base model (include/barata/agreement.h), per prompt and overall.
#include <cstdio>
#include <memory>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/agreement.h"
#include "barata/battery.h"
#include "barata/chat_template.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "commands.h"
#include "session.h"

namespace barata::cli {
namespace {

struct AgreementArgs {
  ModelOptions model;  // the candidate, and -c / -t / --device for both
  std::string base, prompts_file, chat_template, chat_template_file;
  int n_gen = 9;
  bool chat = false, json = false;
};

// One prompt a line (blank lines skipped), or the battery's questions.
std::vector<std::string> prompt_texts(const AgreementArgs& a) {
  std::vector<std::string> out;
  if (a.prompts_file.empty()) {
    for (const BatteryQuestion& q : load_battery(default_battery_path())) out.push_back(q.q);
    return out;
  }
  const std::string text = read_regular_file(a.prompts_file, "prompts file");
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) out.push_back(line);
  }
  if (out.empty()) fail("{}: no prompts (one a line)", a.prompts_file);
  return out;
}

int run(const AgreementArgs& a) {
  const std::vector<std::string> texts = prompt_texts(a);
  ModelOptions bo = a.model;
  bo.model = a.base;
  Session base(session_options(bo));
  Session cand(session_options(a.model));
  check_same_vocabulary(base.model, cand.model);

  std::vector<std::vector<int32_t>> prompts;
  const auto format =
      a.chat ? choose_chat_format(a.chat_template, a.chat_template_file, base) : nullptr;
  for (const std::string& t : texts) {
    std::string text = t;
    bool special = false;
    if (format) {
      std::vector<ChatMessage> msgs;
      const std::string system = system_prompt_or_default("", *format);
      if (!system.empty()) msgs.push_back({"system", system});
      msgs.push_back({"user", t});
      text = format->apply(msgs, true);
      special = true;
    }
    prompts.push_back(base.tok.encode(text, base.tok.add_bos_default(), special));
  }
  const std::vector<GreedyTrace> traces = greedy_traces(base.engine, prompts, a.n_gen);
  const AgreementResult r = teacher_forced_agreement(cand.engine, traces);

  if (a.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < traces.size(); ++i)
      rows.push_back({{"prompt", texts[i]},
                      {"prompt_ids", traces[i].prompt},
                      {"generated_ids", traces[i].generated},
                      {"matches", r.per_prompt[i].matches},
                      {"n", r.per_prompt[i].n},
                      {"agreement", r.per_prompt[i].rate()}});
    const nlohmann::json j = {{"base", base.path}, {"candidate", cand.path}, {"n_gen", a.n_gen},
                              {"chat", a.chat},    {"prompts", rows},        {"matches", r.matches},
                              {"n", r.n},          {"agreement", r.rate()}};
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  fmt::print("teacher-forced agreement of {} with {} ({} greedy tokens per prompt{})\n", cand.path,
             base.path, a.n_gen, a.chat ? ", chat template" : "");
  for (size_t i = 0; i < traces.size(); ++i)
    fmt::print("{:>3}/{:<3} {:6.1f}%  {}\n", r.per_prompt[i].matches, r.per_prompt[i].n,
               100.0 * r.per_prompt[i].rate(), printable(texts[i], 100));
  fmt::print("overall {}/{} = {:.2f}%\n", r.matches, r.n, 100.0 * r.rate());
  return 0;
}

}  // namespace

Command add_agreement(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "agreement", "Teacher-forced top-1 agreement of a model (-m) with a base model (--base)");
  auto a = std::make_shared<AgreementArgs>();
  sub->add_option("--base", a->base, "GGUF file of the base model, which generates")
      ->required()
      ->check(CLI::ExistingFile);
  add_model_options(sub, a->model);
  sub->add_option("-n,--n-gen", a->n_gen, "Greedy tokens per prompt (observations)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--prompts", a->prompts_file,
                  "Prompts, one a line (default: the questions of the factual battery)")
      ->check(CLI::ExistingFile);
  sub->add_flag("--chat", a->chat, "Wrap each prompt in the base model's chat template");
  add_chat_template_options(sub, a->chat_template, a->chat_template_file);
  sub->add_flag("--json", a->json, "Print the traces and the agreement as JSON");
  sub->callback([a] {
    if (!a->chat_template.empty() || !a->chat_template_file.empty()) a->chat = true;
  });
  return {sub, [a] { return run(*a); }};
}

}  // namespace barata::cli
