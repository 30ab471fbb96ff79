// barata batch's logic in the library (barata/batch_run.h): both policies
// give each greedy request the ids it gets alone, the step records add up,
// an interrupt cancels what is left, and the pool is clean afterwards.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "barata/agreement.h"
#include "barata/batch_run.h"
#include "barata/engine.h"
#include "barata/model.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

TEST(BatchRun, TinyBothPoliciesGiveTheIdsOfEachRequestAlone) {
  Model m = Model::load(test::tiny_model("stories260K.gguf"));
  Tokenizer tok = Tokenizer::from_gguf(m.file());
  Engine e(m, {.n_threads = 1, .n_ctx = 128, .cache_tokens = 4 * 128});
  const std::vector<std::string> texts = {"Once upon a time", "Lily and Tom", "The dog",
                                          "One day, a little bird", "She had a red ball"};
  std::vector<Request> rs;
  std::vector<std::string> ids;
  for (size_t i = 0; i < texts.size(); ++i) {
    Request r;
    r.prompt = tok.encode(texts[i], true, false);
    r.sampling.temperature = 0.0f;
    r.max_tokens = 8 + static_cast<int64_t>(i) * 5;
    r.ignore_eos = true;
    rs.push_back(r);
    ids.push_back("r" + std::to_string(i));
  }
  for (BatchPolicy p : {BatchPolicy::kStatic, BatchPolicy::kContinuous}) {
    SCOPED_TRACE(policy_name(p));
    SchedulerOptions o;
    o.policy = p;
    o.slots = 2;
    const PolicyRun run = run_policy(e, tok, o, rs, ids);
    ASSERT_EQ(run.rows.size(), rs.size());
    EXPECT_EQ(run.finished(), static_cast<int64_t>(rs.size()));
    EXPECT_FALSE(run.interrupted);
    for (size_t i = 0; i < rs.size(); ++i) {
      EXPECT_EQ(run.rows[i].id, ids[i]);
      const auto want = greedy_traces(e, {rs[i].prompt}, rs[i].max_tokens).at(0).generated;
      EXPECT_EQ(run.rows[i].output, want) << i;
    }
    EXPECT_EQ(static_cast<int64_t>(run.steps.size()), run.stats.steps);
    int64_t busy = 0;
    for (const StepRecord& s : run.steps) busy += s.busy;
    EXPECT_EQ(busy, run.stats.busy_slot_steps);
    EXPECT_EQ(run.running_max(), 2) << "two slots, five requests";
    EXPECT_GT(run.running_mean(), 1.0);
    EXPECT_EQ(e.blocks().blocks_in_use(), 0);
  }
  // An interrupt after a few polls cancels every request left.
  int polls = 0;
  const PolicyRun cut =
      run_policy(e, tok, SchedulerOptions{.slots = 2}, rs, ids, [&polls] { return ++polls > 3; });
  EXPECT_TRUE(cut.interrupted);
  EXPECT_LT(cut.finished(), static_cast<int64_t>(rs.size()));
  EXPECT_EQ(e.blocks().blocks_in_use(), 0);
}

}  // namespace
}  // namespace barata
