// Small helpers shared by the tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace barata::test {

inline std::filesystem::path source_dir() {
  return BARATA_SOURCE_DIR;
}
// Committed test data: the tiny models, reference outputs, vectors.
inline std::filesystem::path data_dir() {
  return source_dir() / "tests" / "data";
}
// A committed tiny model of tests/data/models (stories260K, aidreams260K).
inline std::filesystem::path tiny_model(const std::string& file) {
  return data_dir() / "models" / file;
}
// A model fetched by a script into the git-ignored models/ folder
// (scripts/fetch-model.sh: SmolLM2, scripts/fetch-qwen2.sh: Qwen2.5-Coder).
inline std::filesystem::path model_path(const std::string& name) {
  return source_dir() / "models" / name;
}
// llama.cpp's vocabulary test sets, fetched by scripts/fetch-test-data.sh.
inline std::filesystem::path vocab_dir() {
  return source_dir() / "models" / "vocab";
}
// A vocabulary of vocab_dir(): "gpt-2" -> models/vocab/ggml-vocab-gpt-2.gguf.
inline std::filesystem::path vocab_path(const std::string& set) {
  return vocab_dir() / ("ggml-vocab-" + set + ".gguf");
}

// The script that puts `p` in place, for messages about an absent file.
inline std::string fetch_script_for(const std::filesystem::path& p) {
  const std::string s = p.string();
  if (s.find("SmolLM2") != std::string::npos) return "scripts/fetch-model.sh";
  if (s.find("Qwen2.5-Coder-1.5B") != std::string::npos) return "scripts/fetch-qwen2-1.5b.sh";
  if (s.find("Qwen2.5-Coder") != std::string::npos) return "scripts/fetch-qwen2.sh";
  if (p.filename().string().rfind("ggml-vocab-", 0) == 0) return "scripts/fetch-test-data.sh";
  return "git checkout (the file is committed)";
}

// True when BARATA_REQUIRE_DATA=1: absent fetched data fails a test instead
// of skipping it (scripts/test.sh sets it after fetching everything).
inline bool require_data() {
  const char* v = std::getenv("BARATA_REQUIRE_DATA");
  return v != nullptr && std::string(v) == "1";
}

// In a test body: skips the test when the fetched file `file_` is absent (or
// fails it under BARATA_REQUIRE_DATA=1), naming `script_`, which fetches it.
#define BARATA_NEED_FETCHED(file_, script_)                                     \
  do {                                                                          \
    const std::filesystem::path need_path_ = (file_);                           \
    if (!std::filesystem::exists(need_path_)) {                                 \
      if (::barata::test::require_data())                                       \
        FAIL() << need_path_.string() << " is absent: run " << (script_)        \
               << " (BARATA_REQUIRE_DATA=1 makes absent data a failure)";       \
      else                                                                      \
        GTEST_SKIP() << need_path_.string() << " is absent: run " << (script_); \
    }                                                                           \
  } while (0)

inline std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline TempDir::TempDir() {
  static int counter = 0;
  path_ = std::filesystem::temp_directory_path() /
          ("barata-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::create_directories(path_);
}

// Runs the barata binary through the shell with `args` (which may hold
// quoting and redirections such as "< file"); stdout and stderr apart.
struct CliResult {
  int status;  // exit status, -1 when killed by a signal
  std::string out, err;
};

// run_cli_within: with timeout_s > 0 the command is killed after that long (status 124), so
// a regression that hangs fails its test instead of stalling the suite.
inline CliResult run_cli_within(const std::string& args, int timeout_s) {
  TempDir dir;
  const std::string prefix =
      timeout_s > 0 ? "timeout -k 5 " + std::to_string(timeout_s) + " " : std::string();
  const std::string cmd = prefix + std::string(BARATA_CLI_PATH) + " " + args + " >" +
                          (dir / "out").string() + " 2>" + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  const auto out = read_bytes(dir / "out"), err = read_bytes(dir / "err");
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(out.begin(), out.end()),
          std::string(err.begin(), err.end())};
}

inline CliResult run_cli(const std::string& args) {
  return run_cli_within(args, 0);
}

}  // namespace barata::test
