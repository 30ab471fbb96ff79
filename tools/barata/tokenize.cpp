// barata tokenize -m FILE [TEXT]: the token ids of a text under a GGUF file's
// tokenizer, as id/piece pairs or (--ids) one line of ids, then the count.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

#include <fmt/core.h>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/gguf.h"
#include "barata/tokenizer.h"
#include "commands.h"

namespace barata::cli {
namespace {

struct TokenizeArgs {
  std::string model, text, file;
  bool ids = false, no_bos = false, parse_special = false;
  CLI::Option* text_opt = nullptr;  // given at all (an empty TEXT is a text)
};

std::string printable_piece(const std::string& s) {
  return printable(s, std::string::npos);
}

int tokenize(const TokenizeArgs& a) {
  const GgufFile f = GgufFile::open(a.model);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  std::string text;
  if (!a.file.empty()) {
    text = read_regular_file(a.file, "text file");
  } else if (a.text_opt->count() > 0) {
    text = a.text;
  } else {
    text = read_stream_bounded(stdin, "standard input");
  }
  const bool add_bos = tok.add_bos_default() && !a.no_bos;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.encode(text, add_bos, a.parse_special);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (a.ids) {
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    fmt::print("{}\n", line);
    std::fflush(stdout);
    fmt::print(stderr, "{} tokens ({} bytes encoded in {:.3f} ms)\n", ids.size(), text.size(), ms);
  } else {
    for (int32_t id : ids)
      fmt::print("{:>6} -> '{}'\n", id, printable_piece(tok.token_to_piece(id)));
    fmt::print("{} tokens\n", ids.size());
  }
  return 0;
}

}  // namespace

Command add_tokenize(CLI::App& app) {
  auto* sub = app.add_subcommand("tokenize", "Show the token ids of a text under a GGUF tokenizer");
  auto a = std::make_shared<TokenizeArgs>();
  sub->add_option("-m,--model", a->model, "GGUF file with a tokenizer")
      ->required()
      ->check(CLI::ExistingFile);
  a->text_opt =
      sub->add_option("text", a->text, "Text to tokenize (else -f FILE, else standard input)");
  sub->add_option("-f,--file", a->file, "Read the text from FILE (bytes as they are)")
      ->check(CLI::ExistingFile)
      ->excludes(a->text_opt);
  sub->add_flag("--ids", a->ids, "Print the ids on one line (the count goes to stderr)");
  sub->add_flag("--no-bos", a->no_bos, "Do not add BOS even if the vocabulary asks for it");
  sub->add_flag("--parse-special", a->parse_special,
                "Recognise control tokens such as <|im_start|> inside the text");
  return {sub, [a]() { return tokenize(*a); }};
}

}  // namespace barata::cli
