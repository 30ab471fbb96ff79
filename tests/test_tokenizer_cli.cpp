// `barata tokenize` end to end: output formats, text sources, errors. The
// vocabularies come from scripts/fetch-test-data.sh (models/vocab).
#include <gtest/gtest.h>

#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;

struct Result {
  int status;
  std::string out;  // stdout, or stdout then stderr
};

Result run(const std::string& args, bool with_stderr = false) {
  const test::CliResult r = test::run_cli(args);
  return {r.status, with_stderr ? r.out + r.err : r.out};
}

fs::path gpt2() {
  return test::vocab_path("gpt-2");
}

TEST(TokenizerCli, IdsAndPairs) {
  BARATA_NEED_FETCHED(gpt2(), "scripts/fetch-test-data.sh");
  const std::string m = "-m " + gpt2().string();
  // "Hello world" -> 15496 995 in ggml-vocab-gpt-2.gguf.out.
  EXPECT_EQ(run("tokenize " + m + " --ids 'Hello world'").out, "15496 995\n");
  const Result pairs = run("tokenize " + m + " 'Hello world'");
  EXPECT_EQ(pairs.status, 0);
  EXPECT_EQ(pairs.out, " 15496 -> 'Hello'\n   995 -> ' world'\n2 tokens\n");
  const Result counted = run("tokenize " + m + " --ids 'Hello world'", true);
  EXPECT_NE(counted.out.find("2 tokens"), std::string::npos) << counted.out;
}

TEST(TokenizerCli, FileStdinAndEscapedPieces) {
  BARATA_NEED_FETCHED(gpt2(), "scripts/fetch-test-data.sh");
  const std::string m = "-m " + gpt2().string();
  test::TempDir dir;
  const std::string text = "line\n\tnext";
  test::write_bytes(dir / "t.txt", std::vector<uint8_t>(text.begin(), text.end()));
  const Result from_file = run("tokenize " + m + " --ids -f " + (dir / "t.txt").string());
  const Result from_stdin = run("tokenize " + m + " --ids < " + (dir / "t.txt").string());
  EXPECT_EQ(from_file.status, 0);
  EXPECT_FALSE(from_file.out.empty());
  EXPECT_EQ(from_file.out, from_stdin.out);
  // Pieces are shown on one line with control characters escaped.
  const Result pairs = run("tokenize " + m + " -f " + (dir / "t.txt").string());
  EXPECT_NE(pairs.out.find("'\\n'"), std::string::npos) << pairs.out;
  EXPECT_EQ(run("tokenize " + m + " ''").out, "0 tokens\n");
}

TEST(TokenizerCli, BosAndSpecialFlags) {
  const fs::path spm = test::vocab_path("llama-spm");
  BARATA_NEED_FETCHED(spm, "scripts/fetch-test-data.sh");
  const std::string m = "-m " + spm.string();
  // "Hello world" -> 15043 3186 in ggml-vocab-llama-spm.gguf.out; BOS is 1.
  EXPECT_EQ(run("tokenize " + m + " --ids 'Hello world'").out, "1 15043 3186\n");
  EXPECT_EQ(run("tokenize " + m + " --ids --no-bos 'Hello world'").out, "15043 3186\n");
  EXPECT_EQ(run("tokenize " + m + " --ids --no-bos --parse-special '</s>'").out, "2\n");
  EXPECT_NE(run("tokenize " + m + " --ids --no-bos '</s>'").out, "2\n");
}

TEST(TokenizerCli, ErrorsAreOneLineAndNonZero) {
  const Result not_gguf =
      run("tokenize -m " + (test::source_dir() / "README.md").string() + " x", true);
  EXPECT_EQ(not_gguf.status, 1);
  EXPECT_EQ(not_gguf.out.rfind("error: ", 0), 0u) << not_gguf.out;
  EXPECT_NE(run("tokenize x", true).status, 0);  // -m is required
}

}  // namespace
}  // namespace barata
