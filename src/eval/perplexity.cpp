// Perplexity, the base log-probability file and KL divergence
// (include/barata/perplexity.h, docs/eval.md).
#include "barata/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "barata/atomic_file.h"
#include "barata/error.h"
#include "barata/file_io.h"

namespace barata {
namespace {

constexpr char kMagic[8] = {'B', 'R', 'T', 'L', 'G', 'P', '0', '1'};
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL, kFnvPrime = 0x100000001b3ULL;

void fnv(uint64_t& h, const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * kFnvPrime;
}

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The value at quantile q (0..1) of v, sorted in place.
double quantile(std::vector<float>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(at);
  const double f = at - static_cast<double>(i);
  return i + 1 < v.size() ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

}  // namespace

uint64_t vocab_fingerprint(const Tokenizer& tok) {
  uint64_t h = kFnvOffset;
  const int32_t n = tok.n_vocab();
  fnv(h, &n, sizeof n);
  for (int32_t i = 0; i < n; ++i) {
    const std::string& t = tok.token_text(i);
    const uint32_t len = static_cast<uint32_t>(t.size());
    fnv(h, &len, sizeof len);
    fnv(h, t.data(), t.size());
  }
  return h;
}

std::vector<int32_t> perplexity_tokens(const Tokenizer& tok, std::string_view text) {
  return tok.encode(text, tok.add_bos_default() && tok.bos_id() >= 0, false);
}

int32_t log_softmax(const float* logits, int64_t n, float* lp) {
  int32_t top = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[top]) top = static_cast<int32_t>(i);
  const float mx = logits[top];
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const float lse = static_cast<float>(std::log(sum));
  for (int64_t i = 0; i < n; ++i) lp[i] = logits[i] - mx - lse;
  return top;
}

// ---------------------------------------------------------------- writer

struct LogitsWriter::Impl {
  AtomicFile file;
  LogitsFileHeader h;
  int64_t expected = 0, written = 0;
  std::vector<float> lp;
  std::string rec;
  Impl(const std::filesystem::path& p, const LogitsFileHeader& hh) : file(p), h(hh) {}
};

LogitsWriter::LogitsWriter(const std::filesystem::path& path, const LogitsFileHeader& h)
    : impl_(std::make_unique<Impl>(path, h)) {
  if (h.tokens.size() != static_cast<size_t>(h.n_chunks) * h.n_ctx)
    fail("internal: logits file header with {} tokens for {} chunks of {}", h.tokens.size(),
         h.n_chunks, h.n_ctx);
  std::string s(kMagic, sizeof kMagic);
  put(s, h.n_vocab);
  put(s, h.n_ctx);
  put(s, h.n_chunks);
  put(s, h.first);
  put(s, h.vocab_hash);
  put(s, static_cast<uint32_t>(h.model_name.size()));
  s += h.model_name;
  s.append(reinterpret_cast<const char*>(h.tokens.data()), h.tokens.size() * sizeof(int32_t));
  impl_->file.write(s.data(), s.size());
  impl_->expected = static_cast<int64_t>(h.n_chunks) * h.scored_per_chunk();
  impl_->lp.resize(h.n_vocab);
  impl_->rec.resize(h.record_bytes());
}

LogitsWriter::~LogitsWriter() = default;

void LogitsWriter::add(const float* logits, int32_t next_token) {
  Impl& m = *impl_;
  const int64_t n = m.h.n_vocab;
  const int32_t top = log_softmax(logits, n, m.lp.data());
  const float hi = m.lp[static_cast<size_t>(top)];
  float lo = hi;
  for (int64_t i = 0; i < n; ++i) lo = std::min(lo, m.lp[static_cast<size_t>(i)]);
  lo = std::max(lo, static_cast<float>(hi - kLogProbRange));
  const float nll = -m.lp[static_cast<size_t>(next_token)];
  char* r = m.rec.data();
  std::memcpy(r, &lo, 4);
  std::memcpy(r + 4, &hi, 4);
  std::memcpy(r + 8, &top, 4);
  std::memcpy(r + 12, &nll, 4);
  const float inv = hi > lo ? 65535.0f / (hi - lo) : 0.0f;
  auto* q = reinterpret_cast<unsigned char*>(r + 16);
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(m.lp[static_cast<size_t>(i)], lo, hi);
    const auto u = static_cast<uint16_t>(std::lround((v - lo) * inv));
    q[2 * i] = static_cast<unsigned char>(u & 0xff);
    q[2 * i + 1] = static_cast<unsigned char>(u >> 8);
  }
  if (m.written >= m.expected) fail("internal: more logits rows than the file's header says");
  m.file.write(m.rec.data(), m.rec.size());
  ++m.written;
}

void LogitsWriter::commit() {
  if (impl_->written != impl_->expected)
    fail("internal: logits file has {} of {} records", impl_->written, impl_->expected);
  impl_->file.commit();
}

// ---------------------------------------------------------------- reader

struct LogitsReader::Impl {
  std::filesystem::path path;
  std::FILE* f = nullptr;
  LogitsFileHeader h;
  std::string rec;
  int64_t read = 0, total = 0;
  ~Impl() {
    if (f) std::fclose(f);
  }
  void need(void* p, size_t n, const char* what) {
    if (std::fread(p, 1, n, f) != n)
      fail("{}: truncated logits file: it ends inside {}", path.string(), what);
  }
};

LogitsReader::LogitsReader(const std::filesystem::path& path) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = path;
  const int fd = open_regular_file(path, "logits file");
  m.f = fdopen(fd, "rb");
  if (!m.f) fail("{}: cannot open the logits file", path.string());
  char magic[8];
  m.need(magic, 8, "the header");
  if (std::memcmp(magic, kMagic, 8) != 0)
    fail("{}: not a barata logits file (made with --save-logits; magic differs)", path.string());
  LogitsFileHeader& h = m.h;
  m.need(&h.n_vocab, 4, "the header");
  m.need(&h.n_ctx, 4, "the header");
  m.need(&h.n_chunks, 4, "the header");
  m.need(&h.first, 4, "the header");
  m.need(&h.vocab_hash, 8, "the header");
  uint32_t name_len = 0;
  m.need(&name_len, 4, "the header");
  if (h.n_vocab == 0 || h.n_vocab > (1u << 24) || h.n_ctx < 2 || h.n_ctx > (1u << 24) ||
      h.first >= h.n_ctx - 1 || h.n_chunks == 0 || h.n_chunks > (1u << 24) || name_len > 4096)
    fail("{}: logits file header out of range (n_vocab {}, n_ctx {}, chunks {}, first {})",
         path.string(), h.n_vocab, h.n_ctx, h.n_chunks, h.first);
  h.model_name.resize(name_len);
  m.need(h.model_name.data(), name_len, "the header");
  const uint64_t n_tok = static_cast<uint64_t>(h.n_chunks) * h.n_ctx;
  m.total = static_cast<int64_t>(h.n_chunks) * h.scored_per_chunk();
  // The file's length must be what the header says, before anything big is read.
  const uint64_t want =
      8 + 4 * 4 + 8 + 4 + name_len + 4 * n_tok + static_cast<uint64_t>(m.total) * h.record_bytes();
  std::error_code ec;
  const uintmax_t have = std::filesystem::file_size(path, ec);
  if (ec || have != want)
    fail("{}: logits file is {} bytes, its header says {} (truncated or not one file)",
         path.string(), ec ? 0 : have, want);
  h.tokens.resize(n_tok);
  m.need(h.tokens.data(), 4 * n_tok, "the token ids");
  m.rec.resize(h.record_bytes());
}

LogitsReader::~LogitsReader() = default;

const LogitsFileHeader& LogitsReader::header() const {
  return impl_->h;
}

void LogitsReader::check_matches(const LogitsFileHeader& run, const std::string& run_model) const {
  const LogitsFileHeader& h = impl_->h;
  const std::string p = impl_->path.string();
  if (h.n_vocab != run.n_vocab || h.vocab_hash != run.vocab_hash)
    fail(
        "{}: the base logits come from another vocabulary ('{}', {} tokens) than this model "
        "('{}', {} tokens)",
        p, printable(h.model_name), h.n_vocab, printable(run_model), run.n_vocab);
  if (h.n_ctx != run.n_ctx)
    fail("{}: the base logits were made with -c {}, this run uses -c {}", p, h.n_ctx, run.n_ctx);
  if (h.n_chunks != run.n_chunks)
    fail("{}: the base logits hold {} chunks, this run evaluates {} (pass --chunks {})", p,
         h.n_chunks, run.n_chunks, h.n_chunks);
  for (size_t i = 0; i < h.tokens.size(); ++i)
    if (h.tokens[i] != run.tokens[i])
      fail(
          "{}: the base logits were made from another text: token {} is {} there and {} here "
          "(chunk {})",
          p, i, h.tokens[i], run.tokens[i], i / h.n_ctx + 1);
}

void LogitsReader::next(float* lp, int32_t* top, float* nll) {
  Impl& m = *impl_;
  if (m.read >= m.total) fail("internal: read past the last logits record");
  m.need(m.rec.data(), m.rec.size(), "a record");
  ++m.read;
  float lo, hi;
  const char* r = m.rec.data();
  std::memcpy(&lo, r, 4);
  std::memcpy(&hi, r + 4, 4);
  std::memcpy(top, r + 8, 4);
  std::memcpy(nll, r + 12, 4);
  if (!std::isfinite(lo) || !std::isfinite(hi) || lo > hi || *top < 0 ||
      static_cast<uint32_t>(*top) >= m.h.n_vocab || !std::isfinite(*nll))
    fail("{}: logits record {} is corrupt", m.path.string(), m.read);
  const float step = (hi - lo) / 65535.0f;
  const auto* q = reinterpret_cast<const unsigned char*>(r + 16);
  double sum = 0;
  for (uint32_t i = 0; i < m.h.n_vocab; ++i) {
    lp[i] = lo + static_cast<float>(q[2 * i] | (q[2 * i + 1] << 8)) * step;
    sum += std::exp(static_cast<double>(lp[i]));
  }
  // Renormalized: the rounding's first-order error (sum p != 1) would
  // otherwise bias every KL by up to ~1e-4 nats.
  const auto lse = static_cast<float>(std::log(sum));
  for (uint32_t i = 0; i < m.h.n_vocab; ++i) lp[i] -= lse;
}

// ---------------------------------------------------------------- perplexity

PerplexityResult perplexity(Engine& engine, const Tokenizer& tok, std::span<const int32_t> tokens,
                            const PerplexityOptions& opt) {
  const int64_t n_ctx = opt.n_ctx;
  if (n_ctx < 4) fail("perplexity needs a context of at least 4 tokens (-c {})", n_ctx);
  if (n_ctx > engine.n_ctx())
    fail("internal: perplexity at -c {} on an engine of context {}", n_ctx, engine.n_ctx());
  const int64_t n_tok = static_cast<int64_t>(tokens.size());
  if (n_tok < 2 * n_ctx)
    fail(
        "the text has {} tokens; perplexity at -c {} needs at least {} (two chunks): give a "
        "longer text or a smaller -c",
        n_tok, n_ctx, 2 * n_ctx);
  const int64_t n_batch = opt.n_batch > 0 ? std::min(opt.n_batch, n_ctx) : n_ctx;
  const int64_t max_chunks = n_tok / n_ctx;
  const int64_t n_chunks = opt.max_chunks < 0 ? max_chunks : std::min(opt.max_chunks, max_chunks);
  if (n_chunks < 1) fail("--chunks {}: at least one chunk is needed", opt.max_chunks);
  const int64_t first = n_ctx / 2;
  const int64_t scored = n_ctx - 1 - first;
  const int64_t n_vocab = engine.model().config().n_vocab;
  if (n_vocab != tok.n_vocab())
    fail("the model has {} logits per token but its vocabulary {} tokens", n_vocab, tok.n_vocab());
  const int32_t bos = tok.bos_id();
  const bool add_bos = opt.add_bos && tok.add_bos_default() && bos >= 0;

  LogitsFileHeader hdr;
  hdr.n_vocab = static_cast<uint32_t>(n_vocab);
  hdr.n_ctx = static_cast<uint32_t>(n_ctx);
  hdr.n_chunks = static_cast<uint32_t>(n_chunks);
  hdr.first = static_cast<uint32_t>(first);
  hdr.vocab_hash = vocab_fingerprint(tok);
  hdr.model_name = opt.model_name;
  hdr.tokens.assign(tokens.begin(), tokens.begin() + n_chunks * n_ctx);

  std::unique_ptr<LogitsReader> base;
  if (opt.kl_base) {
    base = std::make_unique<LogitsReader>(*opt.kl_base);
    base->check_matches(hdr, opt.model_name);
  }
  std::unique_ptr<LogitsWriter> save;
  if (opt.save_logits) save = std::make_unique<LogitsWriter>(*opt.save_logits, hdr);

  PerplexityResult res;
  res.n_text_tokens = n_tok;
  res.n_ctx = n_ctx;
  res.n_chunks = n_chunks;
  std::vector<float> logits(static_cast<size_t>(scored + 1) * n_vocab);
  std::vector<float> lp_c(static_cast<size_t>(n_vocab)), lp_b(static_cast<size_t>(n_vocab));
  std::vector<float> kl_values;
  double nll = 0, nll2 = 0, base_nll = 0;
  double same_top = 0, dp_top = 0, dp_token = 0;
  int64_t count = 0;
  Batch batch;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t start = c * n_ctx;
    const int seq = engine.new_sequence();
    struct Free {
      Engine& e;
      int s;
      ~Free() { e.free_sequence(s); }
    } guard{engine, seq};
    size_t got = 0;  // logits rows received
    for (int64_t b0 = 0; b0 < n_ctx; b0 += n_batch) {
      const int64_t b1 = std::min(n_ctx, b0 + n_batch);
      batch.clear();
      for (int64_t p = b0; p < b1; ++p) {
        const int32_t t = (p == 0 && add_bos) ? bos : tokens[static_cast<size_t>(start + p)];
        batch.add(t, p, seq, p >= first && p <= n_ctx - 1);
      }
      engine.forward(batch, logits.data() + got * n_vocab);
      got += static_cast<size_t>(batch.n_logits());
    }
    double chunk = 0;
    for (int64_t j = 0; j < scored; ++j) {
      const float* row = logits.data() + static_cast<size_t>(j) * n_vocab;
      const int32_t next = tokens[static_cast<size_t>(start + first + j + 1)];
      const int32_t top = log_softmax(row, n_vocab, lp_c.data());
      const double v = -static_cast<double>(lp_c[static_cast<size_t>(next)]);
      nll += v;
      nll2 += v * v;
      chunk += v;
      if (save) save->add(row, next);
      if (base) {
        int32_t btop = 0;
        float bnll = 0;
        base->next(lp_b.data(), &btop, &bnll);
        double kl = 0;
        for (int64_t i = 0; i < n_vocab; ++i) {
          const double pb = std::exp(static_cast<double>(lp_b[static_cast<size_t>(i)]));
          kl += pb *
                (static_cast<double>(lp_b[static_cast<size_t>(i)]) - lp_c[static_cast<size_t>(i)]);
        }
        kl_values.push_back(static_cast<float>(std::max(kl, 0.0)));
        base_nll += bnll;
        same_top += top == btop;
        dp_top += std::exp(static_cast<double>(lp_c[static_cast<size_t>(btop)])) -
                  std::exp(static_cast<double>(lp_b[static_cast<size_t>(btop)]));
        dp_token += std::exp(-v) - std::exp(-static_cast<double>(bnll));
      }
    }
    count += scored;
    res.chunk_nll.push_back(chunk / static_cast<double>(scored));
    if (opt.progress) opt.progress(c + 1, n_chunks, std::exp(nll / count), seconds_since(t0));
  }
  res.seconds = seconds_since(t0);
  res.tokens_per_s = res.seconds > 0 ? static_cast<double>(n_chunks * n_ctx) / res.seconds : 0;
  if (save) save->commit();
  res.n_scored = count;
  res.nll = nll / count;
  res.ppl = std::exp(res.nll);
  const double var = nll2 / count - res.nll * res.nll;
  res.ppl_err =
      var > 0 && count > 1 ? std::sqrt(var / static_cast<double>(count - 1)) * res.ppl : 0;
  if (base) {
    KlSummary k;
    k.n = count;
    double sum = 0, sum2 = 0;
    for (float v : kl_values) {
      sum += v;
      sum2 += static_cast<double>(v) * v;
    }
    k.mean = sum / count;
    const double kvar = sum2 / count - k.mean * k.mean;
    k.sd_mean = kvar > 0 && count > 1 ? std::sqrt(kvar / static_cast<double>(count - 1)) : 0;
    k.max = *std::max_element(kl_values.begin(), kl_values.end());
    k.median = quantile(kl_values, 0.5);
    k.p99 = quantile(kl_values, 0.99);
    k.same_top = same_top / count;
    k.dp_top = dp_top / count;
    k.dp_token = dp_token / count;
    k.ppl_base = std::exp(base_nll / count);
    k.ln_ppl_ratio = res.nll - base_nll / count;
    res.kl = k;
  }
  return res;
}

}  // namespace barata
