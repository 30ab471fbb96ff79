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

std::string read_all(std::istream& in) {
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A piece made printable on one line: valid UTF-8 as is, \n \r \t and other
// control bytes escaped, bytes that are not part of a valid character as \xNN.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    if (c >= 0x20 && c < 0x7F) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xF4) {
      len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
      for (size_t k = 1; k < len; ++k)
        if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) len = 0;
    }
    if (len > 0) {
      out.append(s, i, len);
      i += len;
      continue;
    }
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else
      out += fmt::format("\\x{:02x}", c);
    ++i;
  }
  return out;
}

int tokenize(const TokenizeArgs& a) {
  const GgufFile f = GgufFile::open(a.model);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  std::string text;
  if (!a.file.empty()) {
    std::ifstream in(a.file, std::ios::binary);
    if (!in) fail("{}: cannot read the text file", a.file);
    text = read_all(in);
  } else if (a.text_opt->count() > 0) {
    text = a.text;
  } else {
    text = read_all(std::cin);
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
    for (int32_t id : ids) fmt::print("{:>6} -> '{}'\n", id, printable(tok.token_to_piece(id)));
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
