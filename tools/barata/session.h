// What `run` and `chat` share: the model/context/thread and sampling flags
// (validated the same way), the chat template choice and Ctrl-C catching.
// Loading and generating are the library's (barata/session.h).
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
#include "barata/session.h"
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
  std::string experts_on = "device";             // --experts-on cpu|device
};
void add_model_options(CLI::App* sub, ModelOptions& o);
// -ctk,--cache-type-k and -ctv,--cache-type-v, checked against the type names.
void add_cache_type_options(CLI::App* sub, std::string& k, std::string& v);
// A checked type name (the validators above) to its type.
KvType cache_type(const std::string& name);

// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n,
// -s/--seed. Values outside the sampler's domain (NaN, a negative top-k, a
// seed that does not fit 64 bits) are usage errors naming the flag.
void add_sampling_options(CLI::App* sub, SamplerOptions& s);

// --grammar, --grammar-file, --json-schema (one at most): constrained output.
struct GrammarOptions {
  std::string grammar, grammar_file, json_schema;
  bool any() const { return !grammar.empty() || !grammar_file.empty() || !json_schema.empty(); }
};
void add_grammar_options(CLI::App* sub, GrammarOptions& o);
// The grammar the flags ask for over the session's vocabulary; null without
// them. Errors name the flag and the file.
std::shared_ptr<const GrammarIndex> make_grammar(const GrammarOptions& o, const Session& s);

// The library's options for these flags, the default model's path filled in.
SessionOptions session_options(const ModelOptions& o);

// The chat format a file asks for: its own tokenizer.chat_template rendered by
// the Jinja interpreter; when that cannot be used, the hand-written format its
// markers name (with one warning saying why); with no template, its
// architecture row's own format (none for llama, whose files span families).
// Null when none; `why` then says why.
std::shared_ptr<const ChatFormatter> file_chat_format(const Session& s, std::string* why = nullptr);
// --chat-template NAME (a hand-written format) when given, else
// --chat-template-file FILE (a Jinja template) when given, else
// file_chat_format; an error naming the file when none works.
std::shared_ptr<const ChatFormatter> choose_chat_format(const std::string& name,
                                                        const std::string& file, const Session& s);
// The --chat-template and --chat-template-file flags.
void add_chat_template_options(CLI::App* sub, std::string& name, std::string& file);
// `given`, or the system prompt a hand-written format inserts ("" for a Jinja
// template, which inserts its own).
std::string system_prompt_or_default(const std::string& given, const ChatFormatter& f);

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

// For GenerateOptions::on_step: a step's probabilities as one stderr line.
void print_step_probs(const Tokenizer& tok, const nlohmann::json& step);
// Generation::finish as run and chat print it: a note on stderr when the
// context filled.
void note_context_full(const Generation& g, int64_t n_ctx);

}  // namespace barata::cli
