// barata plan: the sum weights + KV bytes per token x tokens + reserve, the
// reference text's three numbers (13B int4 on 8 GiB: 337 tokens; 16 GiB int8:
// 7B 65,378 and 13B 3,136), the inputs it refuses, and the KV pool line that
// run, chat and bench print.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/model_config.h"
#include "barata/plan.h"
#include "test_util.h"

namespace barata {
namespace {

using nlohmann::json;
using plan::kGiB;
using plan::WeightFormat;

int64_t tokens(const char* preset, WeightFormat f, int64_t gib) {
  return plan::plan_memory(plan::preset(preset, f), gib * kGiB, plan::kDefaultReserveBytes)
      .max_tokens;
}

TEST(Plan, ReferenceNumbers) {
  EXPECT_EQ(tokens("13b", WeightFormat::kInt4, 8), 337);
  EXPECT_EQ(tokens("7b", WeightFormat::kInt8, 16), 65378);
  EXPECT_EQ(tokens("13b", WeightFormat::kInt8, 16), 3136);
}

TEST(Plan, ReferenceNumbersByHand) {
  // (16 GiB - 1.5 GiB - 7e9 B) / 131072 B = 65378.1
  EXPECT_EQ(plan::max_resident_tokens(16 * kGiB, 7'000'000'000, kGiB * 3 / 2, 131072), 65378);
  // 13e9 x 4.125 / 8 = 6,703,125,000 B; (8 GiB - 1.5 GiB - that) / 819200 = 337.2
  EXPECT_EQ(plan::weight_bytes(13'000'000'000, WeightFormat::kInt4), 6'703'125'000);
  EXPECT_EQ(plan::max_resident_tokens(8 * kGiB, 6'703'125'000, kGiB * 3 / 2, 819200), 337);
  // (16 GiB - 1.5 GiB - 13e9 B) / 819200 = 3136.3
  EXPECT_EQ(plan::max_resident_tokens(16 * kGiB, 13'000'000'000, kGiB * 3 / 2, 819200), 3136);
}

TEST(Plan, PresetShapes) {
  const auto p7 = plan::preset("7b", WeightFormat::kFp16);
  const auto p13 = plan::preset("13b", WeightFormat::kInt8);
  const auto p70 = plan::preset("70b", WeightFormat::kInt4);
  EXPECT_EQ(p7.kv_bytes_per_token(), 131072);   // 2 x 32 x 8 x 128 x 2
  EXPECT_EQ(p13.kv_bytes_per_token(), 819200);  // 2 x 40 x 40 x 128 x 2
  EXPECT_EQ(p70.kv_bytes_per_token(), 327680);  // 2 x 80 x 8 x 128 x 2
  EXPECT_EQ(p7.weight_bytes, 14'000'000'000);
  EXPECT_EQ(p13.weight_bytes, 13'000'000'000);
  EXPECT_EQ(p70.weight_bytes, 36'093'750'000);
  EXPECT_EQ(plan::preset("7B", WeightFormat::kFp16).name, "7b");
}

TEST(Plan, BitsPerWeight) {
  EXPECT_EQ(plan::bits_per_weight(WeightFormat::kFp16), 16.0);
  EXPECT_EQ(plan::bits_per_weight(WeightFormat::kInt8), 8.0);
  EXPECT_EQ(plan::bits_per_weight(WeightFormat::kInt4), 4.125);
  EXPECT_EQ(plan::weight_bytes(3, WeightFormat::kInt4), 2);  // 12.375 bits, rounded up
  EXPECT_EQ(plan::parse_weight_format("int4"), WeightFormat::kInt4);
  EXPECT_FALSE(plan::parse_weight_format("q4_0").has_value());
}

TEST(Plan, UsersShareTheTokens) {
  const auto p = plan::plan_memory(plan::preset("7b", WeightFormat::kInt8), 16 * kGiB,
                                   plan::kDefaultReserveBytes);
  EXPECT_TRUE(p.fits);
  ASSERT_EQ(p.users.size(), 4u);
  const std::pair<int64_t, int64_t> want[] = {{1, 65378}, {4, 16344}, {16, 4086}, {64, 1021}};
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(p.users[i], want[i]);
}

TEST(Plan, DoesNotFitIsZeroTokens) {
  // 70B fp16: 140e9 B of weights on a 24 GiB card.
  const auto p = plan::plan_memory(plan::preset("70b", WeightFormat::kFp16), 24 * kGiB,
                                   plan::kDefaultReserveBytes);
  EXPECT_FALSE(p.fits);
  EXPECT_LT(p.free_bytes, 0);
  EXPECT_EQ(p.max_tokens, 0);
  for (const auto& [u, ctx] : p.users) EXPECT_EQ(ctx, 0) << u;
  // The reserve alone can push it over.
  EXPECT_EQ(plan::max_resident_tokens(kGiB, kGiB / 2, kGiB, 100), 0);
  EXPECT_EQ(plan::max_resident_tokens(kGiB, 0, 0, 0), 0);
}

TEST(Plan, ParseGib) {
  EXPECT_EQ(plan::parse_gib("16", "--mem"), 16 * kGiB);
  EXPECT_EQ(plan::parse_gib("16G", "--mem"), 16 * kGiB);
  EXPECT_EQ(plan::parse_gib("16g", "--mem"), 16 * kGiB);
  EXPECT_EQ(plan::parse_gib("16GiB", "--mem"), 16 * kGiB);
  EXPECT_EQ(plan::parse_gib("1.5G", "--reserve", true), kGiB * 3 / 2);
  EXPECT_EQ(plan::parse_gib("0", "--reserve", true), 0);
  for (const char* bad : {"", "G", "abc", "16GB", "16 G", "1e3", "0x10", "inf", "nan", "1.2.3",
                          "-1", "0", "-0.5G", "2000000"}) {
    SCOPED_TRACE(bad);
    try {
      plan::parse_gib(bad, "--mem");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--mem: ", 0), 0u) << e.what();
    }
  }
  EXPECT_THROW(plan::parse_gib("-1", "--reserve", true), Error);
}

TEST(Plan, UnknownPresetNamesTheKnownOnes) {
  try {
    plan::preset("7x", WeightFormat::kFp16);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'7x' (known: 7b, 13b, 70b)"), std::string::npos)
        << e.what();
  }
}

TEST(Plan, FromGgufTakesTheFilesBytesAndShape) {
  const GgufFile f = GgufFile::open(test::tiny_model("stories260K.gguf"));
  const ModelConfig c = ModelConfig::from_gguf(f);
  int64_t bytes = 0, elements = 0;
  for (const auto& t : f.tensors()) {
    bytes += static_cast<int64_t>(t.n_bytes);
    elements += t.n_elements;
  }
  const auto m = plan::from_gguf(f, std::nullopt);
  EXPECT_TRUE(m.from_file);
  EXPECT_EQ(m.weight_bytes, bytes);
  EXPECT_EQ(m.n_params, elements);
  EXPECT_EQ(m.kv_bytes_per_token(), c.kv_bytes_per_token());
  EXPECT_EQ(m.kv_bytes_per_token(), 2 * 5 * 4 * 8 * 2);
  const auto q = plan::from_gguf(f, WeightFormat::kInt4);
  EXPECT_EQ(q.weight_bytes, plan::weight_bytes(elements, WeightFormat::kInt4));
}

TEST(Plan, DescribeKvPool) {
  EXPECT_EQ(plan::describe_kv_pool(4096, 4096, 24576),
            "KV pool: 4096 tokens (96.0 MiB, fp16): 1 user x 4096 context, or 4 x 1024, 16 x 256");
  // A pool larger than one context: each user at most n_ctx.
  EXPECT_EQ(plan::describe_kv_pool(65536, 4096, 131072),
            "KV pool: 65536 tokens (8.00 GiB, fp16): 1 user x 4096 context, or 4 x 4096, 16 x "
            "4096, 64 x 1024");
  // A short context: the counts that still get all of it (at most 256) are shown.
  EXPECT_EQ(plan::describe_kv_pool(512, 128, 640),
            "KV pool: 512 tokens (0.3 MiB, fp16): 1 user x 128 context, or 4 x 128");
  EXPECT_EQ(plan::describe_kv_pool(16, 16, 640),
            "KV pool: 16 tokens (0.0 MiB, fp16): 1 user x 16 context");
}

TEST(Plan, GroupThousands) {
  EXPECT_EQ(plan::group_thousands(0), "0");
  EXPECT_EQ(plan::group_thousands(337), "337");
  EXPECT_EQ(plan::group_thousands(3136), "3,136");
  EXPECT_EQ(plan::group_thousands(65378), "65,378");
  EXPECT_EQ(plan::group_thousands(-1234567), "-1,234,567");
}

// ---- the CLI ----------------------------------------------------------------------

int count_error_lines(const std::string& s) {
  int n = 0;
  for (size_t p = 0; p < s.size();) {
    if (s.compare(p, 7, "error: ") == 0) ++n;
    const size_t e = s.find('\n', p);
    if (e == std::string::npos) break;
    p = e + 1;
  }
  return n;
}

TEST(PlanCli, ReferenceTables) {
  const auto r7 = test::run_cli("plan --preset 7b --weights int8 --mem 16G");
  ASSERT_EQ(r7.status, 0) << r7.err;
  EXPECT_NE(r7.out.find("16 GiB: 65,378 tokens"), std::string::npos) << r7.out;
  EXPECT_NE(r7.out.find("|    64 |            1,021 |"), std::string::npos) << r7.out;
  EXPECT_TRUE(r7.err.empty()) << r7.err;

  const auto r13 = test::run_cli("plan --preset 13b --weights int8 --mem 16GiB");
  ASSERT_EQ(r13.status, 0) << r13.err;
  EXPECT_NE(r13.out.find("16 GiB: 3,136 tokens"), std::string::npos) << r13.out;

  const auto j = test::run_cli("plan --preset 13b --weights int4 --mem 8,16 --json");
  ASSERT_EQ(j.status, 0) << j.err;
  const json doc = json::parse(j.out);
  EXPECT_EQ(doc["model"]["kv_bytes_per_token"], 819200);
  EXPECT_EQ(doc["model"]["weight_bytes"], 6'703'125'000);
  EXPECT_EQ(doc["model"]["bits_per_weight"], 4.125);
  EXPECT_EQ(doc["reserve_bytes"], kGiB * 3 / 2);
  ASSERT_EQ(doc["memory"].size(), 2u);
  EXPECT_EQ(doc["memory"][0]["gib"], 8.0);
  EXPECT_EQ(doc["memory"][0]["max_tokens"], 337);
  EXPECT_EQ(doc["memory"][0]["context_per_user"][1]["users"], 4);
  EXPECT_EQ(doc["memory"][0]["context_per_user"][1]["context"], 84);
}

// -ctk / -ctv: the bytes per token are the types' (13B: 40 layers x 5,120
// values of K and of V per token; q8_0 34 bytes and q4_0 18 per 32 values),
// and the same memory holds more tokens than fp16's 337.
TEST(PlanCli, CacheTypesCountTheirBytes) {
  const auto j =
      test::run_cli("plan --preset 13b --weights int4 --mem 8 --json -ctk q8_0 -ctv q4_0");
  ASSERT_EQ(j.status, 0) << j.err;
  const json doc = json::parse(j.out);
  EXPECT_EQ(doc["model"]["kv_cache_type_k"], "q8_0");
  EXPECT_EQ(doc["model"]["kv_cache_type_v"], "q4_0");
  EXPECT_EQ(doc["model"]["kv_bytes_per_token"], 40 * 5120 / 32 * (34 + 18));
  // fp16 holds 337 tokens; 26 bytes per 32 values in place of 64 hold 64 / 26 times as many.
  EXPECT_GE(doc["memory"][0]["max_tokens"].get<int64_t>(), 337 * 64 / 26);
  const auto bad = test::run_cli("plan --preset 13b --mem 8 -ctv q8_0h");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("q8_0h"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 2) << bad.err;
}

TEST(PlanCli, DoesNotFit) {
  const auto r = test::run_cli("plan --preset 70b --mem 24 --reserve 2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("24 GiB: does not fit"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(0 tokens)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('-'), std::string::npos) << "a negative number: " << r.out;
}

TEST(PlanCli, ModelFile) {
  const auto path = test::tiny_model("stories260K.gguf").string();
  const auto r = test::run_cli("plan -m " + path + " --mem 2 --reserve 0 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json doc = json::parse(r.out);
  const GgufFile f = GgufFile::open(path);
  int64_t bytes = 0;
  for (const auto& t : f.tensors()) bytes += static_cast<int64_t>(t.n_bytes);
  EXPECT_EQ(doc["model"]["source"], "file");
  EXPECT_EQ(doc["model"]["weights"], "file");
  EXPECT_EQ(doc["model"]["weight_bytes"], bytes);
  EXPECT_EQ(doc["model"]["kv_bytes_per_token"], 640);
  EXPECT_EQ(doc["memory"][0]["max_tokens"], (2 * kGiB - bytes) / 640);
}

TEST(PlanCli, BadInputIsOneErrorLine) {
  struct Case {
    std::string args, says;
  };
  for (const Case& c :
       {Case{"plan --preset 8b", "unknown model preset '8b'"},
        Case{"plan --preset 7b --mem 16GB", "--mem: '16GB' is not a size in GiB"},
        Case{"plan --preset 7b --mem 8,lots", "--mem: 'lots'"},
        Case{"plan --preset 7b --reserve=-1", "--reserve: -1 is not a size"},
        Case{"plan --preset 7b --weights int3", "--weights"},
        Case{"plan -m /nonexistent/model.gguf", "/nonexistent/model.gguf"},
        Case{"plan -m " + test::tiny_model("stories260K.gguf").string() + " --preset 7b",
             "excludes"},
        Case{"plan", "name a model"}}) {
    SCOPED_TRACE(c.args);
    const auto r = test::run_cli(c.args);
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_EQ(count_error_lines(r.err), 1) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace barata

namespace barata {
namespace {

// Gemma 3 270M's shape: 3 global layers, 15 local ones of window 512. One
// user's K/V at len tokens is the formula of kv_cache.h, and each user
// count's context is the longest whose users fit.
TEST(PlanSliding, ContextPerUserIsTheLongestThatFits) {
  plan::ModelShape m;
  m.n_layer = 18;
  m.n_head_kv = 1;
  m.head_dim = 256;
  m.weight_bytes = 250 << 20;
  m.n_swa_layers = 15;
  m.n_swa = 512;
  const int64_t per_layer_block = 2 * 16 * 256 * 2;
  // 8192 tokens: 512 blocks per global layer; a local layer keeps blocks
  // from (8192 - 512 - 64) / 16 = 476 on, 36 of them.
  EXPECT_EQ(m.kv_bytes_for(8192), (3 * 512 + 15 * 36) * per_layer_block);
  EXPECT_EQ(m.kv_bytes_for(100), 18 * 7 * per_layer_block);  // inside the window: everything
  const plan::MemoryPlan p = plan::plan_memory(m, 4 * plan::kGiB, plan::kDefaultReserveBytes);
  ASSERT_TRUE(p.fits);
  for (const auto& [u, ctx] : p.users) {
    EXPECT_LE(u * m.kv_bytes_for(ctx), p.free_bytes) << u;
    EXPECT_GT(u * m.kv_bytes_for(ctx + 16), p.free_bytes) << u;
  }
  EXPECT_EQ(p.max_tokens, p.users.front().second);
  // Without the sliding layers (--swa-full) the plan is the linear one.
  plan::ModelShape f = m;
  f.n_swa_layers = 0;
  const plan::MemoryPlan q = plan::plan_memory(f, 4 * plan::kGiB, plan::kDefaultReserveBytes);
  EXPECT_EQ(q.max_tokens, q.free_bytes / f.kv_bytes_per_token());
  EXPECT_GT(p.users[3].second, 3 * q.users[3].second);  // 64 users: over 3x the context
}

}  // namespace
}  // namespace barata
