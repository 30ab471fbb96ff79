// CLI-level hostile input that belongs to no one subcommand: an unknown
// subcommand, a model that is a FIFO or a device, an absurd context size.
// Each is one error line (or a quick success), never a hang.
#include <chrono>
#include <string>

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "barata/gguf.h"
#include "test_util.h"

namespace barata {
namespace {

int count_lines(const std::string& s, const std::string& prefix) {
  int n = 0;
  for (size_t p = 0; p < s.size();) {
    const size_t e = s.find('\n', p);
    if (s.compare(p, prefix.size(), prefix) == 0) ++n;
    if (e == std::string::npos) break;
    p = e + 1;
  }
  return n;
}

TEST(CliHostile, UnknownSubcommandIsNamedWithTheRealOnes) {
  const auto r = test::run_cli("frobnicate -m x.gguf");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("unknown subcommand 'frobnicate'"), std::string::npos) << r.err;
  for (const char* sub : {"bench", "inspect", "quantize", "run", "tokenize"})
    EXPECT_NE(r.err.find(sub), std::string::npos) << sub << " is not listed: " << r.err;
  EXPECT_EQ(count_lines(r.err, "error:"), 1) << r.err;
}

TEST(CliHostile, SpecialFilesAsTheModelAreRefusedAtOnce) {
  test::TempDir dir;
  const auto fifo = dir / "model.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& model : {fifo.string(), std::string("/dev/zero"), dir.path().string()}) {
    SCOPED_TRACE(model);
    for (const std::string& cmd : {"inspect " + model, "run -m " + model + " -p hi -n 1",
                                   "tokenize -m " + model + " hi", "bench -m " + model}) {
      // timeout: a regression (a blocking open) fails instead of hanging the suite
      const auto r = test::run_cli_within(cmd + " </dev/null", 30);
      EXPECT_NE(r.status, 124) << cmd << " hung";
      EXPECT_NE(r.status, 0) << cmd;
      EXPECT_EQ(r.err.find("internal"), std::string::npos) << r.err;
      EXPECT_EQ(count_lines(r.err, "error:"), 1) << cmd << ": " << r.err;
    }
  }
}

// barata serve with a file it cannot run fails before it listens (a client
// never sees a server that will never be ready).
TEST(CliHostile, ServeRefusesAnUnsupportedModelBeforeListening) {
  test::TempDir dir;
  const auto path = dir / "mamba.gguf";
  GgufWriter w;
  w.set("general.architecture", std::string("mamba"));
  w.write(path);
  const auto r = test::run_cli_within("serve --port 0 -m " + path.string(), 30);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(r.out.find("listening"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("mamba"), std::string::npos) << r.err;
  EXPECT_EQ(count_lines(r.err, "error:"), 1) << r.err;
}

// The RoPE tables and the KV cache grow with the positions used, not with -c.
TEST(CliHostile, HugeContextCostsNothingUpFront) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = test::run_cli_within("run -m " + test::tiny_model("stories260K.gguf").string() +
                                          " -p hello -n 4 --temp 0 -c 16777216",
                                      60);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_LT(s, 10.0);
}

}  // namespace
}  // namespace barata
