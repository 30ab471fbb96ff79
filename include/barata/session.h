// A model ready to generate from (Session: the file, its tokenizer and an
// engine over it) and one generation on it (generate): the prompt appended
// to a sequence, then tokens sampled, plainly or speculatively, through the
// scheduler's step as a batch of one. `run` and `chat` are this plus
// argument parsing and printing.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "barata/backend.h"
#include "barata/engine.h"
#include "barata/kv_types.h"
#include "barata/model.h"
#include "barata/sampler.h"
#include "barata/sequence.h"
#include "barata/speculative.h"
#include "barata/tokenizer.h"

namespace barata {

struct SessionOptions {
  std::filesystem::path model;  // the GGUF file
  int64_t n_ctx = 0;            // 0 = the model's training context, at most 4096
  int n_threads = 0;            // 0 = hardware threads
  DeviceKind device = DeviceKind::kCpu;
  int64_t kv_tokens = 0;    // KV pool over all sequences; 0 = kv_contexts x the context size
  int64_t kv_contexts = 1;  // without kv_tokens: the pool holds this many full contexts
  bool swa_full = false;    // sliding-window layers keep every block
  KvType cache_k = KvType::kF16, cache_v = KvType::kF16;
  bool experts_on_cpu = false;  // --experts-on cpu (BackendOptions::experts_on_cpu)
};

// The model, its tokenizer and an engine over it; not movable (the engine
// refers to the model).
struct Session {
  using Clock = std::chrono::steady_clock;
  explicit Session(const SessionOptions& o);
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

// "KV pool: ..." for the engine's pool: users x context that fit, the
// sliding-window layers' freed blocks counted.
std::string kv_pool_line(const Engine& e);

struct GenerateOptions {
  int n_predict = 256;
  bool no_cache = false;          // recompute the whole sequence each step
  int top_logits = 0;             // per step: the K largest (id, logit)
  int show_probs = 0;             // per step: the K most likely (id, p) at the temperature
  std::vector<std::string> stop;  // stop strings: the text ends before the first
  // Constrained output (Request::grammar); null: none.
  std::shared_ptr<const GrammarIndex> grammar;
  // Speculative decoding (the scheduler's mode): a drafter the caller
  // keeps, null for plain decoding; its gamma, or --draft-auto's choice per
  // step with the draft's cost prior (< 0: the scheduler's default).
  Drafter* drafter = nullptr;
  int draft_max = 8, draft_min = 0;
  bool draft_auto = false;
  double draft_c_prior = -1;
  // Polled between steps: true cancels the generation (Ctrl-C).
  std::function<bool()> interrupted;
  // Each step's record (top_logits / probs) as it is made.
  std::function<void(const nlohmann::json& step)> on_step;
};

struct Generation {
  std::vector<int32_t> generated;  // sampled ids, the end-of-generation token included
  std::string text;                // their text, end-of-generation token excluded
  // Why it stopped; run_stop_name() gives run's names (n_predict, eog,
  // stop, interrupted, context_full).
  FinishReason finish = FinishReason::kNone;
  int64_t prefill_tokens = 0;
  double prefill_ms = 0, ttft_ms = 0, decode_ms = 0;
  nlohmann::json steps = nlohmann::json::array();
  SpecStats spec;                 // with a drafter: its verify passes and plain steps
  std::vector<float> grammar_us;  // with a grammar: each mask's microseconds
  bool interrupted() const { return finish == FinishReason::kCancelled; }

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
// completes, a stop string never. Stops early at an end-of-generation token,
// a stop string, o.interrupted(), or when `all` fills n_ctx. Throws
// barata::Error when the request is refused (a prompt that does not fit, a
// repetition penalty with a drafter).
Generation generate(Session& s, int seq, std::span<const int32_t> prompt, std::vector<int32_t>& all,
                    Sampler& sampler, const GenerateOptions& o,
                    const std::function<void(std::string_view)>& on_text);

}  // namespace barata
