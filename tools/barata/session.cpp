#include "session.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/grammar.h"
#include "default_model.h"

namespace barata::cli {
namespace {

std::atomic<bool> g_interrupted{false};

// A number in [lo, hi] (an open end when lo_open / hi_open), finite, and the
// whole argument (no trailing text).
CLI::Validator real_in(double lo, bool lo_open, double hi, bool hi_open) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        const char* b = v.c_str();
        char* end = nullptr;
        const double x = std::strtod(b, &end);
        const std::string range = fmt::format(
            "{}{}, {}{}", lo_open ? "(" : "[", lo,
            std::isinf(hi) ? std::string("inf") : fmt::format("{}", hi), hi_open ? ")" : "]");
        if (end == b || *end != '\0' || !std::isfinite(x))
          return fmt::format("'{}' is not a finite number (the range is {})", v, range);
        if (x < lo || (lo_open && x == lo) || x > hi || (hi_open && x == hi))
          return fmt::format("{} is outside {}", v, range);
        return "";
      },
      "", "REAL");
}

// A decimal integer in [lo, hi], the whole argument.
template <typename T>
CLI::Validator integer_in(T lo, T hi) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        T x{};
        const char* e = v.data() + v.size();
        const auto [p, ec] = std::from_chars(v.data(), e, x);
        if (ec == std::errc::result_out_of_range ||
            (ec == std::errc() && p == e && (x < lo || x > hi)))
          return fmt::format("{} is outside [{}, {}]", v, lo, hi);
        if (std::is_unsigned_v<T> && !v.empty() && v[0] == '-')
          return fmt::format("{} is outside [{}, {}]", v, lo, hi);
        if (ec != std::errc() || p != e) return fmt::format("'{}' is not an integer", v);
        return "";
      },
      "", "INT");
}

}  // namespace

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void add_model_options(CLI::App* sub, ModelOptions& o) {
  sub->add_option("-m,--model", o.model,
                  "GGUF file (default: the model scripts/fetch-model.sh fetches)")
      ->check(CLI::ExistingFile);
  sub->add_option("-c,--ctx-size", o.n_ctx, "Context size (default: the model's, at most 4096)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  sub->add_option("-t,--threads", o.n_threads, "Threads (default: hardware threads)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--device", o.device, "Backend: cpu or cuda (default: cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--experts-on", o.experts_on,
                  "Where a mixture of experts' expert tensors live and run: device (default) or "
                  "cpu (host memory and CPU threads, the rest on --device cuda; docs/moe.md)")
      ->check(CLI::IsMember({"cpu", "device"}));
  sub->add_option(
         "--kv-tokens", o.kv_tokens,
         "Tokens of KV cache allocated once, over all sequences (default: the context size)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  sub->add_flag("--swa-full", o.swa_full,
                "Sliding-window layers keep every position's KV (default: their blocks behind the "
                "window are freed; prefix caching needs this)");
  add_cache_type_options(sub, o.cache_k, o.cache_v);
}

void add_cache_type_options(CLI::App* sub, std::string& k, std::string& v) {
  const auto member = [](bool is_k) {
    return CLI::Validator(
        [is_k](std::string& s) -> std::string {
          const auto t = parse_kv_type(s);
          if (t && (is_k || !kv_type_info(*t).k_only)) return "";
          return fmt::format("'{}' is not a {} cache type ({})", s, is_k ? "K" : "V",
                             kv_type_names(is_k));
        },
        "", "TYPE");
  };
  sub->add_option(
         "--cache-type-k", k,
         "KV cache type of K (-ctk): " + kv_type_names(true) +
             " (default f16; *o subtract the keys' offset, *h also rotate each head, *s also "
             "scale each channel by scales measured at load; docs/kv-cache.md)")
      ->check(member(true));
  sub->add_option("--cache-type-v", v,
                  "KV cache type of V (-ctv): " + kv_type_names(false) + " (default f16)")
      ->check(member(false));
}

KvType cache_type(const std::string& name) {
  const auto t = parse_kv_type(name);
  if (!t) fail("unknown KV cache type '{}' ({})", name, kv_type_names(true));
  return *t;
}

void add_sampling_options(CLI::App* sub, SamplerOptions& s) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  sub->add_option("--temp", s.temperature, "Temperature; 0 = greedy")
      ->check(real_in(0, false, kInf, true));
  sub->add_option("--top-k", s.top_k, "Top-k (0 = off)")->check(integer_in<int>(0, 1 << 30));
  sub->add_option("--top-p", s.top_p, "Top-p (1 = off)")->check(real_in(0, true, 1, false));
  sub->add_option("--min-p", s.min_p, "Min-p (0 = off)")->check(real_in(0, false, 1, false));
  sub->add_option("--repeat-penalty", s.repeat_penalty, "Repetition penalty (1 = off)")
      ->check(real_in(0, true, kInf, true));
  sub->add_option("--presence-penalty", s.presence_penalty,
                  "Subtract this from the logit of each token in the window (0 = off)")
      ->check(real_in(-2, true, 2, true));
  sub->add_option("--frequency-penalty", s.frequency_penalty,
                  "Subtract this per occurrence in the window (0 = off)")
      ->check(real_in(-2, true, 2, true));
  sub->add_option("--repeat-last-n", s.repeat_last_n, "Window of the penalties")
      ->check(integer_in<int>(0, 1 << 30));
  sub->add_option("-s,--seed", s.seed, "Random seed")
      ->check(integer_in<uint64_t>(0, std::numeric_limits<uint64_t>::max()));
}

void add_grammar_options(CLI::App* sub, GrammarOptions& o) {
  auto* g = sub->add_option("--grammar", o.grammar,
                            "Constrain the output to this GBNF grammar (llama.cpp's syntax)");
  auto* f = sub->add_option("--grammar-file", o.grammar_file, "Read the GBNF grammar from a file")
                ->check(CLI::ExistingFile);
  auto* j = sub->add_option("--json-schema", o.json_schema,
                            "Constrain the output to JSON valid against this JSON Schema file")
                ->check(CLI::ExistingFile);
  g->excludes(f)->excludes(j);
  f->excludes(j);
}

std::shared_ptr<const GrammarIndex> make_grammar(const GrammarOptions& o, const Session& s) {
  if (!o.any()) return nullptr;
  std::string gbnf = o.grammar;
  std::string where = "--grammar";
  if (!o.grammar_file.empty()) {
    gbnf = read_regular_file(o.grammar_file, "grammar file");
    where = "--grammar-file " + o.grammar_file;
  }
  if (!o.json_schema.empty()) {
    where = "--json-schema " + o.json_schema;
    try {
      gbnf = json_schema_to_gbnf(
          std::string_view(read_regular_file(o.json_schema, "JSON schema file")));
    } catch (const Error& e) {
      fail("{}: {}", where, e.what());
    }
  }
  try {
    return grammar_index(gbnf, s.tok);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
}

SessionOptions session_options(const ModelOptions& o) {
  return {.model = o.model.empty() ? std::filesystem::path(default_model_path())
                                   : std::filesystem::path(o.model),
          .n_ctx = o.n_ctx,
          .n_threads = o.n_threads,
          .device = parse_device(o.device).value_or(DeviceKind::kCpu),
          .kv_tokens = o.kv_tokens,
          .kv_contexts = o.kv_contexts,
          .swa_full = o.swa_full,
          .cache_k = cache_type(o.cache_k),
          .cache_v = cache_type(o.cache_v),
          .experts_on_cpu = o.experts_on == "cpu"};
}

std::shared_ptr<const ChatFormatter> file_chat_format(const Session& s, std::string* why) {
  std::string reason;
  if (auto f = ChatFormatter::for_tokenizer(s.tok, &reason)) {
    if (!reason.empty()) spdlog::warn("{}: {}", s.path, reason);
    return std::make_shared<const ChatFormatter>(std::move(*f));
  }
  // A file with no template: its architecture's own format, when the row has one.
  const std::string_view chat = s.model.config().spec->chat;
  if (s.tok.chat_template().empty() && !chat.empty()) {
    spdlog::info("{}: no tokenizer.chat_template; {}'s own chat format ({})", s.path,
                 s.model.config().arch, chat);
    return std::make_shared<const ChatFormatter>(chat_family_from_name(chat));
  }
  if (why) *why = reason;
  return nullptr;
}

std::shared_ptr<const ChatFormatter> choose_chat_format(const std::string& name,
                                                        const std::string& file, const Session& s) {
  if (!name.empty()) return std::make_shared<const ChatFormatter>(chat_family_from_name(name));
  if (!file.empty()) {
    const std::string src = read_regular_file(file, "chat template file");
    try {
      return std::make_shared<const ChatFormatter>(ChatFormatter::from_jinja(src, s.tok));
    } catch (const Error& e) {
      fail("--chat-template-file {}: {}", file, e.what());
    }
  }
  std::string why;
  if (auto f = file_chat_format(s, &why)) return f;
  fail("{}: {}; name a format with --chat-template ({}) or give one with --chat-template-file",
       s.path, why, fmt::join(chat_family_names(), ", "));
}

void add_chat_template_options(CLI::App* sub, std::string& name, std::string& file) {
  sub->add_option("--chat-template", name,
                  "A hand-written chat format in place of the file's own template: chatml, "
                  "llama3, gemma, llama2 or phi3");
  sub->add_option("--chat-template-file", file,
                  "A Jinja chat template (Hugging Face's syntax) in place of the file's own")
      ->check(CLI::ExistingFile)
      ->excludes(sub->get_option("--chat-template"));
}

std::string system_prompt_or_default(const std::string& given, const ChatFormatter& f) {
  return given.empty() ? f.default_system() : given;
}

SigintCatcher::SigintCatcher() {
  g_interrupted = false;
  prev_ = std::signal(SIGINT, [](int) { g_interrupted = true; });
}
SigintCatcher::~SigintCatcher() {
  std::signal(SIGINT, prev_);
}
bool SigintCatcher::interrupted() {
  return g_interrupted;
}
void SigintCatcher::clear() {
  g_interrupted = false;
}

void print_step_probs(const Tokenizer& tok, const nlohmann::json& step) {
  if (!step.contains("probs")) return;
  std::string line = "\n[probs";
  for (const auto& e : step["probs"])
    line += fmt::format(" {}:{:.4f}",
                        nlohmann::json(tok.token_to_piece(e[0].get<int32_t>()))
                            .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                        e[1].get<float>());
  fmt::print(stderr, "{}]\n", line);
}

void note_context_full(const Generation& g, int64_t n_ctx) {
  if (g.finish == FinishReason::kContext)
    fmt::print(stderr, "\nnote: stopped at the context limit of {} tokens\n", n_ctx);
}

}  // namespace barata::cli
