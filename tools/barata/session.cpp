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
#include "barata/scheduler.h"
#include "barata/plan.h"
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
  sub->add_option("--repeat-last-n", s.repeat_last_n, "Window of the repetition penalty")
      ->check(integer_in<int>(0, 1 << 30));
  sub->add_option("-s,--seed", s.seed, "Random seed")
      ->check(integer_in<uint64_t>(0, std::numeric_limits<uint64_t>::max()));
}

Session::Session(const ModelOptions& o)
    : t_start(Clock::now()),
      path(o.model.empty() ? default_model_path() : o.model),
      model(Model::load(path)),
      tok(Tokenizer::from_gguf(model.file())),
      n_ctx(o.n_ctx > 0 ? o.n_ctx : std::min<int64_t>(model.config().n_ctx_train, 4096)),
      engine(model, {.n_threads = o.n_threads,
                     .n_ctx = n_ctx,
                     .cache_tokens = o.kv_tokens > 0 ? o.kv_tokens : o.kv_contexts * n_ctx,
                     .device = parse_device(o.device).value_or(DeviceKind::kCpu),
                     .swa_full = o.swa_full,
                     .cache_k = cache_type(o.cache_k),
                     .cache_v = cache_type(o.cache_v)}),
      load_ms(ms_since(t_start)) {
  spdlog::info("{}", kv_pool_line(engine));
}

std::string kv_pool_line(const Engine& e) {
  if (!e.blocks().has_sliding_groups())
    return plan::describe_kv_pool(e.blocks().max_tokens(), e.n_ctx(), e.kv_bytes_per_token(),
                                  kv_cache_label(e.kv_layout().k_type, e.kv_layout().v_type));
  return plan::describe_kv_pool_bytes(
      e.blocks().max_blocks() * e.kv_layout().bytes_per_block(), e.n_ctx(),
      [&e](int64_t len) { return e.kv_sequence_bytes(len); },
      kv_cache_label(e.kv_layout().k_type, e.kv_layout().v_type));
}

std::optional<ChatFamily> file_chat_family(const Session& s) {
  if (auto f = detect_chat_family(s.tok.chat_template())) return f;
  // A file with no template: its architecture's own format, when the row has one.
  const std::string_view chat = s.model.config().spec->chat;
  if (s.tok.chat_template().empty() && !chat.empty()) {
    spdlog::info("{}: no tokenizer.chat_template; {}'s own chat format ({})", s.path,
                 s.model.config().arch, chat);
    return chat_family_from_name(chat);
  }
  return std::nullopt;
}

ChatFamily choose_chat_family(const std::string& name, const Session& s) {
  if (!name.empty()) return chat_family_from_name(name);
  if (auto f = file_chat_family(s)) return *f;
  fail("{}: {}; name one with --chat-template ({})", s.path,
       s.tok.chat_template().empty()
           ? "the file has no chat template (tokenizer.chat_template)"
           : "cannot tell the chat template family from tokenizer.chat_template",
       fmt::join(chat_family_names(), ", "));
}

std::string system_prompt_or_default(const std::string& given, const Session& s) {
  return given.empty() ? default_system_prompt(s.tok.chat_template()) : given;
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

Generation generate(Session& s, int seq, std::span<const int32_t> prompt, std::vector<int32_t>& all,
                    Sampler& sampler, const GenerateOptions& o,
                    const std::function<void(std::string_view)>& on_text) {
  Generation g;
  const Tokenizer& tok = s.tok;
  all.insert(all.end(), prompt.begin(), prompt.end());
  g.prefill_tokens = static_cast<int64_t>(prompt.size());

  // One request on the scheduler, a batch of one: -n 0 fills the cache and
  // samples nothing; without the cache, each token recomputes the sequence.
  EngineSteps steps(s.engine);
  SchedulerOptions so;
  so.slots = 1;
  so.max_batch_tokens = std::max<int64_t>(s.n_ctx, 1);  // the prompt in one call
  so.prefix_cache = false;
  so.recompute = o.no_cache;
  so.tokenizer = &tok;
  so.is_eog = [&tok](int32_t t) { return tok.is_eog(t); };
  Scheduler sch(steps, so);
  sch.on_logits = [&](const Sequence&, std::span<const float> logits) {
    if (o.top_logits <= 0 && o.show_probs <= 0) return;
    nlohmann::json step;
    if (o.top_logits > 0) {
      nlohmann::json tl = nlohmann::json::array();
      for (auto [id, p] : top_probs(logits, 1.0f, o.top_logits)) {
        (void)p;
        tl.push_back({id, logits[static_cast<size_t>(id)]});
      }
      step["top_logits"] = tl;
    }
    if (o.show_probs > 0) {
      const float temp = sampler.options().temperature > 0 ? sampler.options().temperature : 1.0f;
      nlohmann::json tp = nlohmann::json::array();
      for (auto [id, p] : top_probs(logits, temp, o.show_probs)) tp.push_back({id, p});
      step["probs"] = tp;
      if (o.print_probs) {
        std::string line = "\n[probs";
        for (const auto& e : tp)
          line += fmt::format(" {}:{:.4f}",
                              nlohmann::json(tok.token_to_piece(e[0].get<int32_t>()))
                                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                              e[1].get<float>());
        fmt::print(stderr, "{}]\n", line);
      }
    }
    g.steps.push_back(step);
  };
  const auto t_start = Clock::now();
  Clock::time_point t_decode;
  sch.on_token = [&](const Sequence&, int32_t id) {
    if (g.generated.empty()) {
      g.ttft_ms = ms_since(t_start);
      t_decode = Clock::now();
    }
    g.generated.push_back(id);
  };
  // The scheduler's text: whole characters, held back while it could be
  // the start of a stop string, the stop string itself never passed on.
  sch.on_text = [&](const Sequence&, std::string_view text) {
    g.text += text;
    on_text(text);
  };

  Request r;
  r.prompt = all;
  r.sampler = &sampler;
  r.kv_seq = seq;
  r.max_tokens = o.n_predict;
  r.prefill_only = o.n_predict == 0;
  r.stop = o.stop;
  const int id = sch.submit(std::move(r));
  bool prefill_timed = false;
  while (!sch.idle()) {
    if (SigintCatcher::interrupted()) {
      sch.cancel(id);
      break;
    }
    const StepInfo info = sch.step();
    if (!prefill_timed) g.prefill_ms = info.ms;  // the first call reads the prompt
    prefill_timed = true;
  }
  const Sequence& q = sch.sequence(id);
  if (q.status == SeqStatus::kFailed) fail("{}", q.error);
  all.assign(q.tokens.begin(), q.tokens.end());
  if (!g.generated.empty()) g.decode_ms = ms_since(t_decode);
  g.finish = q.finish;
  g.stop = run_stop_name(q.finish);
  if (q.finish == FinishReason::kContext)
    fmt::print(stderr, "\nnote: stopped at the context limit of {} tokens\n", s.n_ctx);
  return g;
}

}  // namespace barata::cli
