// The library's one-request generation (barata/session.h): a Session and
// generate() give greedy_traces' ids plainly and with each drafter; stop
// strings, -n 0, no cache and an interrupt behave as run documents them.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "barata/agreement.h"
#include "barata/session.h"
#include "barata/speculative.h"
#include "test_util.h"

namespace barata {
namespace {

SessionOptions tiny_options() {
  return {.model = test::tiny_model("stories260K.gguf"), .n_ctx = 128, .n_threads = 1};
}

Generation greedy(Session& s, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                  std::string* streamed = nullptr) {
  Sampler sampler(SamplerOptions{.temperature = 0.0f});
  std::vector<int32_t> all;
  const int seq = s.engine.new_sequence();
  Generation g = generate(s, seq, prompt, all, sampler, o, [&](std::string_view t) {
    if (streamed) streamed->append(t);
  });
  s.engine.free_sequence(seq);
  return g;
}

TEST(Generate, TinyGreedyEqualsGreedyTracesPlainAndSpeculative) {
  Session s(tiny_options());
  const auto prompt = s.tok.encode("Lily and Tom went to the park", true, false);
  const int n = 32;
  const std::vector<int32_t> want = greedy_traces(s.engine, {prompt}, n).at(0).generated;
  LookupDrafter lookup(3);
  Model dm = Model::load(test::tiny_model("stories260K-f16.gguf"));
  Engine de(dm, {.n_threads = 1, .n_ctx = 128});
  ModelDrafter model(de, {.sampling = {.temperature = 0.0f}}, "f16");
  for (Drafter* d : {static_cast<Drafter*>(nullptr), static_cast<Drafter*>(&lookup),
                     static_cast<Drafter*>(&model)}) {
    for (bool automatic : {false, true}) {
      if (!d && automatic) continue;
      SCOPED_TRACE(d ? d->describe() + (automatic ? " auto" : "") : "plain");
      GenerateOptions o{.n_predict = n, .drafter = d, .draft_max = 4, .draft_auto = automatic};
      std::string streamed;
      const Generation g = greedy(s, prompt, o, &streamed);
      // greedy_traces does not stop at an end-of-generation token.
      ASSERT_LE(g.generated.size(), want.size());
      EXPECT_EQ(g.generated, std::vector<int32_t>(want.begin(), want.begin() + g.generated.size()));
      EXPECT_EQ(g.text, streamed);
      if (g.finish != FinishReason::kEos) EXPECT_EQ(g.generated.size(), want.size());
      if (d) {
        EXPECT_EQ(g.spec.accepted + g.spec.verify_passes + g.spec.plain_steps, g.decode_steps())
            << "a verify pass gives its kept drafts and one token, a plain step one";
        EXPECT_LE(g.spec.accepted, g.spec.drafted);
      }
    }
  }
  EXPECT_EQ(s.engine.blocks().blocks_in_use(), 0);
}

TEST(Generate, ZeroPredictNoCacheAndInterrupt) {
  Session s(tiny_options());
  const auto prompt = s.tok.encode("Once upon a time", true, false);
  // -n 0: the prompt is cached, nothing sampled.
  {
    Sampler sampler(SamplerOptions{.temperature = 0.0f});
    std::vector<int32_t> all;
    const int seq = s.engine.new_sequence();
    const Generation g =
        generate(s, seq, prompt, all, sampler, {.n_predict = 0}, [](std::string_view) {});
    EXPECT_TRUE(g.generated.empty());
    EXPECT_EQ(s.engine.length(seq), static_cast<int64_t>(prompt.size()));
    s.engine.free_sequence(seq);
  }
  const Generation cached = greedy(s, prompt, {.n_predict = 12});
  const Generation recomputed = greedy(s, prompt, {.n_predict = 12, .no_cache = true});
  EXPECT_EQ(recomputed.generated, cached.generated);
  int polls = 0;
  const Generation cut =
      greedy(s, prompt, {.n_predict = 12, .interrupted = [&polls] { return ++polls > 4; }});
  EXPECT_TRUE(cut.interrupted());
  EXPECT_LT(cut.generated.size(), cached.generated.size());
  EXPECT_EQ(s.engine.blocks().blocks_in_use(), 0);
}

}  // namespace
}  // namespace barata
