// barata perplexity: llama-perplexity's convention and numbers, the base
// logits file (round trip, validation), KL divergence, the CLI.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/engine.h"
#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/model.h"
#include "barata/perplexity.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

using test::run_cli;
using test::TempDir;
using test::tiny_model;

// Options without designated initializers (GCC warns on the members left out).
PerplexityOptions opts(int64_t n_ctx, int64_t chunks = -1, int64_t batch = 0,
                       const std::filesystem::path* save = nullptr,
                       const std::filesystem::path* kl = nullptr) {
  PerplexityOptions o;
  o.n_ctx = n_ctx;
  o.max_chunks = chunks;
  o.n_batch = batch;
  o.save_logits = save;
  o.kl_base = kl;
  return o;
}

std::string eval_sample() {
  return read_regular_file(test::data_dir() / "models" / "eval_sample.txt", "text");
}

struct Tiny {
  Model model;
  Tokenizer tok;
  Engine engine;
  Tiny(const std::string& file, int64_t n_ctx)
      : model(Model::load(tiny_model(file))),
        tok(Tokenizer::from_gguf(model.file())),
        engine(model, {.n_threads = 1, .n_ctx = n_ctx}) {}
  PerplexityResult ppl(const std::string& text, PerplexityOptions o) {
    const std::vector<int32_t> ids = perplexity_tokens(tok, text);
    return perplexity(engine, tok, ids, o);
  }
};

// llama.cpp b4748's llama-perplexity on the same F32 file and text
// (tests/data/README.md): barata must agree within 0.1%.
TEST(Perplexity, MatchesLlamaCppOnAidreams) {
  {
    Tiny t("aidreams260K.gguf", 128);
    const PerplexityResult r = t.ppl(eval_sample(), opts(128, -1, 0, nullptr, nullptr));
    EXPECT_NEAR(r.ppl, 232.1521, 232.1521 * 1e-3);
    EXPECT_EQ(r.n_scored, r.n_chunks * 63);
    EXPECT_GT(r.ppl_err, 0);
    EXPECT_LT(r.ppl_err, r.ppl);
  }
  {
    Tiny t("aidreams260K.gguf", 64);
    const PerplexityResult r = t.ppl(eval_sample(), opts(64, -1, 0, nullptr, nullptr));
    EXPECT_NEAR(r.ppl, 265.1618, 265.1618 * 1e-3);
    EXPECT_EQ(r.n_scored, r.n_chunks * 31);
    ASSERT_EQ(r.chunk_nll.size(), static_cast<size_t>(r.n_chunks));
    double mean = 0;
    for (double v : r.chunk_nll) mean += v / static_cast<double>(r.n_chunks);
    EXPECT_NEAR(std::exp(mean), r.ppl, 1e-9 * r.ppl);  // equal chunks: mean of means
  }
}

// The convention by hand: each chunk from an empty cache, BOS in place of its
// first token, tokens fed one decode at a time, the second half scored.
TEST(Perplexity, EqualsTokenByTokenDecode) {
  Tiny t("aidreams260K.gguf", 64);
  const std::vector<int32_t> ids = perplexity_tokens(t.tok, eval_sample());
  ASSERT_GE(ids.size(), 128u);
  const int64_t n_vocab = t.model.config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(n_vocab)), lp(logits.size());
  double nll = 0;
  int64_t count = 0;
  for (int64_t c = 0; c < 2; ++c) {
    const int seq = t.engine.new_sequence();
    for (int64_t p = 0; p < 63; ++p) {
      const int32_t tok = p == 0 ? t.tok.bos_id() : ids[static_cast<size_t>(c * 64 + p)];
      const int s[1] = {seq};
      const int32_t tk[1] = {tok};
      t.engine.decode(s, tk, logits.data());
      if (p >= 32) {
        log_softmax(logits.data(), n_vocab, lp.data());
        nll -= lp[static_cast<size_t>(ids[static_cast<size_t>(c * 64 + p + 1)])];
        ++count;
      }
    }
    t.engine.free_sequence(seq);
  }
  const PerplexityResult r = perplexity(t.engine, t.tok, ids, opts(64, 2, 0, nullptr, nullptr));
  EXPECT_EQ(r.n_scored, count);
  EXPECT_NEAR(r.nll, nll / static_cast<double>(count), 1e-4);
  EXPECT_EQ(t.engine.blocks().free_blocks(),
            t.engine.blocks().max_blocks());  // every chunk's sequence freed
}

TEST(Perplexity, BatchSizeDoesNotChangeTheResult) {
  Tiny t("aidreams260K.gguf", 128);
  const PerplexityResult a = t.ppl(eval_sample(), opts(128, -1, 0, nullptr, nullptr));
  const PerplexityResult b = t.ppl(eval_sample(), opts(128, -1, 40, nullptr, nullptr));
  EXPECT_NEAR(a.ppl, b.ppl, 1e-4 * a.ppl);
  EXPECT_EQ(a.n_scored, b.n_scored);
}

TEST(Perplexity, TextShorterThanTwoChunksIsAnError) {
  Tiny t("aidreams260K.gguf", 128);
  try {
    t.ppl("Once upon a time there was a cat.", opts(128, -1, 0, nullptr, nullptr));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("needs at least 256"), std::string::npos) << m;
    EXPECT_NE(m.find("tokens"), std::string::npos) << m;
  }
}

// The 2-byte log-probs come back within half a step of the exact values.
TEST(PerplexityLogits, RoundTripWithinOneStep) {
  TempDir dir;
  const int64_t n_vocab = 1000;
  LogitsFileHeader h;
  h.n_vocab = n_vocab;
  h.n_ctx = 8;
  h.n_chunks = 2;
  h.first = 4;
  h.vocab_hash = 42;
  h.model_name = "random";
  h.tokens.assign(16, 7);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 3);
  std::vector<std::vector<float>> rows;
  {
    LogitsWriter w(dir / "base.lgp", h);
    for (int64_t i = 0; i < 2 * h.scored_per_chunk(); ++i) {
      std::vector<float> row(static_cast<size_t>(n_vocab));
      for (float& v : row) v = nd(rng);
      w.add(row.data(), static_cast<int32_t>(i));
      rows.push_back(row);
    }
    w.commit();
  }
  EXPECT_EQ(std::filesystem::file_size(dir / "base.lgp"),
            8 + 28 + 6 + 16 * 4 + rows.size() * h.record_bytes());
  LogitsReader r(dir / "base.lgp");
  EXPECT_EQ(r.header().model_name, "random");
  std::vector<float> lp(static_cast<size_t>(n_vocab)), exact(lp.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    int32_t top = -1;
    float nll = 0;
    r.next(lp.data(), &top, &nll);
    const int32_t etop = log_softmax(rows[i].data(), n_vocab, exact.data());
    EXPECT_EQ(top, etop);
    EXPECT_NEAR(nll, -exact[i], 1e-5);
    const float lo = std::max(*std::min_element(exact.begin(), exact.end()),
                              exact[static_cast<size_t>(etop)] - 30.0f);
    const float half_step = (exact[static_cast<size_t>(etop)] - lo) / 65535.0f;
    for (int64_t k = 0; k < n_vocab; ++k)
      EXPECT_NEAR(lp[static_cast<size_t>(k)], std::max(exact[static_cast<size_t>(k)], lo),
                  2 * half_step + 1e-5);  // rounding, then renormalization
  }
}

TEST(PerplexityLogits, TruncatedOrForeignFileIsAnError) {
  TempDir dir;
  Tiny t("aidreams260K.gguf", 64);
  const std::filesystem::path base = dir / "base.lgp";
  t.ppl(eval_sample(), opts(64, 2, 0, &base, nullptr));
  std::vector<uint8_t> bytes = test::read_bytes(base);
  bytes.resize(bytes.size() - 100);
  const std::filesystem::path cut = dir / "cut.lgp";
  test::write_bytes(cut, bytes);
  EXPECT_THROW(LogitsReader{cut}, Error);
  test::write_bytes(dir / "junk.lgp", {'G', 'G', 'U', 'F', 0, 0, 0, 0, 1, 2, 3});
  try {
    LogitsReader r(dir / "junk.lgp");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a barata logits file"), std::string::npos);
  }
}

TEST(PerplexityKl, AgainstItselfIsZero) {
  TempDir dir;
  Tiny t("aidreams260K.gguf", 64);
  const std::filesystem::path base = dir / "base.lgp";
  const PerplexityResult a = t.ppl(eval_sample(), opts(64, -1, 0, &base, nullptr));
  const PerplexityResult b = t.ppl(eval_sample(), opts(64, -1, 0, nullptr, &base));
  ASSERT_TRUE(b.kl.has_value());
  EXPECT_EQ(b.kl->n, a.n_scored);
  EXPECT_LT(b.kl->mean, 1e-6);
  EXPECT_LT(b.kl->max, 1e-5);
  EXPECT_DOUBLE_EQ(b.kl->same_top, 1.0);
  EXPECT_NEAR(b.kl->ppl_base, a.ppl, 1e-4 * a.ppl);
  EXPECT_NEAR(b.kl->ln_ppl_ratio, 0, 1e-5);
  EXPECT_NEAR(b.kl->dp_top, 0, 1e-4);
}

// stories260K's F32 weights as base, their F16 copy as candidate: a small,
// positive divergence; PPLs agree with the two files' own runs.
TEST(PerplexityKl, F16AgainstF32IsSmall) {
  TempDir dir;
  const std::string text = eval_sample();
  const std::filesystem::path base = dir / "base.lgp";
  Tiny f32("stories260K.gguf", 64);
  const PerplexityResult a = f32.ppl(text, opts(64, -1, 0, &base, nullptr));
  Tiny f16("stories260K-f16.gguf", 64);
  const PerplexityResult b = f16.ppl(text, opts(64, -1, 0, nullptr, &base));
  ASSERT_TRUE(b.kl.has_value());
  EXPECT_GT(b.kl->mean, 0);
  EXPECT_LT(b.kl->mean, 1e-3);
  EXPECT_GE(b.kl->median, 0);
  EXPECT_LE(b.kl->median, b.kl->p99);
  EXPECT_LE(b.kl->p99, b.kl->max);
  EXPECT_GT(b.kl->same_top, 0.95);
  EXPECT_NEAR(b.kl->ppl_base, a.ppl, 1e-3 * a.ppl);
  EXPECT_NEAR(b.kl->ln_ppl_ratio, std::log(b.ppl / a.ppl), 1e-4);
}

TEST(PerplexityKl, MismatchesAreNamed) {
  TempDir dir;
  const std::string text = eval_sample();
  const std::filesystem::path base = dir / "base.lgp";
  Tiny t("aidreams260K.gguf", 128);
  t.ppl(text, opts(64, 2, 0, &base, nullptr));
  auto error_of = [&](const std::string& txt, PerplexityOptions o) -> std::string {
    o.kl_base = &base;
    try {
      t.ppl(txt, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of(text, opts(128, 2, 0, nullptr, nullptr)).find("-c 64"), std::string::npos);
  EXPECT_NE(error_of(text, opts(64, 3, 0, nullptr, nullptr)).find("hold 2 chunks"),
            std::string::npos);
  std::string other = text;
  other[200] = other[200] == 'x' ? 'y' : 'x';
  EXPECT_NE(error_of(other, opts(64, 2, 0, nullptr, nullptr)).find("another text"),
            std::string::npos);
  // Another vocabulary: the file's vocabulary fingerprint doctored.
  std::vector<uint8_t> bytes = test::read_bytes(base);
  bytes[24] ^= 0xff;  // vocab fingerprint
  test::write_bytes(base, bytes);
  EXPECT_NE(error_of(text, opts(64, 2, 0, nullptr, nullptr)).find("another vocabulary"),
            std::string::npos);
}

TEST(PerplexityCli, JsonAndFinalLine) {
  const std::string m = tiny_model("aidreams260K.gguf").string();
  const std::string f = (test::data_dir() / "models" / "eval_sample.txt").string();
  const auto r = run_cli("perplexity -m " + m + " -f " + f + " -c 128 -t 1");
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind("Final estimate"));
  EXPECT_EQ(last.rfind("Final estimate: PPL = 232.1", 0), 0u) << r.out;
  EXPECT_NE(r.err.find("ETA"), std::string::npos) << r.err;
  const auto j = run_cli("perplexity -m " + m + " -f " + f + " -c 128 -t 1 --json");
  ASSERT_EQ(j.status, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["schema"], "barata.perplexity/1");
  EXPECT_EQ(doc["chunk_nll"].size(), doc["n_chunks"].get<size_t>());
  EXPECT_NEAR(doc["ppl"].get<double>(), 232.1521, 0.25);
  EXPECT_GT(doc["ppl_err"].get<double>(), 0);
}

TEST(PerplexityCli, BadInputIsOneErrorLine) {
  TempDir dir;
  const std::string m = tiny_model("aidreams260K.gguf").string();
  const std::string f = (test::data_dir() / "models" / "eval_sample.txt").string();
  test::write_bytes(dir / "short.txt", {'H', 'i', '.'});
  auto r = run_cli("perplexity -m " + m + " -f " + (dir / "short.txt").string() + " -c 64");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("\nerror: the text has "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("error:"), r.err.rfind("error:")) << r.err;  // one error line
  r = run_cli("perplexity -m " + m + " -f " + f + " -c 64 --kl-base " + f);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("not a barata logits file"), std::string::npos) << r.err;
  r = run_cli("perplexity -m " + m + " -c 64");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--file"), std::string::npos) << r.err;
  r = run_cli("perplexity -m " + m + " -f " + f + " --chunks 0");
  EXPECT_NE(r.status, 0);
}

}  // namespace
}  // namespace barata
