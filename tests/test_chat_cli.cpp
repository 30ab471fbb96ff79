// `barata chat` end to end on SmolLM2: a scripted conversation in a
// pseudo-terminal (libedit active), Ctrl-C during a reply and at the prompt,
// /save /reset /load, the KV cache reused across turns (only a turn's new
// tokens prefilled, and the cache equal to a full re-render), the context
// limit, and the same through piped stdin.
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <termios.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/chat_template.h"
#include "barata/gguf.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path smollm2() {
  return test::source_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

bool data_required() {
  const char* v = std::getenv("BARATA_REQUIRE_DATA");
  return v != nullptr && std::string(v) == "1";
}

#define REQUIRE_SMOLLM2()                                                             \
  do {                                                                                \
    if (!fs::exists(smollm2())) {                                                     \
      if (data_required())                                                            \
        FAIL() << smollm2().string() << " is absent: run scripts/fetch-model.sh";     \
      GTEST_SKIP() << smollm2().string() << " is absent: run scripts/fetch-model.sh"; \
    }                                                                                 \
  } while (0)

// One "[prefill N tokens (R reused from the cache) ... | context U/C...]" line.
struct TurnStats {
  int prefill = 0, reused = 0, reply = 0, context = 0;
  bool interrupted = false;
};

std::vector<TurnStats> parse_stats(const std::string& text) {
  static const std::regex re(
      R"(\[prefill (\d+) tokens \((\d+) reused from the cache\) in [0-9.]+ ms \| reply (\d+) )"
      R"(tokens, [0-9.]+ ms/token \| context (\d+)/\d+( \| interrupted)?)");
  std::vector<TurnStats> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    const std::smatch& m = *it;
    out.push_back(
        {std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4]), m[5].matched});
  }
  return out;
}

size_t count(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// The chat binary on a pseudo-terminal: what it writes (stdout and stderr
// both) accumulates in out(); send() types.
class PtyChat {
 public:
  explicit PtyChat(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {BARATA_CLI_PATH, "chat"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_ = ::forkpty(&fd_, nullptr, nullptr, nullptr);
    if (pid_ == 0) {
      ::setenv("TERM", "dumb", 1);
      ::setenv("HOME", "/nonexistent", 1);  // no ~/.editrc
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
  }
  ~PtyChat() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  bool started() const { return pid_ > 0 && fd_ >= 0; }
  const std::string& out() const { return out_; }

  void send(const std::string& s) {
    ASSERT_EQ(::write(fd_, s.data(), s.size()), (ssize_t)s.size());
  }

  // Reads until `done(out())` or the deadline; false on timeout or EOF first.
  template <typename Pred>
  bool wait_until(Pred done, int seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (!done(out_)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 200))) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return done(out_);
      out_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  // Waits for the prompt and for libedit to have put the terminal in its
  // editing mode (ICANON off), which can come just after the prompt shows:
  // a line typed before that is read (and echoed) by the terminal itself.
  bool wait_prompt(int seconds) {
    if (!wait_until([](const std::string& o) { return o.ends_with("> "); }, seconds)) return false;
    for (int i = 0; i < seconds * 100; ++i) {
      termios t{};
      if (::tcgetattr(fd_, &t) == 0 && (t.c_lflag & ICANON) == 0) return true;
      ::usleep(10000);
    }
    return false;
  }
  // Waits for the k-th turn's stats line and the prompt after it.
  bool wait_turns(size_t k, int seconds) {
    return wait_until([k](const std::string& o) { return parse_stats(o).size() >= k; }, seconds) &&
           wait_prompt(seconds);
  }
  bool wait_text(const std::string& s, int seconds) {
    return wait_until([&](const std::string& o) { return o.find(s) != std::string::npos; },
                      seconds);
  }
  // Exit status after the program ends by itself, -1 on timeout or a signal.
  int wait_exit(int seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < end) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      pollfd p{fd_, POLLIN, 0};
      char buf[4096];
      ssize_t n = 0;
      if (::poll(&p, 1, 100) > 0 && (n = ::read(fd_, buf, sizeof buf)) > 0)
        out_.append(buf, static_cast<size_t>(n));
      else
        ::usleep(20000);  // the terminal hung up: the process is on its way out
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool exited_ = false;
  std::string out_;
};

// The reply printed after the echoed user line `typed`, searching from `from`:
// the text up to the turn's stats line, carriage returns removed.
std::string reply_after(const std::string& out, const std::string& typed, size_t from = 0) {
  const size_t a = out.find(typed + "\r\n", from);
  if (a == std::string::npos) return "";
  const size_t b = out.find("[prefill ", a);
  std::string r =
      out.substr(a + typed.size() + 2, b == std::string::npos ? 0 : b - a - typed.size() - 2);
  std::erase(r, '\r');
  while (!r.empty() && (r.back() == '\n' || r.back() == ' ')) r.pop_back();
  return r;
}

// Token count of the conversation rendered through SmolLM2's template, as a
// full re-render from scratch would prefill it.
size_t rendered_tokens(const std::vector<ChatMessage>& msgs, bool generation_prompt) {
  const GgufFile f = GgufFile::open(smollm2());
  const Tokenizer tok = Tokenizer::from_gguf(f);
  // The file's own template, as barata chat renders it.
  return tok
      .encode(ChatFormatter::for_tokenizer(tok, nullptr)->apply(msgs, generation_prompt),
              tok.add_bos_default(), true)
      .size();
}

std::vector<ChatMessage> messages_of(const fs::path& p) {
  std::ifstream f(p);
  const json j = json::parse(f);
  std::vector<ChatMessage> out;
  for (const auto& m : j.at("messages")) out.push_back({m.at("role"), m.at("content")});
  return out;
}

// The command through the shell under `timeout`, stdout and stderr apart.
test::CliResult run_shell(const std::string& args) {
  test::TempDir dir;
  const std::string cmd = "timeout 300 " + std::string(BARATA_CLI_PATH) + " " + args + " >" +
                          (dir / "out").string() + " 2>" + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  const auto out = test::read_bytes(dir / "out"), err = test::read_bytes(dir / "err");
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(out.begin(), out.end()),
          std::string(err.begin(), err.end())};
}

TEST(ChatCli, ConversationInAPseudoTerminalReusesTheCache) {
  REQUIRE_SMOLLM2();
  test::TempDir dir;
  const std::string save = (dir / "conv.json").string();
  PtyChat chat({"-m", smollm2().string(), "--temp", "0", "-n", "32", "-c", "1024", "-t", "2"});
  ASSERT_TRUE(chat.started());
  ASSERT_TRUE(chat.wait_prompt(60)) << chat.out();
  EXPECT_NE(chat.out().find("barata chat: "), std::string::npos);

  const std::string q1 = "What is the capital of France?", q2 = "And of Spain?";
  chat.send(q1 + "\r");
  ASSERT_TRUE(chat.wait_turns(1, 120)) << chat.out();
  chat.send(q2 + "\r");
  ASSERT_TRUE(chat.wait_turns(2, 120)) << chat.out();
  std::vector<TurnStats> st = parse_stats(chat.out());
  const std::string r1 = reply_after(chat.out(), q1), r2 = reply_after(chat.out(), q2);
  EXPECT_FALSE(r1.empty()) << chat.out();
  EXPECT_FALSE(r2.empty()) << chat.out();
  EXPECT_EQ(st[0].reused, 0);
  EXPECT_EQ(st[0].context, st[0].prefill + st[0].reply - 1);  // the last token is not fed back
  // Turn 2 reuses all of turn 1 and prefills only its own tokens.
  EXPECT_EQ(st[1].reused, st[0].context);
  EXPECT_LT(st[1].prefill, st[0].context);
  EXPECT_GT(st[1].prefill, 0);

  chat.send("/save " + save + "\r");
  ASSERT_TRUE(chat.wait_text("[saved 4 messages", 30)) << chat.out();
  ASSERT_TRUE(chat.wait_prompt(30)) << chat.out();
  const std::vector<ChatMessage> msgs = messages_of(save);
  // SmolLM2's template inserts its own system prompt: the conversation has
  // the turns alone.
  ASSERT_EQ(msgs.size(), 4u);
  EXPECT_EQ(msgs[0].role, "user");
  EXPECT_EQ(msgs[0].content, q1);
  EXPECT_EQ(msgs[1].role, "assistant");
  EXPECT_EQ(msgs[2].content, q2);
  EXPECT_FALSE(msgs[3].content.empty());
  // The cache after turn 2's prefill holds exactly what a full re-render tokenizes to.
  EXPECT_EQ(static_cast<size_t>(st[1].reused + st[1].prefill),
            rendered_tokens({msgs.begin(), msgs.begin() + 3}, true));

  // Greedy: after /reset the same question gets the same reply.
  chat.send("/reset\r");
  ASSERT_TRUE(chat.wait_text("[conversation reset]", 30)) << chat.out();
  ASSERT_TRUE(chat.wait_prompt(30)) << chat.out();
  const size_t mark = chat.out().size();
  chat.send(q1 + "\r");
  ASSERT_TRUE(chat.wait_turns(3, 120)) << chat.out();
  st = parse_stats(chat.out());
  EXPECT_EQ(st[2].reused, 0);
  EXPECT_EQ(st[2].prefill, st[0].prefill);
  EXPECT_EQ(reply_after(chat.out(), q1, mark), r1);

  // /load prefills the saved conversation; the next turn reuses all of it.
  chat.send("/load " + save + "\r");
  ASSERT_TRUE(chat.wait_text("[loaded 4 messages", 120)) << chat.out();
  ASSERT_TRUE(chat.wait_prompt(30)) << chat.out();
  std::smatch m;
  const std::string tail = chat.out().substr(chat.out().find("[loaded 4 messages"));
  ASSERT_TRUE(std::regex_search(tail, m, std::regex(R"(prefill (\d+) tokens)")));
  const int loaded = std::stoi(m[1]);
  EXPECT_EQ(static_cast<size_t>(loaded), rendered_tokens(msgs, false));
  chat.send("Thanks!\r");
  ASSERT_TRUE(chat.wait_turns(4, 120)) << chat.out();
  st = parse_stats(chat.out());
  EXPECT_EQ(st[3].reused, loaded);
  EXPECT_GT(st[3].reply, 0);
  EXPECT_FALSE(reply_after(chat.out(), "Thanks!").empty());

  chat.send("/exit\r");
  EXPECT_EQ(chat.wait_exit(30), 0) << chat.out();
}

TEST(ChatCli, CtrlCStopsAReplyAndTwiceAtThePromptQuits) {
  REQUIRE_SMOLLM2();
  test::TempDir dir;
  PtyChat chat({"-m", smollm2().string(), "--temp", "0", "-n", "1500", "-t", "2"});
  ASSERT_TRUE(chat.started());
  ASSERT_TRUE(chat.wait_prompt(60)) << chat.out();
  // Ctrl-C at the prompt discards the typed line: it never reaches the model.
  chat.send("discarded words\x03");
  ASSERT_TRUE(chat.wait_text("Ctrl-C again", 30)) << chat.out();
  ASSERT_TRUE(chat.wait_prompt(30)) << chat.out();
  const std::string q = "Write a very long story about a dragon and a knight.";
  chat.send(q + "\r");
  // Some of the reply has streamed: then interrupt it.
  ASSERT_TRUE(chat.wait_until(
      [&](const std::string& o) {
        const size_t a = o.find(q + "\r\n");
        return a != std::string::npos && o.size() > a + q.size() + 40;
      },
      120))
      << chat.out();
  chat.send("\x03");
  ASSERT_TRUE(chat.wait_turns(1, 60)) << chat.out();
  std::vector<TurnStats> st = parse_stats(chat.out());
  EXPECT_TRUE(st[0].interrupted) << chat.out();
  EXPECT_LT(st[0].reply, 1500);
  EXPECT_GT(st[0].reply, 0);
  // The program still answers, and the interrupted reply stayed in the conversation.
  chat.send("Say hi.\r");
  auto two_turns = [](const std::string& o) { return parse_stats(o).size() >= 2; };
  if (!chat.wait_until(two_turns, 40)) chat.send("\x03");  // a long answer: cut it too
  ASSERT_TRUE(chat.wait_until(two_turns, 60)) << chat.out();
  st = parse_stats(chat.out());
  EXPECT_EQ(st[1].reused, st[0].context);
  EXPECT_GT(st[1].reply, 0);
  ASSERT_TRUE(chat.wait_prompt(60));
  const std::string save = (dir / "c.json").string();
  chat.send("/save " + save + "\r");
  ASSERT_TRUE(chat.wait_text("[saved 4 messages", 30)) << chat.out();
  ASSERT_TRUE(chat.wait_prompt(30)) << chat.out();
  const std::vector<ChatMessage> msgs = messages_of(save);
  EXPECT_EQ(msgs[0].content, q);
  EXPECT_FALSE(msgs[1].content.empty());
  ASSERT_TRUE(chat.wait_prompt(30));
  const size_t hints = count(chat.out(), "Ctrl-C again");
  chat.send("\x03");
  ASSERT_TRUE(chat.wait_until(
      [&](const std::string& o) { return count(o, "Ctrl-C again") > hints && o.ends_with("> "); },
      30))
      << chat.out();
  ASSERT_TRUE(chat.wait_prompt(30)) << chat.out();
  chat.send("\x03");
  EXPECT_EQ(chat.wait_exit(30), 0) << chat.out();
}

TEST(ChatCli, PipedStdinIsPlainDeterministicAndMatchesRun) {
  REQUIRE_SMOLLM2();
  test::TempDir dir;
  {
    std::ofstream in(dir / "in.txt");
    in << "What is the capital of France?\n\nAnd of Spain?\n/help\n";
  }
  const std::string cmd =
      "chat -m " + smollm2().string() + " --temp 0 -n 24 -t 2 < " + (dir / "in.txt").string();
  const test::CliResult a = run_shell(cmd), b = run_shell(cmd);
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);                         // greedy replies are deterministic
  EXPECT_EQ(a.out.find("> "), std::string::npos);  // no prompt, no echo: only the replies
  EXPECT_TRUE(a.out.ends_with("\n")) << a.out;
  EXPECT_EQ(parse_stats(a.err).size(), 2u) << a.err;
  EXPECT_NE(a.err.find("/save FILE"), std::string::npos);  // /help on stderr
  // The first reply is what `run --chat` answers, greedy, to the same question.
  const test::CliResult r =
      run_shell("run -m " + smollm2().string() +
                " --chat -p \"What is the capital of France?\" --temp 0 -n 24 -t 2 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string first = json::parse(r.out)["text"];
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(a.out.substr(0, first.size() + 1), first + "\n") << a.out;
}

TEST(ChatCli, ContextLimitDropsTheOldestTurns) {
  REQUIRE_SMOLLM2();
  test::TempDir dir;
  std::string words;
  for (int i = 0; i < 100; ++i) words += "the dog ran ";
  {
    std::ofstream in(dir / "in.txt");
    in << "Name a color.\nName a fruit.\nName an animal.\nName a planet.\n"
       << words << "\nName a tree.\n";
  }
  const test::CliResult r = run_shell("chat -m " + smollm2().string() +
                                      " --temp 0 -n 16 -c 128 -t 2 < " + (dir / "in.txt").string());
  EXPECT_EQ(r.status, 1) << r.err;  // the too-long message was an error
  const std::vector<TurnStats> st = parse_stats(r.err);
  ASSERT_EQ(st.size(), 5u) << r.err;  // every turn but the too-long one answered
  EXPECT_NE(r.err.find("note: the context is full: dropped the 2 oldest messages"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("error: the message does not fit: it needs "), std::string::npos) << r.err;
  EXPECT_EQ(count(r.err, "error: "), 1u) << r.err;
  bool some_dropped = false;
  for (const auto& s : st) {
    EXPECT_LE(s.context, 128);
    EXPECT_GT(s.reply, 0);
    // After a drop the conversation is re-prefilled from the system prompt on.
    if (s.reused > 0 && s.prefill > s.reused) some_dropped = true;
  }
  EXPECT_TRUE(some_dropped) << r.err;
}

TEST(ChatCli, BadConversationFilesAreErrorsAndTheChatGoesOn) {
  REQUIRE_SMOLLM2();
  test::TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  {
    std::ofstream(dir / "bad.json")
        << "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}";
    std::ofstream(dir / "notjson.json") << "hello";
    std::ofstream in(dir / "in.txt");
    in << "/load " << (dir / "fifo").string() << "\n/load /dev/zero\n/load "
       << (dir / "bad.json").string() << "\n/load " << (dir / "notjson.json").string()
       << "\n/load\n/bogus\n/save " << (dir / "no/such/dir/c.json").string() << "\nHi!\n";
  }
  const test::CliResult r = run_shell("chat -m " + smollm2().string() + " --temp 0 -n 8 -t 2 < " +
                                      (dir / "in.txt").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("is a FIFO, not a regular file"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/dev/zero: the conversation file is a character device"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("has role 'robot'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("notjson.json: not JSON"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/load needs a FILE"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("unknown command '/bogus'"), std::string::npos) << r.err;
  EXPECT_EQ(count(r.err, "error: "), 7u) << r.err;
  EXPECT_EQ(r.err.find("internal"), std::string::npos) << r.err;
  EXPECT_EQ(parse_stats(r.err).size(), 1u) << r.err;  // "Hi!" was still answered
  EXPECT_FALSE(r.out.empty());
}

TEST(ChatCli, BadFlagsAreUsageErrors) {
  // Refused while parsing, before any model is opened.
  for (const char* flag : {"--temp nan", "--top-p 0", "--min-p nan", "--repeat-penalty 0",
                           "--top-k -5", "-s 18446744073709551616", "-n 0", "-c 0"}) {
    const test::CliResult r = run_shell(std::string("chat ") + flag + " < /dev/null");
    EXPECT_NE(r.status, 0) << flag;
    EXPECT_NE(r.status, 1) << flag;  // a usage error, not a runtime one
    const std::string first = r.err.substr(0, r.err.find('\n'));
    const std::string name = std::string(flag).substr(0, std::string(flag).find(' '));
    EXPECT_NE(first.find(name == "-s"   ? "--seed"
                         : name == "-n" ? "--n-predict"
                         : name == "-c" ? "--ctx-size"
                                        : name),
              std::string::npos)
        << flag << ": " << r.err;
  }
}

}  // namespace
}  // namespace barata
