// What `run` and `chat` share: the model/context/thread and sampling flags
// (validated the same way), loading the model, tokenizer and engine, the chat
// template choice, Ctrl-C catching, and the prefill + sampling loop.
#pragma once

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "barata/chat_template.h"
#include "barata/engine.h"
#include "barata/sequence.h"
#include "barata/model.h"
#include "barata/sampler.h"
#include "barata/tokenizer.h"

namespace barata::cli {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t);

// -m, -c, -t, --device.
struct ModelOptions {
  std::string model;  // "" = the default model
  int64_t n_ctx = 0;  // 0 = the model's training context, at most 4096
  int n_threads = 0;  // 0 = hardware threads
  std::string device = "cpu";
  int64_t kv_tokens = 0;    // KV pool over all sequences; 0 = kv_contexts x the context size
  int64_t kv_contexts = 1;  // without --kv-tokens: the pool holds this many full contexts
  bool swa_full = false;    // --swa-full: sliding-window layers keep every block
  std::string cache_k = "f16", cache_v = "f16";  // -ctk / -ctv (kv_types.h)
};
void add_model_options(CLI::App* sub, ModelOptions& o);
// -ctk,--cache-type-k and -ctv,--cache-type-v, checked against the type names.
void add_cache_type_options(CLI::App* sub, std::string& k, std::string& v);
// A checked type name (the validators above) to its type.
KvType cache_type(const std::string& name);

// "KV pool: ..." for the engine's pool: users x context that fit, the
// sliding-window layers' freed blocks counted.
std::string kv_pool_line(const Engine& e);

// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n,
// -s/--seed. Values outside the sampler's domain (NaN, a negative top-k, a
// seed that does not fit 64 bits) are usage errors naming the flag.
void add_sampling_options(CLI::App* sub, SamplerOptions& s);

// The model, its tokenizer and an engine over it; not movable (the engine
// refers to the model).
struct Session {
  explicit Session(const ModelOptions& o);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Clock::time_point t_start;
  std::string path;
  Model model;
  Tokenizer tok;
  int64_t n_ctx;
  Engine engine;
  double load_ms;
};

// The chat format a file asks for: its tokenizer.chat_template, else its
// architecture row's own format (none for llama, whose files span families).
std::optional<ChatFamily> file_chat_family(const Session& s);
// --chat-template NAME when given, else file_chat_family; an error naming
// the file when neither works.
ChatFamily choose_chat_family(const std::string& name, const Session& s);
// `given`, or the default system prompt the file's template inserts.
std::string system_prompt_or_default(const std::string& given, const Session& s);

// Ctrl-C sets a flag instead of killing the process while one of these lives.
class SigintCatcher {
 public:
  SigintCatcher();
  ~SigintCatcher();
  SigintCatcher(const SigintCatcher&) = delete;
  SigintCatcher& operator=(const SigintCatcher&) = delete;
  static bool interrupted();
  static void clear();

 private:
  void (*prev_)(int);
};

struct GenerateOptions {
  int n_predict = 256;
  bool no_cache = false;          // recompute the whole sequence each step
  int top_logits = 0;             // per step: the K largest (id, logit)
  int show_probs = 0;             // per step: the K most likely (id, p)
  bool print_probs = false;       // also write each step's probabilities to stderr
  std::vector<std::string> stop;  // stop strings: the text ends before the first
};

struct Generation {
  std::vector<int32_t> generated;  // sampled ids, the end-of-generation token included
  std::string text;                // their text, end-of-generation token excluded
  std::string stop =
      "n_predict";  // run_stop_name(finish): n_predict, eog, stop, interrupted, context_full
  FinishReason finish = FinishReason::kNone;
  int64_t prefill_tokens = 0;
  double prefill_ms = 0, ttft_ms = 0, decode_ms = 0;
  nlohmann::json steps = nlohmann::json::array();

  // The first token comes from the prefill's logits; the others cost a decode step each.
  int64_t decode_steps() const {
    return std::max<int64_t>(static_cast<int64_t>(generated.size()) - 1, 0);
  }
  double ms_per_step() const {
    return decode_steps() > 0 ? decode_ms / static_cast<double>(decode_steps()) : 0.0;
  }
};

// Appends `prompt` to sequence `seq` (whose tokens so far are `all`; the
// sampler accepts the prompt), then samples up to n_predict tokens, feeding
// each but the last back through the cache. `all` ends as the whole sequence
// including the last sampled token, which the cache does not hold (so the
// cache holds all[0 .. engine.length(seq))). Text reaches on_text as it
// completes, the decoder's tail last. Stops early at an end-of-generation
// token, at Ctrl-C (with a SigintCatcher alive), or when `all` fills n_ctx.
Generation generate(Session& s, int seq, std::span<const int32_t> prompt, std::vector<int32_t>& all,
                    Sampler& sampler, const GenerateOptions& o,
                    const std::function<void(std::string_view)>& on_text);

}  // namespace barata::cli
