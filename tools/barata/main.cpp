// barata: command-line entry. Parses flags with CLI11, runs one subcommand,
// and turns any barata::Error into one "error: ..." line and exit status 1.
#include <cstdio>
#include <exception>
#include <vector>

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include "barata/error.h"
#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"barata: inference for decoder-only transformers from GGUF files"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "barata 0.1.0");
  int verbosity = 0;
  app.add_flag("-v,--verbose", verbosity, "More log output (repeat for more)");

  const std::vector<barata::cli::Command> commands = {
      barata::cli::add_bench(app), barata::cli::add_inspect(app),  barata::cli::add_quantize(app),
      barata::cli::add_run(app),   barata::cli::add_tokenize(app),
  };

  try {
    app.parse(argc, argv);
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
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: internal: {}\n", e.what());
    return 2;
  }
  return 0;
}
