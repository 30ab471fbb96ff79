// Each subcommand registers itself on the root app and returns its runner.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace barata::cli {

struct Command {
  CLI::App* sub;             // the parsed() flag says whether it was chosen
  std::function<int()> run;  // its exit status
};

Command add_agreement(CLI::App& app);
Command add_battery(CLI::App& app);
Command add_batch(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_chat(CLI::App& app);
Command add_eval_quant(CLI::App& app);
Command add_grammar(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_outliers(CLI::App& app);
Command add_perplexity(CLI::App& app);
Command add_plan(CLI::App& app);
Command add_quantize(CLI::App& app);
Command add_run(CLI::App& app);
Command add_serve(CLI::App& app);
Command add_spec_bench(CLI::App& app);
Command add_template(CLI::App& app);
Command add_tokenize(CLI::App& app);

}  // namespace barata::cli
