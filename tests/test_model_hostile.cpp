// Hostile metadata in a real tiny model (aidreams260K): every hyperparameter
// is range-checked and cross-checked before anything is sized by it, so each
// case is one barata::Error naming the key, at once, with no allocation in
// proportion to the number stated. Also the tokenizer's hostile vocabularies.
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/model.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

const GgufFile& tiny() {
  static const GgufFile f = GgufFile::open(test::tiny_model("aidreams260K.gguf"));
  return f;
}

// The tiny model with `edit` applied to its metadata (same tensors).
std::vector<uint8_t> edited(const std::function<void(GgufWriter&)>& edit) {
  const GgufFile& f = tiny();
  GgufWriter w = GgufWriter::from(f);
  for (const auto& t : f.tensors()) w.add_tensor(t.name, t.type, t.shape, t.data);
  edit(w);
  return w.to_bytes();
}

struct Case {
  std::string name;
  std::function<void(GgufWriter&)> edit;
  std::string expect;  // in the message
};

std::vector<Case> cases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto u32 = [](const char* key, uint32_t v) {
    return [=](GgufWriter& w) { w.set(key, GgufValue(v)); };
  };
  auto i32 = [](const char* key, int32_t v) {
    return [=](GgufWriter& w) { w.set(key, GgufValue(v)); };
  };
  auto f32 = [](const char* key, float v) {
    return [=](GgufWriter& w) { w.set(key, GgufValue(v)); };
  };
  return {
      {"block_count 1e9", u32("llama.block_count", 1000000000), "llama.block_count"},
      {"block_count 1e7", u32("llama.block_count", 10000000), "llama.block_count"},
      {"block_count more than the tensors", u32("llama.block_count", 5), "needs at least 45"},
      {"rope dims negative", i32("llama.rope.dimension_count", -16), "rope.dimension_count"},
      {"rope dims odd", u32("llama.rope.dimension_count", 15), "rope.dimension_count"},
      {"rope dims past the head", u32("llama.rope.dimension_count", 32), "rope.dimension_count"},
      {"rope base 0", f32("llama.rope.freq_base", 0.0f), "rope.freq_base"},
      {"rope base negative", f32("llama.rope.freq_base", -10000.0f), "rope.freq_base"},
      {"rope base NaN", f32("llama.rope.freq_base", nan), "rope.freq_base"},
      {"rope base inf", f32("llama.rope.freq_base", inf), "rope.freq_base"},
      {"rms eps negative", f32("llama.attention.layer_norm_rms_epsilon", -1e-5f),
       "layer_norm_rms_epsilon"},
      {"rms eps NaN", f32("llama.attention.layer_norm_rms_epsilon", nan), "layer_norm_rms_epsilon"},
      {"rms eps inf", f32("llama.attention.layer_norm_rms_epsilon", inf), "layer_norm_rms_epsilon"},
      {"heads do not divide the width", u32("llama.attention.head_count", 3),
       "is not a multiple of llama.attention.head_count = 3"},
      {"kv heads do not divide heads", u32("llama.attention.head_count_kv", 3),
       "4 query heads is not a multiple of 3 key/value heads"},
      {"more kv heads than heads", u32("llama.attention.head_count_kv", 8), "key/value heads"},
      {"zero heads", u32("llama.attention.head_count", 0), "llama.attention.head_count"},
      {"absurd width", u32("llama.embedding_length", 4000000000u), "llama.embedding_length"},
      {"absurd context",
       [](GgufWriter& w) { w.set("llama.context_length", GgufValue(uint64_t{1} << 40)); },
       "llama.context_length"},
      {"tokenizer smaller than the embedding",
       [](GgufWriter& w) {
         auto items = std::get<GgufArray>(tiny().find("tokenizer.ggml.tokens")->v).items;
         items.resize(500);
         w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, items));
       },
       "the tokenizer has 500 tokens but token_embd.weight has 512 rows"},
  };
}

TEST(ModelHostile, EveryBadHyperparameterIsOneErrorNamingIt) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const auto bytes = edited(c.edit);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      Model::from_gguf(GgufFile::from_memory(bytes, "tiny.gguf"));
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 1.0) << "validation must come before any work sized by the value";
  }
}

TEST(ModelHostile, TheUneditedModelLoads) {
  const auto bytes = edited([](GgufWriter&) {});
  const Model m = Model::from_gguf(GgufFile::from_memory(bytes, "tiny.gguf"));
  EXPECT_EQ(m.config().n_layer, 4);
}

// The CLI says the same in one line, exit 1, never "internal".
TEST(ModelHostile, RunPrintsOneErrorLine) {
  test::TempDir dir;
  const auto path = dir / "bad.gguf";
  test::write_bytes(path, edited([](GgufWriter& w) {
                      w.set("llama.rope.dimension_count", GgufValue(int32_t{-2}));
                    }));
  const auto r = test::run_cli("run -m " + path.string() + " -p hi -n 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err.find("internal"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error: " + path.string() + ": metadata key 'llama.rope.dimension_count'"),
            std::string::npos)
      << r.err;
}

// A SentencePiece byte token whose text is not two hex digits ("<0xZZ>") is
// not a byte: it has no piece, and nothing throws.
TEST(TokenizerHostile, MalformedByteTokenHasNoPiece) {
  const auto bytes = edited([](GgufWriter& w) {
    auto items = std::get<GgufArray>(tiny().find("tokenizer.ggml.tokens")->v).items;
    items[3] = GgufValue(std::string("<0xZZ>"));  // id 3 is <0x00>, a byte token
    w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, items));
  });
  const GgufFile f = GgufFile::from_memory(bytes, "tiny.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(f);
  EXPECT_EQ(tok.token_to_piece(3), "");
  EXPECT_EQ(tok.token_to_piece(4), std::string(1, '\x01'));
  const int32_t ids[] = {3, 4};
  EXPECT_NO_THROW(tok.decode(ids));
}

// A byte-level BPE vocabulary lacking one byte's token: such bytes are lost
// from the text (llama.cpp drops them too: falcon's vocabulary lacks 0x0B),
// so loading it says so on stderr, naming the bytes; it is never silent.
TEST(TokenizerHostile, BpeByteWithoutATokenIsWarnedAtLoad) {
  // GPT-2's byte-to-unicode: printable bytes stand for themselves, the rest
  // map to U+0100 + n in byte order.
  std::vector<GgufValue> tokens;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : 0x100u + static_cast<uint32_t>(n++);
    std::string s;
    if (cp < 0x80) {
      s = std::string(1, static_cast<char>(cp));
    } else {
      s += static_cast<char>(0xc0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3f));
    }
    if (b == 'q') continue;  // the vocabulary lacks "q"
    tokens.emplace_back(s);
  }
  GgufWriter w;
  w.set("general.architecture", std::string("llama"));
  w.set("tokenizer.ggml.model", std::string("gpt2"));
  w.set("tokenizer.ggml.pre", std::string("gpt-2"));
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, tokens));
  w.set("tokenizer.ggml.merges",
        GgufValue::array(GgufType::STRING, {GgufValue(std::string("a b"))}));
  test::TempDir dir;
  const auto path = dir / "bpe.gguf";
  w.write(path);
  // Said under -v only (a load of the default model would say it every run)...
  const auto quiet = test::run_cli("tokenize -m " + path.string() + " --ids aqb");
  EXPECT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("no token for"), std::string::npos) << quiet.err;
  const auto r = test::run_cli("-v tokenize -m " + path.string() + " --ids aqb");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("no token for 1 byte(s) (0x71)"), std::string::npos) << r.err;
  // ... and always by inspect.
  const auto ins = test::run_cli("inspect " + path.string());
  EXPECT_NE(ins.out.find("1 byte value(s) have no token (0x71)"), std::string::npos)
      << ins.out << ins.err;
  EXPECT_EQ(r.out.find("warn"), std::string::npos) << "logs go to stderr: " << r.out;
  EXPECT_EQ(r.out, "97 98\n");  // ids of "a" and "b" (token id = byte below 'q'); q is lost
}

}  // namespace
}  // namespace barata
