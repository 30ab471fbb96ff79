// barata grammar: what a --grammar-file or --json-schema compiles to. Prints
// the GBNF (a schema's conversion, or the file itself once it parses) and,
// with --check, whether each given text is a sentence of the grammar.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/grammar.h"
#include "commands.h"

namespace barata::cli {
namespace {

struct GrammarArgs {
  std::string grammar_file, json_schema;
  std::vector<std::string> check;
};

int run_grammar(const GrammarArgs& a) {
  std::string gbnf;
  if (!a.json_schema.empty()) {
    gbnf =
        json_schema_to_gbnf(std::string_view(read_regular_file(a.json_schema, "JSON schema file")));
  } else {
    gbnf = read_regular_file(a.grammar_file, "grammar file");
  }
  if (a.check.empty()) {
    // Printed before it is checked, so that a conversion's error can be read in it.
    std::fwrite(gbnf.data(), 1, gbnf.size(), stdout);
    std::fflush(stdout);
    Grammar::parse(gbnf);
    return 0;
  }
  const GrammarIndex ix(Grammar::parse(gbnf), nullptr);
  int bad = 0;
  for (const std::string& t : a.check) {
    const bool ok = ix.matches(t);
    fmt::print("{}\t{}\n", ok ? "accepted" : "refused", t);
    bad += ok ? 0 : 1;
  }
  return bad ? 1 : 0;
}

}  // namespace

Command add_grammar(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "grammar", "Print the GBNF of a JSON schema or grammar file, or check texts against it");
  auto a = std::make_shared<GrammarArgs>();
  auto* f = sub->add_option("--grammar-file", a->grammar_file, "A GBNF grammar")
                ->check(CLI::ExistingFile);
  auto* j = sub->add_option("--json-schema", a->json_schema, "A JSON Schema file")
                ->check(CLI::ExistingFile);
  f->excludes(j);
  sub->add_option(
      "--check", a->check,
      "Texts to judge: each is printed as accepted or refused (exit 1 if any is refused)");
  sub->callback([sub, f, j] {
    if (f->count() == 0 && j->count() == 0)
      throw CLI::RequiredError("grammar: one of --grammar-file or --json-schema");
    (void)sub;
  });
  return {sub, [a] { return run_grammar(*a); }};
}

}  // namespace barata::cli
