// barata: command-line entry. Parses flags with CLI11, runs one subcommand,
// and turns any barata::Error into one "error: ..." line and exit status 1.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include <fmt/core.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "barata/error.h"
#include "barata/file_io.h"
#include "commands.h"

namespace {

// One error line, whatever the message holds: a newline or ESC from a file's
// bytes cannot start a second "error:" line or move the terminal's cursor.
void print_error(const char* prefix, const char* what) {
  std::fflush(stdout);
  fmt::print(stderr, "error: {}{}\n", prefix, barata::printable(what, 4000));
}

}  // namespace

int main(int argc, char** argv) {
  // Logs go to stderr, always: stdout carries only a command's output (JSON,
  // ids, generated text).
  spdlog::set_default_logger(spdlog::stderr_color_mt("barata"));
  CLI::App app{"barata: inference for decoder-only transformers from GGUF files"};
  app.require_subcommand(1);
  // Usage errors look like every other error: one "error: ..." line (then a
  // hint), so a script can grep one prefix.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "error: " + barata::printable(e.what(), 4000) +
           "\nRun with --help for more information.\n";
  });
  app.set_version_flag("--version", "barata 0.1.0");
  int verbosity = 0;
  app.add_flag("-v,--verbose", verbosity, "More log output (repeat for more)");

  const std::vector<barata::cli::Command> commands = {
      barata::cli::add_agreement(app),  barata::cli::add_batch(app),
      barata::cli::add_battery(app),    barata::cli::add_bench(app),
      barata::cli::add_chat(app),       barata::cli::add_eval_quant(app),
      barata::cli::add_grammar(app),    barata::cli::add_inspect(app),
      barata::cli::add_outliers(app),   barata::cli::add_perplexity(app),
      barata::cli::add_plan(app),       barata::cli::add_quantize(app),
      barata::cli::add_run(app),        barata::cli::add_serve(app),
      barata::cli::add_spec_bench(app), barata::cli::add_template(app),
      barata::cli::add_tokenize(app),
  };

  // A first argument that is no option and no subcommand: name it and list
  // the real ones (CLI11 alone says only "A subcommand is required").
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const auto& c : commands) {
      names += (names.empty() ? "" : ", ") + c.sub->get_name();
      known = known || c.sub->get_name() == argv[1];
    }
    if (!known) {
      fmt::print(stderr, "error: unknown subcommand '{}'; the subcommands are: {} (see --help)\n",
                 barata::printable(argv[1]), names);
      return static_cast<int>(CLI::ExitCodes::RequiredError);  // what CLI11 returns here
    }
  }
  // llama.cpp's two-letter short flags, which CLI11 cannot name: -ctk and
  // -ctv (also -ctk=q8_0) are read as --cache-type-k / --cache-type-v.
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    for (const auto& [s, l] : {std::pair<std::string, std::string>{"-ctk", "--cache-type-k"},
                               {"-ctv", "--cache-type-v"}})
      if (a == s || a.rfind(s + "=", 0) == 0) a = l + a.substr(s.size());
    args.push_back(std::move(a));
  }
  std::reverse(args.begin(), args.end());  // CLI11's vector form takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_level(verbosity >= 2   ? spdlog::level::trace
                    : verbosity == 1 ? spdlog::level::debug
                                     : spdlog::level::warn);
  try {
    for (const auto& c : commands)
      if (c.sub->parsed()) return c.run();
  } catch (const barata::Error& e) {
    print_error("", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    print_error("", "out of memory (a size asked of barata is beyond this machine)");
    return 1;
  } catch (const std::exception& e) {
    print_error("internal: ", e.what());
    return 2;
  }
  return 0;
}
