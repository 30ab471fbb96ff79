// Perplexity in llama.cpp's llama-perplexity convention, KL divergence against a
// base model's saved log-probabilities, and the file those are saved in
// (docs/eval.md).
//
// The convention (llama.cpp b4748, examples/perplexity): the whole text is
// tokenized once (BOS first when the vocabulary adds one); it is cut into
// chunks of n_ctx tokens (the tail that fills no chunk is dropped); in each
// chunk the first token is replaced by BOS (when the vocabulary adds one) and
// the chunk is evaluated from an empty cache in one prefill; only the second
// half is scored: positions first = n_ctx / 2 .. n_ctx - 2 predict tokens
// first + 1 .. n_ctx - 1, n_ctx - 1 - first tokens per chunk. PPL =
// exp(mean NLL); its error is PPL * sd(NLL) / sqrt(count - 1), the standard
// error of the mean NLL carried through exp. At least 2 * n_ctx tokens are
// needed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "barata/engine.h"
#include "barata/tokenizer.h"

namespace barata {

// 64-bit FNV-1a over every token's stored text, in id order: two models share
// a vocabulary when their fingerprints are equal.
uint64_t vocab_fingerprint(const Tokenizer& tok);

// The text to ids as llama-perplexity does it: BOS first when the vocabulary
// adds one, special tokens not parsed.
std::vector<int32_t> perplexity_tokens(const Tokenizer& tok, std::string_view text);

// Base log-probabilities of every scored token, 2 bytes per vocabulary entry.
//
// Layout (little-endian): the header
//   char[8] "BRTLGP01"; u32 n_vocab, n_ctx, n_chunks, first; u64 vocab
//   fingerprint; u32 name bytes, the model's name;
//   i32 token ids [n_chunks * n_ctx] (the evaluated tokens, before the BOS
//   replacement);
// then per scored token (chunk-major, n_ctx - 1 - first per chunk) a record
//   f32 lo, f32 hi (the range of the stored log-probs), i32 top (argmax id),
//   f32 nll (the base's -log p of the text's next token),
//   u16 q[n_vocab]: log p = lo + q * (hi - lo) / 65535; log-probs below
//   hi - kLogProbRange are stored as lo = hi - kLogProbRange.
constexpr double kLogProbRange = 30.0;

struct LogitsFileHeader {
  uint32_t n_vocab = 0, n_ctx = 0, n_chunks = 0, first = 0;
  uint64_t vocab_hash = 0;
  std::string model_name;
  std::vector<int32_t> tokens;
  int64_t scored_per_chunk() const { return static_cast<int64_t>(n_ctx) - 1 - first; }
  size_t record_bytes() const { return 16 + 2 * static_cast<size_t>(n_vocab); }
};

class LogitsWriter {
 public:
  // Opens an atomic temporary of `path`; nothing appears there before commit().
  LogitsWriter(const std::filesystem::path& path, const LogitsFileHeader& h);
  ~LogitsWriter();
  // One scored position: the row of logits and the text's next token.
  void add(const float* logits, int32_t next_token);
  void commit();  // throws unless every record was added

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class LogitsReader {
 public:
  // Reads and checks the header (magic, sizes, the file's length).
  explicit LogitsReader(const std::filesystem::path& path);
  ~LogitsReader();
  const LogitsFileHeader& header() const;
  // Errors naming what differs: the vocabulary, n_ctx, the chunk count, the
  // first differing token.
  void check_matches(const LogitsFileHeader& run, const std::string& run_model) const;
  // The next record: log-probs into lp (n_vocab, renormalized after decoding),
  // the base's argmax and NLL.
  void next(float* lp, int32_t* top, float* nll);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct KlSummary {
  int64_t n = 0;
  double mean = 0, median = 0, p99 = 0, max = 0, sd_mean = 0;  // KL(base || candidate), nats
  double same_top = 0;      // fraction of positions whose argmax equals the base's
  double dp_top = 0;        // mean of p_cand(base top) - p_base(base top)
  double dp_token = 0;      // mean of p_cand(next) - p_base(next), llama.cpp's "Mean Δp"
  double ppl_base = 0;      // the base's perplexity over the same tokens
  double ln_ppl_ratio = 0;  // ln(PPL_candidate / PPL_base)
};

struct PerplexityOptions {
  int64_t n_ctx = 512;      // -c: tokens per chunk
  int64_t n_batch = 0;      // -b: rows per forward call; 0 = n_ctx (one prefill per chunk)
  int64_t max_chunks = -1;  // --chunks; < 0 = every chunk the text fills
  bool add_bos = true;      // BOS in place of each chunk's first token
  // After each chunk: (chunks done, of n, running PPL, seconds so far).
  std::function<void(int64_t, int64_t, double, double)> progress;
  const std::filesystem::path* save_logits = nullptr;  // --save-logits
  const std::filesystem::path* kl_base = nullptr;      // --kl-base
  std::string model_name;                              // recorded in / checked against the file
};

struct PerplexityResult {
  int64_t n_text_tokens = 0;  // tokens of the whole text
  int64_t n_ctx = 0, n_chunks = 0, n_scored = 0;
  std::vector<double> chunk_nll;  // mean NLL of each chunk's scored tokens
  double nll = 0, ppl = 0, ppl_err = 0;
  double seconds = 0;       // evaluation only (not loading or tokenizing)
  double tokens_per_s = 0;  // tokens evaluated (n_chunks * n_ctx) per second
  std::optional<KlSummary> kl;
};

// Evaluates `tokens` (from perplexity_tokens) on `engine`, whose context
// must hold n_ctx. Throws barata::Error when the text is shorter than two
// chunks (saying how many tokens it has and needs) or a logits file does not
// match.
PerplexityResult perplexity(Engine& engine, const Tokenizer& tok, std::span<const int32_t> tokens,
                            const PerplexityOptions& opt);

// log-softmax of one row into lp; returns the row's argmax.
int32_t log_softmax(const float* logits, int64_t n, float* lp);

}  // namespace barata
