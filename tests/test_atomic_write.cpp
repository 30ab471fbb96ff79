// Files the CLI writes are whole or absent: AtomicFile's named fallback
// (forced with BARATA_NO_O_TMPFILE=1) removes its temporary on SIGTERM, SIGINT
// and SIGHUP, the next write sweeps what a SIGKILL left, and `bench --plot`
// leaves no partial SVG when the write fails. Plus bench's memory limits.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "barata/atomic_file.h"
#include "barata/error.h"
#include "barata/gguf.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_text(const fs::path& p) {
  const auto b = test::read_bytes(p);
  return {b.begin(), b.end()};
}

// Sets an environment variable for the scope of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// A pid that was alive a moment ago and is not any more.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return pid;
}

TEST(AtomicFile, WritesWholeFilesOnBothPaths) {
  test::TempDir dir;
  write_file_atomically(dir / "a.txt", "first");
  EXPECT_EQ(read_text(dir / "a.txt"), "first");
  {
    ScopedEnv env("BARATA_NO_O_TMPFILE", "1");
    write_file_atomically(dir / "a.txt", "second, through a named temporary");
  }
  EXPECT_EQ(read_text(dir / "a.txt"), "second, through a named temporary");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"a.txt"});
}

TEST(AtomicFile, NamedTemporaryIsVisibleWhileWritingAndGoneOnError) {
  test::TempDir dir;
  ScopedEnv env("BARATA_NO_O_TMPFILE", "1");
  {
    AtomicFile f(dir / "out.bin");
    f.write("abc", 3);
    const auto names = names_in(dir.path());
    ASSERT_EQ(names.size(), 1u);
    EXPECT_TRUE(is_temp_name_of(dir / "out.bin", names[0])) << names[0];
    EXPECT_EQ(names[0].rfind(".out.bin.tmp-" + std::to_string(::getpid()) + "-", 0), 0u)
        << names[0];
    // Destroyed without commit(): an error on the way.
  }
  EXPECT_TRUE(names_in(dir.path()).empty());
}

// An output that is a FIFO or a device is refused, not replaced by a
// regular file (as root, a rename over /dev/null would succeed).
TEST(AtomicFile, RefusesToReplaceSpecialFiles) {
  test::TempDir dir;
  const auto fifo = dir / "out.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THROW(write_file_atomically(fifo, "x"), Error);
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_THROW(write_file_atomically(dir.path(), "x"), Error);
  const auto r = test::run_cli("quantize " + test::tiny_model("stories260K.gguf").string() + " " +
                               fifo.string() + " --type q8_0");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("is a FIFO; barata replaces only regular files"), std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::is_fifo(fifo));
}

TEST(AtomicFile, TempNamePattern) {
  const fs::path out = "dir/model.gguf";
  EXPECT_TRUE(is_temp_name_of(out, ".model.gguf.tmp-1234-abcDEF"));
  EXPECT_FALSE(is_temp_name_of(out, ".model.gguf.tmp-abcDEF"));  // no pid
  EXPECT_FALSE(is_temp_name_of(out, ".model.gguf.tmp-12x4-abcDEF"));
  EXPECT_FALSE(is_temp_name_of(out, ".other.gguf.tmp-1234-abcDEF"));
  EXPECT_FALSE(is_temp_name_of(out, ".model.gguf.tmp-1234-abcDEFG"));
  EXPECT_FALSE(is_temp_name_of(out, "model.gguf"));
}

// The next write of the same destination sweeps temporaries of dead writers,
// and of live pids that hold no lock (a reused pid), but not a locked one nor
// files of other names.
TEST(AtomicFile, NextWriteSweepsStaleTemporaries) {
  test::TempDir dir;
  const fs::path out = dir / "m.gguf";
  const std::string dead = ".m.gguf.tmp-" + std::to_string(dead_pid()) + "-aaaaaa";
  const std::string reused = ".m.gguf.tmp-" + std::to_string(::getpid()) + "-bbbbbb";
  const std::string locked = ".m.gguf.tmp-" + std::to_string(::getppid()) + "-cccccc";
  for (const auto& n :
       {dead, reused, locked, std::string(".other.gguf.tmp-1-dddddd"), std::string("keep.txt")})
    test::write_bytes(dir / n, {1, 2, 3});
  const int lock_fd = ::open((dir / locked).c_str(), O_RDONLY);
  ASSERT_GE(lock_fd, 0);
  // A lock held by another process (a live writer): flock locks of one open
  // file description, so a child holds it.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    ::flock(lock_fd, LOCK_EX);
    char c = 1;
    (void)::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);

  write_file_atomically(out, "new");

  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  ::close(lock_fd);
  ::close(ready[0]);
  ::close(ready[1]);
  std::vector<std::string> want = {".other.gguf.tmp-1-dddddd", locked, "keep.txt", "m.gguf"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names_in(dir.path()), want);
  EXPECT_EQ(read_text(out), "new");
}

// ---- barata quantize killed while writing through the named fallback ----------

fs::path smollm2() {
  return test::source_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Starts `barata quantize MODEL OUT --type q8_0` with BARATA_NO_O_TMPFILE=1
// and the terminating signals at their default action.
pid_t start_quantize(const fs::path& model, const fs::path& out) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (int s : {SIGTERM, SIGINT, SIGHUP}) ::signal(s, SIG_DFL);
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::setenv("BARATA_NO_O_TMPFILE", "1", 1);
    ::execl(BARATA_CLI_PATH, BARATA_CLI_PATH, "quantize", model.c_str(), out.c_str(), "--type",
            "q8_0", "-t", "2", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Waits until the temporary of `out` appears; false when the process ended first.
bool wait_for_temp(pid_t pid, const fs::path& out) {
  for (int i = 0; i < 60000; ++i) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(out.parent_path(), ec))
      if (is_temp_name_of(out, e.path().filename().string())) return true;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

class QuantizeSignal : public ::testing::TestWithParam<int> {};

TEST_P(QuantizeSignal, LeavesNothingBehind) {
  if (!fs::exists(smollm2())) GTEST_SKIP() << smollm2() << " is absent: run scripts/fetch-model.sh";
  const int sig = GetParam();
  test::TempDir dir;
  const fs::path out = dir / "out.gguf";
  const pid_t pid = start_quantize(smollm2(), out);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_temp(pid, out)) << "never saw the temporary";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(pid, sig);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "finished before the signal (status " << status << ")";
  EXPECT_EQ(WTERMSIG(status), sig);  // the default action, re-raised
  EXPECT_TRUE(names_in(dir.path()).empty()) << names_in(dir.path())[0];
}

std::string signal_name(const ::testing::TestParamInfo<int>& info) {
  return info.param == SIGTERM ? "SIGTERM" : info.param == SIGINT ? "SIGINT" : "SIGHUP";
}
INSTANTIATE_TEST_SUITE_P(TermIntHup, QuantizeSignal, ::testing::Values(SIGTERM, SIGINT, SIGHUP),
                         signal_name);

TEST(QuantizeSignal, SigkillLeavesATemporaryTheNextRunSweeps) {
  if (!fs::exists(smollm2())) GTEST_SKIP() << smollm2() << " is absent: run scripts/fetch-model.sh";
  test::TempDir dir;
  const fs::path out = dir / "out.gguf";
  const pid_t pid = start_quantize(smollm2(), out);
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(wait_for_temp(pid, out)) << "never saw the temporary";
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  const auto left = names_in(dir.path());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_TRUE(is_temp_name_of(out, left[0])) << left[0];

  // The next write of the same output, from a small file, sweeps it (an
  // architecture barata does not run, so no model checks apply).
  GgufWriter w;
  w.set("general.architecture", "not-a-model");
  std::vector<uint8_t> zeros(32 * 4 * 4, 0);
  w.add_tensor("t.weight", DType::F32, {32, 4}, std::move(zeros));
  w.write(dir / "small.gguf");
  const auto r = test::run_cli("quantize " + (dir / "small.gguf").string() + " " + out.string() +
                               " --type q8_0 2>&1");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"out.gguf", "small.gguf"}));
  EXPECT_NO_THROW(GgufFile::open(out));
}

// ---- bench: charts whole or absent; memory asked for up front ---------------------

fs::path stories() {
  return test::source_dir() / "tests" / "data" / "models" / "stories260K.gguf";
}

const char* const kTinyBench =
    " -t 1 -r 1 --tests prefill,decode,batch -p 8 -c 8 -b 1,2 --batch-cached 8 --decode-steps 1";

// A failing write (here: the file size limit, as a full disk would) leaves no
// SVG and no temporary in the plot directory, and is one error line.
TEST(BenchPlot, FailedChartWriteLeavesNoPartialFile) {
  ASSERT_TRUE(fs::exists(stories())) << stories();
  for (const char* no_tmpfile : {"0", "1"}) {
    SCOPED_TRACE(std::string("BARATA_NO_O_TMPFILE=") + no_tmpfile);
    test::TempDir dir;
    const fs::path plots = dir / "plots", failed = dir / "failed";
    fs::create_directories(failed);
    // A file size limit of one block: every chart (several kB) fails part-way;
    // SIGXFSZ ignored, so that write() reports EFBIG as a full disk reports ENOSPC.
    const std::string cmd =
        "trap '' XFSZ; ulimit -f 1; BARATA_NO_O_TMPFILE=" + std::string(no_tmpfile) + " exec " +
        BARATA_CLI_PATH + " bench -m " + stories().string() + kTinyBench + " --plot " +
        failed.string() + " >/dev/null 2>" + (dir / "err").string();
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 1);
    const std::string err = read_text(dir / "err");
    EXPECT_NE(err.find("error: "), std::string::npos) << err;  // after the progress lines
    EXPECT_NE(err.find("write failed"), std::string::npos) << err;
    EXPECT_EQ(err.find("internal"), std::string::npos) << err;
    EXPECT_TRUE(names_in(failed).empty()) << names_in(failed)[0];

    // Without the limit the same run writes whole charts.
    ScopedEnv env("BARATA_NO_O_TMPFILE", no_tmpfile);
    const auto ok =
        test::run_cli("bench -m " + stories().string() + kTinyBench + " --plot " + plots.string());
    ASSERT_EQ(ok.status, 0) << ok.err;
    EXPECT_FALSE(names_in(plots).empty());
    for (const auto& n : names_in(plots)) {
      EXPECT_EQ(fs::path(n).extension(), ".svg") << n;
      const std::string svg = read_text(plots / n);
      EXPECT_NE(svg.find("</svg>"), std::string::npos) << n;
    }
  }
}

TEST(BenchMemory, HugeBuffersAreRefusedBeforeAllocating) {
  ASSERT_TRUE(fs::exists(stories())) << stories();
  struct Case {
    std::string flags, expect;
  };
  for (const Case& c :
       std::vector<Case>{{"--bw-mib 1048576", "--bw-mib 1048576: the bandwidth probe's buffer"},
                         {"--ctx-size 16777216 --tests batch -b 4096 --batch-cached 16000000",
                          "--ctx-size 16777216"}}) {
    const auto r = test::run_cli("bench -m " + stories().string() + " -t 1 -r 1 " + c.flags);
    EXPECT_EQ(r.status, 1) << c.flags << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("of memory"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << c.flags;
  }
}

}  // namespace
}  // namespace barata
