// barata chat: a conversation in the terminal. The conversation stays in the
// KV cache between turns: each turn renders the whole message list through the
// chat template, keeps the cached tokens that still match and prefills only
// the rest. docs/chat.md describes the commands and the choices made here.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <histedit.h>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/atomic_file.h"
#include "barata/chat_template.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/sampler.h"
#include "barata/tokenizer.h"
#include "commands.h"
#include "session.h"

namespace barata::cli {
namespace {

constexpr size_t kMaxLineBytes = size_t{1} << 20;
constexpr size_t kMaxConversationBytes = size_t{64} << 20;

struct ChatArgs {
  ModelOptions model;
  std::string chat_template, chat_template_file, system;
  int n_predict = 512;
  SamplerOptions sampling;
  GrammarOptions grammar;  // every reply constrained
  bool no_bos = false;
};

// ---- reading lines -----------------------------------------------------------

bool g_ctrl_c = false;  // set by the ^C key binding inside el_gets

// Bound to ^C while editing (the terminal's ISIG is off then, so ^C is a key):
// ends el_gets with the line, which the caller discards.
unsigned char on_ctrl_c(EditLine* el, int) {
  g_ctrl_c = true;
  FILE* out = nullptr;
  el_get(el, EL_GETFP, 1, &out);
  if (out != nullptr) std::fputs("^C", out);
  return CC_NEWLINE;
}

char* chat_prompt(EditLine*) {
  static char p[] = "> ";
  return p;
}

// libedit (line editing, history) when stdin is a terminal; plain bounded
// lines otherwise.
class LineReader {
 public:
  enum class Got { kLine, kEof, kCtrlC };

  LineReader() {
    if (!::isatty(STDIN_FILENO)) return;
    el_ = el_init("barata", stdin, ::isatty(STDOUT_FILENO) ? stdout : stderr, stderr);
    if (el_ == nullptr) return;
    hist_ = history_init();
    HistEvent ev;
    history(hist_, &ev, H_SETSIZE, 1000);
    history(hist_, &ev, H_SETUNIQUE, 1);
    el_set(el_, EL_EDITOR, "emacs");
    el_set(el_, EL_HIST, history, hist_);
    el_set(el_, EL_PROMPT, chat_prompt);
    el_set(el_, EL_SIGNAL, 1);
    el_source(el_, nullptr);  // ~/.editrc
    el_set(el_, EL_SETTY, "-d", "-isig", nullptr);
    // The wide call: libedit keeps these pointers as they are, where the
    // narrow el_set copies the two strings and never frees them (LeakSanitizer).
    el_wset(el_, EL_ADDFN, L"barata-ctrl-c", L"Discard the line", on_ctrl_c);
    el_set(el_, EL_BIND, "^C", "barata-ctrl-c", nullptr);
  }
  ~LineReader() {
    if (hist_ != nullptr) history_end(hist_);
    if (el_ != nullptr) el_end(el_);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  bool interactive() const { return el_ != nullptr; }

  Got read(std::string& line) {
    line.clear();
    if (el_ == nullptr) return read_plain(line);
    g_ctrl_c = false;
    int n = 0;
    const char* s = el_gets(el_, &n);
    if (g_ctrl_c) return Got::kCtrlC;
    if (s == nullptr || n <= 0) return Got::kEof;
    line.assign(s, static_cast<size_t>(n));
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (!line.empty()) {
      HistEvent ev;
      history(hist_, &ev, H_ENTER, line.c_str());
    }
    return Got::kLine;
  }

 private:
  static Got read_plain(std::string& line) {
    for (;;) {
      const int c = std::fgetc(stdin);
      if (c == EOF) return line.empty() ? Got::kEof : Got::kLine;
      if (c == '\n') break;
      if (line.size() >= kMaxLineBytes)
        fail("standard input: a line is longer than {} bytes", kMaxLineBytes);
      line.push_back(static_cast<char>(c));
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return Got::kLine;
  }

  EditLine* el_ = nullptr;
  History* hist_ = nullptr;
};

// ---- the conversation ----------------------------------------------------------

class Conversation {
 public:
  Conversation(Session& s, const ChatArgs& a)
      : s_(s),
        format_(choose_chat_format(a.chat_template, a.chat_template_file, s)),
        sampler_(a.sampling),
        add_bos_(!a.no_bos && s.tok.add_bos_default()),
        n_predict_(a.n_predict),
        reserve_(std::min<int64_t>(a.n_predict, s.n_ctx / 2)),
        grammar_(make_grammar(a.grammar, s)) {
    const std::string system = system_prompt_or_default(a.system, *format_);
    if (!system.empty()) msgs_.push_back({"system", system});
  }

  const ChatFormatter& format() const { return *format_; }

  // One user turn: fit it into the context, prefill what the cache lacks,
  // stream the reply to stdout, add it to the conversation.
  void turn(const std::string& text) {
    std::vector<ChatMessage> next = msgs_;
    next.push_back({"user", text});
    std::vector<int32_t> tokens = render(next, true);
    const size_t dropped = fit(next, tokens, 1);
    if (static_cast<int64_t>(tokens.size()) + reserve_ > s_.n_ctx)
      fail(
          "the message does not fit: it needs {} tokens with the system prompt, the context "
          "holds {} and {} stay free for the reply (raise -c, lower -n, or /reset)",
          tokens.size(), s_.n_ctx, reserve_);
    if (dropped > 0)
      fmt::print(stderr,
                 "note: the context is full: dropped the {} oldest message{} (the system prompt "
                 "stays)\n",
                 dropped, dropped == 1 ? "" : "s");
    msgs_ = std::move(next);

    const size_t keep = reuse(tokens);
    std::vector<int32_t> all(tokens.begin(), tokens.begin() + static_cast<long>(keep));
    const std::span<const int32_t> fresh(tokens.data() + keep, tokens.size() - keep);
    Generation g;
    {
      SigintCatcher catcher;
      GenerateOptions go;
      go.n_predict = n_predict_;
      go.grammar = grammar_;
      go.interrupted = [] { return SigintCatcher::interrupted(); };
      g = generate(s_, seq_, fresh, all, sampler_, go, [](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      });
    }
    note_context_full(g, s_.n_ctx);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    all.resize(static_cast<size_t>(s_.engine.length(seq_)));
    cached_ = std::move(all);
    // An interrupted or cut reply stays as far as it went.
    msgs_.push_back({"assistant", g.text});
    const double ms = g.ms_per_step();
    fmt::print(stderr,
               "[prefill {} tokens ({} reused from the cache) in {:.1f} ms | reply {} tokens, "
               "{:.2f} ms/token | context {}/{}{}]\n",
               g.prefill_tokens, keep, g.prefill_ms, g.generated.size(), ms, cached_.size(),
               s_.n_ctx,
               g.interrupted()                      ? " | interrupted"
               : g.finish == FinishReason::kContext ? " | context full"
                                                    : "");
  }

  // Back to the system prompt alone, the cache freed.
  void reset() {
    msgs_.resize(msgs_.empty() || msgs_[0].role != "system" ? 0 : 1);
    free_cache();
  }

  void save(const std::string& path) const {
    nlohmann::json j = {{"messages", nlohmann::json::array()}};
    for (const auto& m : msgs_) j["messages"].push_back({{"role", m.role}, {"content", m.content}});
    write_file_atomically(path,
                          j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    fmt::print(stderr, "[saved {} messages to {}]\n", msgs_.size(), path);
  }

  // Replaces the conversation with the file's and prefills it.
  void load(const std::string& path) {
    std::vector<ChatMessage> loaded = parse_conversation(path);
    std::vector<int32_t> tokens = render(loaded, false);
    const size_t dropped = fit(loaded, tokens, 0);
    if (static_cast<int64_t>(tokens.size()) + reserve_ > s_.n_ctx)
      fail(
          "{}: the conversation needs {} tokens, the context holds {} and {} stay free for the "
          "reply",
          path, tokens.size(), s_.n_ctx, reserve_);
    if (dropped > 0)
      fmt::print(stderr, "note: dropped the {} oldest messages of {} to fit the context\n", dropped,
                 path);
    msgs_ = std::move(loaded);
    free_cache();
    const auto t0 = Clock::now();
    if (!tokens.empty()) {  // the conversation into the cache, nothing generated (-n 0)
      seq_ = s_.engine.new_sequence();
      std::vector<int32_t> all;
      GenerateOptions go;
      go.n_predict = 0;
      generate(s_, seq_, tokens, all, sampler_, go, [](std::string_view) {});
      cached_ = tokens;
    }
    fmt::print(stderr,
               "[loaded {} messages from {}: prefill {} tokens in {:.1f} ms | context {}/{}]\n",
               msgs_.size(), path, tokens.size(), ms_since(t0), cached_.size(), s_.n_ctx);
  }

 private:
  std::vector<int32_t> render(const std::vector<ChatMessage>& msgs, bool generation_prompt) const {
    if (msgs.empty()) return {};
    return s_.tok.encode(format_->apply(msgs, generation_prompt), add_bos_, true);
  }

  // Drops the oldest messages after the system prompt (a user turn and the
  // replies after it) until the rendering plus the reply's reserve fits, but
  // never the last `keep_last` messages. Returns how many were dropped.
  size_t fit(std::vector<ChatMessage>& msgs, std::vector<int32_t>& tokens, size_t keep_last) const {
    const bool gen = keep_last > 0;
    const size_t first = !msgs.empty() && msgs[0].role == "system" ? 1 : 0;
    size_t dropped = 0;
    while (static_cast<int64_t>(tokens.size()) + reserve_ > s_.n_ctx &&
           msgs.size() > first + keep_last) {
      size_t n = 1;
      while (first + n < msgs.size() - keep_last && msgs[first + n].role == "assistant") ++n;
      msgs.erase(msgs.begin() + static_cast<long>(first),
                 msgs.begin() + static_cast<long>(first + n));
      dropped += n;
      tokens = render(msgs, gen);
    }
    return dropped;
  }

  // Keeps the longest cached prefix of `tokens` (at least one token is left
  // to prefill, for the logits) and returns its length.
  size_t reuse(const std::vector<int32_t>& tokens) {
    if (seq_ < 0) seq_ = s_.engine.new_sequence();
    size_t keep = 0;
    while (keep < cached_.size() && keep < tokens.size() && cached_[keep] == tokens[keep]) ++keep;
    if (keep == tokens.size() && keep > 0) --keep;
    if (keep < cached_.size()) s_.engine.truncate(seq_, static_cast<int64_t>(keep));
    cached_.resize(keep);
    return keep;
  }

  void free_cache() {
    if (seq_ >= 0) s_.engine.free_sequence(seq_);
    seq_ = -1;
    cached_.clear();
  }

  static std::vector<ChatMessage> parse_conversation(const std::string& path) {
    const std::string bytes = read_regular_file(path, "conversation file", kMaxConversationBytes);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(bytes);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not JSON: {}", path, e.what());
    }
    const nlohmann::json* list = &j;
    if (j.is_object() && j.contains("messages")) list = &j["messages"];
    if (!list->is_array())
      fail("{}: expected {{\"messages\": [{{\"role\": ..., \"content\": ...}}, ...]}}", path);
    std::vector<ChatMessage> out;
    for (size_t i = 0; i < list->size(); ++i) {
      const nlohmann::json& m = (*list)[i];
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          !m.contains("content") || !m["content"].is_string())
        fail("{}: message {} is not an object with string \"role\" and \"content\"", path, i);
      const std::string role = m["role"];
      if (role != "system" && role != "user" && role != "assistant")
        fail("{}: message {} has role '{}' (known: system, user, assistant)", path, i,
             printable(role));
      if (role == "system" && i != 0)
        fail("{}: message {}: a system message must come first", path, i);
      out.push_back({role, m["content"]});
    }
    return out;
  }

  Session& s_;
  std::shared_ptr<const ChatFormatter> format_;
  Sampler sampler_;
  bool add_bos_;
  int n_predict_;
  int64_t reserve_;                              // context positions kept free for a reply
  std::shared_ptr<const GrammarIndex> grammar_;  // --grammar and the like: every reply
  std::vector<ChatMessage> msgs_;
  int seq_ = -1;
  std::vector<int32_t> cached_;  // what the cache holds for seq_
};

const char* kHelp =
    "commands:\n"
    "  /reset        drop the conversation (the system prompt stays), free the cache\n"
    "  /save FILE    write the conversation as JSON messages\n"
    "  /load FILE    replace the conversation with FILE's and prefill it\n"
    "  /exit         quit (also Ctrl-D)\n"
    "  /help         this list\n"
    "Ctrl-C stops a reply; at the prompt it discards the line, twice in a row it quits.\n";

// The argument of "/cmd ARG", trimmed; "" when none.
std::string argument(const std::string& line, size_t cmd_len) {
  size_t b = cmd_len;
  while (b < line.size() && line[b] == ' ') ++b;
  size_t e = line.size();
  while (e > b && line[e - 1] == ' ') --e;
  return line.substr(b, e - b);
}

int chat(const ChatArgs& a) {
  Session s(session_options(a.model));
  Conversation conv(s, a);
  LineReader reader;
  fmt::print(stderr,
             "barata chat: {} ({} template, context {} tokens, {} threads, load {:.0f} ms)\n"
             "/help for commands; Ctrl-D or /exit to quit\n",
             s.path, conv.format().name(), s.n_ctx, s.engine.n_threads(), s.load_ms);
  // Ctrl-C is caught for the whole session: a reply checks it (each turn
  // clears it first); outside a reply it does nothing (at the prompt the
  // terminal's ISIG is off and ^C is the editor's key).
  SigintCatcher catcher;
  int status = 0;
  bool ctrl_c_before = false;
  std::string line;
  for (;;) {
    const LineReader::Got got = reader.read(line);
    if (got == LineReader::Got::kEof) break;
    if (got == LineReader::Got::kCtrlC) {
      if (ctrl_c_before) break;
      ctrl_c_before = true;
      fmt::print(stderr, "\n(Ctrl-C again, Ctrl-D or /exit to quit)\n");
      continue;
    }
    ctrl_c_before = false;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    auto is_cmd = [&](const char* c) {
      const size_t n = std::strlen(c);
      return line.compare(0, n, c) == 0 && (line.size() == n || line[n] == ' ');
    };
    try {
      if (is_cmd("/exit") || is_cmd("/quit")) {
        break;
      } else if (is_cmd("/help")) {
        fmt::print(stderr, "{}", kHelp);
      } else if (is_cmd("/reset")) {
        conv.reset();
        fmt::print(stderr, "[conversation reset]\n");
      } else if (is_cmd("/save") || is_cmd("/load")) {
        const std::string file = argument(line, 5);
        if (file.empty()) fail("{} needs a FILE", line.substr(0, 5));
        if (line[1] == 's')
          conv.save(file);
        else
          conv.load(file);
      } else if (line[0] == '/') {
        fail("unknown command '{}' (/help lists them)", printable(line.substr(0, line.find(' '))));
      } else {
        conv.turn(line);
      }
    } catch (const Error& e) {
      std::fflush(stdout);
      fmt::print(stderr, "error: {}\n", printable(e.what(), 4000));
      status = 1;
    }
  }
  if (reader.interactive()) fmt::print(stderr, "\n");
  return status;
}

}  // namespace

Command add_chat(CLI::App& app) {
  auto* sub = app.add_subcommand("chat", "Interactive conversation in the terminal");
  auto a = std::make_shared<ChatArgs>();
  add_model_options(sub, a->model);
  sub->add_option("-n,--n-predict", a->n_predict, "Most tokens per reply")
      ->check(CLI::Range(1, 1 << 30));
  add_sampling_options(sub, a->sampling);
  add_grammar_options(sub, a->grammar);
  add_chat_template_options(sub, a->chat_template, a->chat_template_file);
  sub->add_option("--system", a->system, "System prompt (default: the template's, if any)");
  sub->add_flag("--no-bos", a->no_bos, "Do not add the BOS token");
  return {sub, [a] { return chat(*a); }};
}

}  // namespace barata::cli
