// barata template: a chat template rendered by barata's Jinja interpreter
// (src/jinja/), for checking it against Python's jinja2. The template is
// a file's (--file) or a model's tokenizer.chat_template (-m); the variables
// are a JSON object (--context FILE, default {}). --source prints the
// model's template instead.
#include <cstdio>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/gguf.h"
#include "barata/jinja.h"
#include "barata/tokenizer.h"
#include "commands.h"

namespace barata::cli {
namespace {

struct TemplateArgs {
  std::string file, model, context;
  bool source = false;
};

int run_template(const TemplateArgs& a) {
  std::string src;
  if (!a.model.empty()) {
    const GgufFile f = GgufFile::open(a.model);
    src = Tokenizer::from_gguf(f).chat_template();
    if (src.empty()) fail("{}: no tokenizer.chat_template", a.model);
  } else {
    src = read_regular_file(a.file, "template file");
  }
  if (a.source) {
    std::fwrite(src.data(), 1, src.size(), stdout);
    return 0;
  }
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (!a.context.empty()) {
    try {
      ctx = nlohmann::ordered_json::parse(read_regular_file(a.context, "context file"));
    } catch (const nlohmann::json::exception& e) {
      fail("--context {}: not JSON: {}", a.context, e.what());
    }
  }
  const jinja::Template t(src);
  const std::string out = t.render(ctx);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

Command add_template(CLI::App& app) {
  auto* sub = app.add_subcommand("template", "Render a chat template (Jinja) with JSON variables");
  auto a = std::make_shared<TemplateArgs>();
  auto* f = sub->add_option("--file", a->file, "A template file")->check(CLI::ExistingFile);
  auto* m = sub->add_option("-m,--model", a->model, "A GGUF file: its tokenizer.chat_template")
                ->check(CLI::ExistingFile);
  f->excludes(m);
  sub->add_option("--context", a->context, "A JSON object of variables (messages, tools, ...)")
      ->check(CLI::ExistingFile);
  sub->add_flag("--source", a->source, "Print the template itself");
  sub->callback([f, m] {
    if (f->count() == 0 && m->count() == 0) throw CLI::RequiredError("template: --file or -m");
  });
  return {sub, [a] { return run_template(*a); }};
}

}  // namespace barata::cli
