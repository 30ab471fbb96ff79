// The scheduler: over a fake engine whose "KV cache" holds the token ids
// themselves (so a wrong block shows up as a wrong next token), and over the
// real engine on the committed tiny model, where every request's greedy
// output must equal its output run alone, whatever the policy, slots, token
// budget, pool size (preemption) or prefix cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "barata/engine.h"
#include "barata/error.h"
#include "barata/model.h"
#include "barata/grammar.h"
#include "barata/scheduler.h"
#include "barata/speculative.h"
#include "barata/tokenizer.h"
#include "test_util.h"

namespace barata {
namespace {

// A StepEngine whose cache blocks store the tokens written at each slot; a
// row's logits pick a token hashed from the tokens its block table reads back.
class FakeEngine final : public StepEngine {
 public:
  FakeEngine(int64_t n_blocks, int64_t n_ctx = 512, int64_t n_vocab = 97)
      : blocks_(n_blocks),
        n_ctx_(n_ctx),
        n_vocab_(n_vocab),
        store_(static_cast<size_t>(n_blocks * kKvBlockTokens), -1) {}
  KvBlockManager& blocks() override { return blocks_; }
  int64_t n_ctx() const override { return n_ctx_; }
  int64_t n_vocab() const override { return n_vocab_; }
  void forward(Batch& b, float* logits) override {
    std::vector<KvBlockManager::Copy> copies;
    plan_batch(b, blocks_, n_ctx_, n_vocab_, &copies);
    for (const auto& c : copies)
      std::copy_n(store_.begin() + c.from * kKvBlockTokens, kKvBlockTokens,
                  store_.begin() + c.to * kKvBlockTokens);
    for (int64_t t = 0; t < b.size(); ++t)
      store_[static_cast<size_t>(b.rows[static_cast<size_t>(t)].slot)] = b.tokens[t];
    widths.push_back(b.size());
    std::map<int32_t, int64_t> rows_of;
    for (int64_t t = 0; t < b.size(); ++t) ++rows_of[b.seq_ids[t]];
    mixed.push_back(rows_of.size() > 1 && std::any_of(rows_of.begin(), rows_of.end(),
                                                      [](auto& kv) { return kv.second > 1; }));
    int64_t out = 0;
    for (int32_t r : b.logit_rows) {
      const BatchRowMeta& m = b.rows[static_cast<size_t>(r)];
      uint64_t h = 1469598103934665603ULL;
      for (int32_t p = 0; p <= m.pos; ++p) {
        const int32_t blk = b.block_tables[static_cast<size_t>(m.table + p / kKvBlockTokens)];
        const int32_t tok = store_[static_cast<size_t>(blk * kKvBlockTokens + p % kKvBlockTokens)];
        h = (h ^ static_cast<uint32_t>(tok)) * 1099511628211ULL;
      }
      float* row = logits + out * n_vocab_;
      std::fill(row, row + n_vocab_, 0.0f);
      row[1 + (h >> 17) % static_cast<uint64_t>(n_vocab_ - 1)] = 1.0f;  // never 0 (the EOS)
      ++out;
    }
  }
  std::vector<int64_t> widths;
  std::vector<bool> mixed;  // a prefill chunk rode with another sequence's rows

 private:
  KvBlockManager blocks_;
  int64_t n_ctx_, n_vocab_;
  std::vector<int32_t> store_;
};

SamplerOptions greedy() {
  SamplerOptions s;
  s.temperature = 0;
  return s;
}

Request req(int64_t prompt_len, int64_t max_tokens, int32_t salt, int64_t shared = 0) {
  Request r;
  for (int64_t i = 0; i < prompt_len; ++i)
    r.prompt.push_back(
        static_cast<int32_t>(i < shared ? 1 + (i * 7) % 90 : 1 + (salt * 31 + i * 13) % 90));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling = greedy();
  return r;
}

std::vector<Request> mixed_requests(int64_t shared = 0) {
  const int64_t lens[] = {5, 40, 17, 3, 33, 9, 64, 1, 22, 16};
  const int64_t outs[] = {12, 3, 30, 7, 1, 25, 4, 18, 9, 16};
  std::vector<Request> rs;
  for (int i = 0; i < 10; ++i) rs.push_back(req(lens[i] + shared, outs[i], i, shared));
  return rs;
}

using Outputs = std::vector<std::vector<int32_t>>;

Outputs run_all(StepEngine& e, const std::vector<Request>& rs, SchedulerOptions o,
                SchedulerStats* stats = nullptr) {
  Scheduler s(e, o);
  for (const Request& r : rs) s.submit(r);
  s.run();
  Outputs out;
  for (int64_t i = 0; i < s.n_sequences(); ++i) {
    const Sequence& q = s.sequence(static_cast<int>(i));
    EXPECT_EQ(q.status, SeqStatus::kFinished) << i << ": " << q.error;
    out.emplace_back(q.output().begin(), q.output().end());
  }
  if (stats) *stats = s.stats();
  return out;
}

// Each request alone, one slot, a pool big enough, no prefix cache.
Outputs run_alone(const std::vector<Request>& rs, std::function<std::unique_ptr<StepEngine>()> mk) {
  Outputs out;
  for (const Request& r : rs) {
    auto e = mk();
    SchedulerOptions o;
    o.slots = 1;
    o.prefix_cache = false;
    out.push_back(run_all(*e, {r}, o).front());
  }
  return out;
}

std::unique_ptr<StepEngine> fake(int64_t blocks = 256) {
  return std::make_unique<FakeEngine>(blocks);
}

TEST(Scheduler, ContinuousEqualsAloneAtAnySlotsAndBudget) {
  const auto rs = mixed_requests();
  const Outputs alone = run_alone(rs, [] { return fake(); });
  for (int slots : {1, 3, 8}) {
    for (int64_t budget : {1, 7, 512}) {
      FakeEngine e(256);
      SchedulerOptions o;
      o.slots = slots;
      o.max_batch_tokens = budget;
      SchedulerStats st;
      EXPECT_EQ(run_all(e, rs, o, &st), alone) << slots << " slots, budget " << budget;
      for (int64_t w : e.widths) EXPECT_LE(w, budget);
      EXPECT_EQ(st.preemptions, 0);
      EXPECT_EQ(e.blocks().blocks_in_use(), 0) << "every block returned";
    }
  }
}

TEST(Scheduler, ChunkedPrefillRidesWithDecodeRows) {
  FakeEngine e(256);
  SchedulerOptions o;
  o.slots = 4;
  o.max_batch_tokens = 8;
  Scheduler s(e, o);
  s.submit(req(4, 20, 1));
  s.step();  // the short prompt alone
  s.step();  // it decodes
  s.submit(req(50, 2, 2));
  const StepInfo i = s.step();
  EXPECT_EQ(i.decode_rows, 1);
  EXPECT_EQ(i.prefill_rows, 7) << "the long prompt takes what the budget leaves";
  EXPECT_TRUE(e.mixed.back());
  s.run();
  EXPECT_EQ(s.sequence(1).prefill_rows, 50);
  EXPECT_EQ(s.sequence(0).output().size(), 20u);
}

TEST(Scheduler, AdmissionIsFirstComeFirstServed) {
  FakeEngine e(256);
  SchedulerOptions o;
  o.slots = 2;
  Scheduler s(e, o);
  for (int i = 0; i < 6; ++i) s.submit(req(3 + i, 2 + (5 - i), i));
  s.run();
  for (int i = 1; i < 6; ++i)
    EXPECT_LE(s.sequence(i - 1).admit_order, s.sequence(i).admit_order) << i;
  // Two slots: the third request is admitted only when one of the first two finishes.
  EXPECT_GE(s.sequence(2).step_admitted,
            std::min(s.sequence(0).step_finished, s.sequence(1).step_finished));
}

TEST(Scheduler, NoStarvationOfABigRequestAtTheFront) {
  // 12 blocks: the 100-token prompt needs 7; small requests behind it must
  // not overtake it forever.
  FakeEngine e(12);
  SchedulerOptions o;
  o.slots = 4;
  Scheduler s(e, o);
  s.submit(req(40, 30, 0));
  s.submit(req(100, 4, 1));
  for (int i = 2; i < 12; ++i) s.submit(req(10, 5, i));
  s.run();
  EXPECT_EQ(s.sequence(1).status, SeqStatus::kFinished);
  for (int i = 2; i < 12; ++i) EXPECT_GT(s.sequence(i).admit_order, s.sequence(1).admit_order);
}

TEST(Scheduler, PreemptionRecomputesAndChangesNothing) {
  const auto rs = mixed_requests();
  const Outputs alone = run_alone(rs, [] { return fake(); });
  // 10 blocks of 16 tokens: the longest request (64 + 4) alone needs 5.
  FakeEngine e(10);
  SchedulerOptions o;
  o.slots = 6;
  SchedulerStats st;
  EXPECT_EQ(run_all(e, rs, o, &st), alone);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(e.blocks().blocks_in_use(), 0);
}

TEST(Scheduler, PreemptsTheYoungestFirst) {
  FakeEngine e(6);
  SchedulerOptions o;
  o.slots = 3;
  o.prefix_cache = false;
  Scheduler s(e, o);
  for (int i = 0; i < 3; ++i) s.submit(req(20, 40, i));  // 2 blocks each, growing to 4
  int first_victim = -1;
  while (!s.idle()) {
    s.step();
    for (int i = 0; i < 3 && first_victim < 0; ++i)
      if (s.sequence(i).n_preemptions > 0) first_victim = i;
  }
  EXPECT_EQ(first_victim, 2);
  EXPECT_EQ(s.sequence(0).n_preemptions, 0) << "the oldest runs through";
}

TEST(Scheduler, StaticBatchingPadsAndMatches) {
  const auto rs = mixed_requests();
  const Outputs alone = run_alone(rs, [] { return fake(); });
  FakeEngine e(256);
  SchedulerOptions o;
  o.slots = 4;
  o.policy = BatchPolicy::kStatic;
  SchedulerStats st;
  EXPECT_EQ(run_all(e, rs, o, &st), alone);
  EXPECT_GT(st.padding_slot_steps, 0);
  EXPECT_EQ(st.padding_rows, st.padding_slot_steps) << "padding is computed";
  // Batches of 4 in order: {12,3,30,7} {1,25,4,18} {9,16}: 30 + 25 + 16 decode-or-prefill steps.
  int64_t useful = 0;
  for (const auto& r : rs) useful += r.max_tokens;
  EXPECT_EQ(st.generated_tokens, useful);
  const int64_t slot_steps = st.busy_slot_steps + st.padding_slot_steps;
  EXPECT_EQ(st.padding_slot_steps, slot_steps - st.busy_slot_steps);
  // Later batches start only after the earlier one has wholly finished.
  Scheduler s(e, o);
  for (const auto& r : rs) s.submit(r);
  s.run();
  int64_t end0 = 0;
  for (int i = 0; i < 4; ++i) end0 = std::max(end0, s.sequence(i).step_finished);
  for (int i = 4; i < 8; ++i) EXPECT_GE(s.sequence(i).step_admitted, end0);
  // The batch's results are delivered together, when its longest member ends.
  for (int i = 0; i < 4; ++i) {
    EXPECT_LE(s.sequence(i).t_last_token, s.sequence(i).t_finished);
    EXPECT_EQ(s.sequence(i).t_finished, s.sequence(2).t_last_token) << i;  // 30 tokens, the longest
  }
  EXPECT_LT(s.sequence(1).t_last_token, s.sequence(1).t_finished);
}

TEST(Scheduler, StaticWithPreemptionMatches) {
  // Five prompts of 17 tokens (2 blocks each) fill a pool of 10 blocks; as
  // they grow towards 57 tokens the youngest are preempted.
  std::vector<Request> rs;
  for (int i = 0; i < 7; ++i) rs.push_back(req(17, 40 - 3 * i, i));
  const Outputs alone = run_alone(rs, [] { return fake(); });
  FakeEngine e(10);
  SchedulerOptions o;
  o.slots = 5;
  o.policy = BatchPolicy::kStatic;
  SchedulerStats st;
  EXPECT_EQ(run_all(e, rs, o, &st), alone);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(e.blocks().blocks_in_use(), 0);
}

TEST(Scheduler, PrefixCacheSharesBlocksAndChangesNothing) {
  const auto rs = mixed_requests(/*shared=*/48);
  const Outputs alone = run_alone(rs, [] { return fake(); });
  FakeEngine e(512);
  SchedulerOptions o;
  o.slots = 4;
  Scheduler s(e, o);
  int64_t max_shared = 0;
  s.on_token = [&](const Sequence&, int32_t) {
    max_shared = std::max(max_shared, e.blocks().shared_blocks());
  };
  for (const auto& r : rs) s.submit(r);
  s.run();
  Outputs out;
  for (int i = 0; i < 10; ++i)
    out.emplace_back(s.sequence(i).output().begin(), s.sequence(i).output().end());
  EXPECT_EQ(out, alone);
  EXPECT_GE(max_shared, 3) << "the 48-token prefix is 3 blocks held by several sequences";
  // The first four, admitted together, each compute the prefix (it is
  // published once written); the six admitted later take its 3 blocks.
  EXPECT_EQ(s.stats().prefix_hit_tokens, 6 * 48);
  EXPECT_EQ(s.sequence(1).prefix_hit_tokens, 0);
  EXPECT_EQ(s.sequence(5).prefix_hit_tokens, 48);
  EXPECT_EQ(s.sequence(5).prefill_rows, 9);
}

TEST(Scheduler, PrefixCacheEvictsUnderPressure) {
  const auto rs = mixed_requests(/*shared=*/32);
  const Outputs alone = run_alone(rs, [] { return fake(); });
  FakeEngine e(9);
  SchedulerOptions o;
  o.slots = 3;
  SchedulerStats st;
  EXPECT_EQ(run_all(e, rs, o, &st), alone);
  EXPECT_GT(e.blocks().prefix_stats().evictions, 0);
  EXPECT_GT(st.prefix_hit_tokens, 0);
}

TEST(Scheduler, ABadRequestFailsAloneAndTheOthersRun) {
  FakeEngine e(8, /*n_ctx=*/100);
  SchedulerOptions o;
  Scheduler s(e, o);
  s.submit(req(5, 3, 0));
  s.submit(req(150, 3, 1));  // longer than the context
  Request bad = req(5, 3, 2);
  bad.prompt[2] = 1000;  // outside the vocabulary
  s.submit(bad);
  s.submit(req(0, 3, 3));  // empty
  FakeEngine small(4, 512);
  Scheduler s2(small, o);
  s2.submit(req(70, 3, 4));  // the whole pool holds 64 tokens
  s.submit(req(7, 4, 5));
  s.run();
  s2.run();
  EXPECT_EQ(s.sequence(0).status, SeqStatus::kFinished);
  EXPECT_EQ(s.sequence(1).status, SeqStatus::kFailed);
  EXPECT_NE(s.sequence(1).error.find("context holds 100"), std::string::npos)
      << s.sequence(1).error;
  EXPECT_EQ(s.sequence(2).status, SeqStatus::kFailed);
  EXPECT_NE(s.sequence(2).error.find("vocabulary"), std::string::npos);
  EXPECT_EQ(s.sequence(3).status, SeqStatus::kFailed);
  EXPECT_EQ(s.sequence(4).status, SeqStatus::kFinished);
  EXPECT_EQ(s.sequence(4).output().size(), 4u);
  EXPECT_EQ(s2.sequence(0).status, SeqStatus::kFailed);
  EXPECT_NE(s2.sequence(0).error.find("whole KV pool holds 64"), std::string::npos)
      << s2.sequence(0).error;
  EXPECT_EQ(s.stats().failed, 3);
}

TEST(Scheduler, StopsAtEosContextAndMaxTokens) {
  const Request a = req(10, 20, 0);
  FakeEngine e0(64);
  const std::vector<int32_t> free_run = run_all(e0, {a}, SchedulerOptions{}).front();
  // The first token that did not come before: the end-of-generation id.
  size_t k = 3;
  while (std::find(free_run.begin(), free_run.begin() + static_cast<long>(k), free_run[k]) !=
         free_run.begin() + static_cast<long>(k))
    ++k;
  const int32_t eog = free_run[k];
  FakeEngine e(64, /*n_ctx=*/40);
  SchedulerOptions o;
  o.is_eog = [eog](int32_t t) { return t == eog; };
  Scheduler s(e, o);
  Request stops = a;
  stops.ignore_eos = false;
  s.submit(stops);            // stops at the end-of-generation token
  s.submit(a);                // ignores it: the 20 tokens
  s.submit(req(10, 100, 0));  // fills the context of 40
  s.run();
  EXPECT_EQ(s.sequence(0).finish, FinishReason::kEos);
  EXPECT_EQ(s.sequence(0).output().size(), k + 1);
  EXPECT_EQ(s.sequence(0).output().back(), eog);
  EXPECT_EQ(s.sequence(1).finish, FinishReason::kLength);
  EXPECT_EQ(s.sequence(1).output().size(), 20u);
  EXPECT_EQ(s.sequence(2).finish, FinishReason::kContext);
  EXPECT_EQ(s.sequence(2).tokens.size(), 40u);
}

// A long-running server submits, runs and forgets without end: ids are
// reused once forgotten (the smallest first), so the scheduler's tables stay
// as small as the requests alive at once, and a reused id carries its new
// request's tag.
TEST(Scheduler, IdsAreRecycledAfterForgetAndStorageIsBounded) {
  FakeEngine e(64);
  SchedulerOptions o;
  o.slots = 3;
  Scheduler s(e, o);
  std::vector<int> to_forget;
  s.on_finish = [&](const Sequence& q) { to_forget.push_back(q.id); };
  const auto rs = mixed_requests();
  uint64_t tag = 0;
  for (int round = 0; round < 300; ++round) {
    for (int k = 0; k < 3; ++k) {
      Request r = rs[static_cast<size_t>((round + k) % rs.size())];
      r.tag = ++tag;
      const int id = s.submit(r);
      ASSERT_LT(id, 4) << "round " << round;
      EXPECT_EQ(s.sequence(id).req.tag, tag);
    }
    // One of them stays for the next round, so that ids interleave.
    while (s.n_running() + s.n_waiting() > 1) {
      s.step();
      for (int id : to_forget) s.forget(id);
      to_forget.clear();
    }
    ASSERT_LE(s.n_sequences(), 4);
    ASSERT_LE(s.n_held(), 4);
  }
  s.run();
  for (int id : to_forget) s.forget(id);
  EXPECT_EQ(s.n_held(), 0);
  EXPECT_EQ(e.blocks().blocks_in_use(), 0);
  // Never forgotten, ids are submission order from the smallest free one.
  Scheduler fresh(e, o);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(fresh.submit(rs[0]), k);
}

// Without a cache (run --no-kv-cache): each token recomputes the whole
// context, so step widths grow by one, and the tokens are the cached run's.
TEST(Scheduler, RecomputeModeEqualsCachedAndRecomputesEverything) {
  const auto rs = mixed_requests();
  const Outputs alone = run_alone(rs, [] { return fake(); });
  for (size_t i : {0, 2, 7}) {
    FakeEngine e(256);
    SchedulerOptions o;
    o.slots = 1;
    o.prefix_cache = false;
    o.recompute = true;
    EXPECT_EQ(run_all(e, {rs[i]}, o).front(), alone[i]);
    const int64_t n_prompt = static_cast<int64_t>(rs[i].prompt.size());
    ASSERT_EQ(e.widths.size(), alone[i].size()) << "one forward per token";
    for (size_t k = 0; k < e.widths.size(); ++k)
      EXPECT_EQ(e.widths[k], n_prompt + static_cast<int64_t>(k)) << "step " << k;
    EXPECT_EQ(e.blocks().blocks_in_use(), 0);
  }
}

// prefill_only (run -n 0, a chat's /load): the caller's sequence is left
// holding the whole prompt, nothing is sampled, and the next turn continues.
TEST(Scheduler, PrefillOnlyLeavesThePromptCached) {
  FakeEngine e(256);
  SchedulerOptions o;
  o.max_batch_tokens = 16;  // in chunks
  const auto rs = mixed_requests();
  const int kv = e.blocks().new_sequence();
  Scheduler s(e, o);
  Request r = rs[6];  // 64 tokens
  r.kv_seq = kv;
  r.prefill_only = true;
  r.max_tokens = 0;
  const int id = s.submit(r);
  s.run();
  EXPECT_EQ(s.sequence(id).finish, FinishReason::kLength);
  EXPECT_TRUE(s.sequence(id).output().empty());
  EXPECT_EQ(e.blocks().length(kv), 64);
  // The next turn reads nothing again but its last token.
  Request next = rs[6];
  next.kv_seq = kv;
  const int id2 = s.submit(next);
  const size_t steps_before = e.widths.size();
  s.run();
  EXPECT_EQ(std::vector<int32_t>(s.sequence(id2).output().begin(), s.sequence(id2).output().end()),
            run_alone({rs[6]}, [] { return fake(); }).front());
  EXPECT_EQ(e.widths[steps_before], 1) << "the prompt was in the cache";
}

TEST(Scheduler, ArrivalsWaitForTheirTime) {
  FakeEngine e(64);
  double t = 0;
  SchedulerOptions o;
  o.clock = [&t] { return t; };
  Scheduler s(e, o);
  Request late = req(5, 3, 0);
  late.arrival_s = 10;
  s.submit(late);
  EXPECT_EQ(s.step().rows, 0) << "nothing has arrived";
  t = 10;
  EXPECT_EQ(s.step().rows, 5);
  EXPECT_EQ(s.sequence(0).t_admitted, 10);
}

TEST(Scheduler, UsageErrors) {
  FakeEngine e(8);
  SchedulerOptions o;
  o.slots = 0;
  EXPECT_THROW(Scheduler(e, o), Error);
  o.slots = 1;
  o.max_batch_tokens = -3;
  EXPECT_THROW(Scheduler(e, o), Error);
}

// ---- the real engine ---------------------------------------------------------

// ---- speculative decoding as a mode of the step ------------------------------

// A drafter that knows the answer: it proposes the plain run's next tokens
// but gets every wrong_every-th proposed token wrong, so that verify passes
// keep some drafts and reject others.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(std::vector<int32_t> full, int wrong_every)
      : full_(std::move(full)), wrong_every_(wrong_every) {}
  void propose(std::span<const int32_t> ctx, int n, Draft& out) override {
    out.tokens.clear();
    out.q.clear();
    for (int i = 0; i < n; ++i) {
      const size_t at = ctx.size() + static_cast<size_t>(i);
      if (at >= full_.size()) break;
      int32_t t = full_[at];
      if (++proposed_ % wrong_every_ == 0) t = t == 1 ? 2 : 1;
      out.tokens.push_back(t);
    }
  }
  std::string describe() const override { return "oracle"; }
  bool uses_model() const override { return false; }

 private:
  std::vector<int32_t> full_;
  int wrong_every_;
  int64_t proposed_ = 0;
};

// Request i's drafter knows its plain answer (alone[i]); odd requests decode
// plainly, so speculating and plain sequences share the steps.
SchedulerOptions oracle_options(const std::vector<Request>& rs, const Outputs& alone,
                                bool every_request = false) {
  SchedulerOptions o;
  o.drafter_for = [&rs, &alone, every_request](const Request& r) -> std::unique_ptr<Drafter> {
    const int i = std::stoi(r.id);
    if (!every_request && i % 2 == 1) return nullptr;
    std::vector<int32_t> full = rs[static_cast<size_t>(i)].prompt;
    full.insert(full.end(), alone[static_cast<size_t>(i)].begin(),
                alone[static_cast<size_t>(i)].end());
    return std::make_unique<OracleDrafter>(std::move(full), 3 + i % 3);
  };
  o.draft_max = 5;
  return o;
}

std::vector<Request> named(std::vector<Request> rs) {
  for (size_t i = 0; i < rs.size(); ++i) rs[i].id = std::to_string(i);
  return rs;
}

TEST(SchedulerSpec, VerifyChunksKeepThePlainIdsAtAnySlotsAndBudget) {
  const auto rs = named(mixed_requests());
  const Outputs alone = run_alone(rs, [] { return fake(); });
  for (int slots : {1, 3, 8}) {
    for (int64_t budget : {1, 7, 512}) {
      FakeEngine e(256);
      SchedulerOptions o = oracle_options(rs, alone);
      o.slots = slots;
      o.max_batch_tokens = budget;
      SchedulerStats st;
      EXPECT_EQ(run_all(e, rs, o, &st), alone) << slots << " slots, budget " << budget;
      if (budget == 1) {
        EXPECT_EQ(st.draft_rows, 0) << "a budget of one row leaves nothing for drafts";
        continue;
      }
      EXPECT_GT(st.accepted, 0) << slots << " slots, budget " << budget << ": " << st.draft_rows
                                << " drafted, " << st.verify_passes << " passes";
      if (budget == 512) EXPECT_GT(st.draft_rows, st.accepted) << "some drafts were rejected";
      EXPECT_EQ(e.blocks().blocks_in_use(), 0);
      if (slots == 8 && budget == 512)
        EXPECT_TRUE(std::find(e.mixed.begin(), e.mixed.end(), true) != e.mixed.end())
            << "a verify chunk rode with other sequences' rows";
    }
  }
}

TEST(SchedulerSpec, PreemptionAndAStaticBatchWhileSpeculatingChangeNothing) {
  const auto rs = named(mixed_requests());
  const Outputs alone = run_alone(rs, [] { return fake(); });
  for (BatchPolicy policy : {BatchPolicy::kContinuous, BatchPolicy::kStatic}) {
    FakeEngine e(10);  // as PreemptionRecomputesAndChangesNothing: preemption
    SchedulerOptions o = oracle_options(rs, alone, /*every_request=*/true);
    o.policy = policy;
    o.slots = 6;
    SchedulerStats st;
    EXPECT_EQ(run_all(e, rs, o, &st), alone) << policy_name(policy);
    EXPECT_GT(st.preemptions, 0) << policy_name(policy);
    EXPECT_GT(st.accepted, 0) << policy_name(policy);
    EXPECT_EQ(e.blocks().blocks_in_use(), 0);
  }
}

TEST(SchedulerSpec, ARepetitionPenaltyFailsTheSpeculatingRequestAlone) {
  const auto rs = named(mixed_requests());
  const Outputs alone = run_alone(rs, [] { return fake(); });
  FakeEngine e(256);
  Scheduler s(e, oracle_options(rs, alone));
  Request bad = rs[0];
  bad.sampling.repeat_penalty = 1.1f;
  const int a = s.submit(bad);
  const int b = s.submit(rs[2]);
  s.run();
  EXPECT_EQ(s.sequence(a).status, SeqStatus::kFailed);
  EXPECT_NE(s.sequence(a).error.find("repetition penalty"), std::string::npos)
      << s.sequence(a).error;
  EXPECT_EQ(std::vector<int32_t>(s.sequence(b).output().begin(), s.sequence(b).output().end()),
            alone[2]);
}

struct Tiny {
  Model model = Model::load(test::tiny_model("stories260K.gguf"));
  std::unique_ptr<Engine> engine(int64_t kv_tokens) {
    return std::make_unique<Engine>(
        model, EngineOptions{.n_threads = 2, .n_ctx = 256, .cache_tokens = kv_tokens});
  }
};

class EngineOwner final : public StepEngine {
 public:
  explicit EngineOwner(std::unique_ptr<Engine> e) : e_(std::move(e)), steps_(*e_) {}
  KvBlockManager& blocks() override { return steps_.blocks(); }
  int64_t n_ctx() const override { return steps_.n_ctx(); }
  int64_t n_vocab() const override { return steps_.n_vocab(); }
  void forward(Batch& b, float* logits) override { steps_.forward(b, logits); }

 private:
  std::unique_ptr<Engine> e_;
  EngineSteps steps_;
};

std::vector<Request> tiny_requests(int64_t shared = 0) {
  std::vector<Request> rs = mixed_requests(shared);
  for (auto& r : rs) {
    r.max_tokens = std::min<int64_t>(r.max_tokens, 14);
    for (auto& t : r.prompt) t = 1 + t % 500;  // stories260K has 512 tokens
  }
  return rs;
}

TEST(SchedulerEngine, BatchInvarianceOnTheTinyModel) {
  Tiny tiny;
  const auto rs = tiny_requests();
  const Outputs alone =
      run_alone(rs, [&] { return std::make_unique<EngineOwner>(tiny.engine(256)); });
  struct Case {
    BatchPolicy policy;
    int slots;
    int64_t budget, kv_tokens;
    bool preempts;
  };
  for (const Case& c : {Case{BatchPolicy::kContinuous, 4, 512, 4096, false},
                        Case{BatchPolicy::kContinuous, 3, 7, 4096, false},
                        Case{BatchPolicy::kContinuous, 6, 512, 160, true},
                        Case{BatchPolicy::kStatic, 4, 512, 4096, false},
                        Case{BatchPolicy::kStatic, 5, 16, 160, true}}) {
    EngineOwner e(tiny.engine(c.kv_tokens));
    SchedulerOptions o;
    o.policy = c.policy;
    o.slots = c.slots;
    o.max_batch_tokens = c.budget;
    SchedulerStats st;
    EXPECT_EQ(run_all(e, rs, o, &st), alone)
        << policy_name(c.policy) << " " << c.slots << " slots, budget " << c.budget << ", "
        << c.kv_tokens << " KV tokens";
    EXPECT_EQ(st.preemptions > 0, c.preempts) << st.preemptions;
  }
}

TEST(SchedulerEngine, PrefixCacheOnTheTinyModel) {
  Tiny tiny;
  const auto rs = tiny_requests(/*shared=*/64);
  const Outputs alone =
      run_alone(rs, [&] { return std::make_unique<EngineOwner>(tiny.engine(512)); });
  for (bool cache : {false, true}) {
    EngineOwner e(tiny.engine(2048));
    SchedulerOptions o;
    o.slots = 4;
    o.prefix_cache = cache;
    SchedulerStats st;
    EXPECT_EQ(run_all(e, rs, o, &st), alone) << "prefix cache " << cache;
    EXPECT_EQ(st.prefix_hit_tokens, cache ? 6 * 64 : 0);
  }
}

// n samples of one prompt (Scheduler::submit_samples): the others fork the
// first's cache once its prompt is computed (the prompt's blocks shared, one
// row each recomputed), and each equals its seed run alone, also when a
// small pool preempts them or one is cancelled while it waits.
TEST(SchedulerEngine, SamplesForkThePromptAndEqualTheirSeedsAlone) {
  Tiny tiny;
  Request r;
  for (int i = 0; i < 37; ++i) r.prompt.push_back(1 + (i * 37) % 500);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 11;
  r.max_tokens = 60;
  constexpr int kN = 4;
  const auto output = [](const Scheduler& s, int id) {
    return std::vector<int32_t>(s.sequence(id).output().begin(), s.sequence(id).output().end());
  };
  Outputs alone;
  for (int i = 0; i < kN; ++i) {
    EngineOwner e(tiny.engine(512));
    Scheduler s(e, {});
    Request q = r;
    q.sampling.seed = r.sampling.seed + static_cast<uint64_t>(i);
    const int id = s.submit(q);
    s.run();
    alone.push_back(output(s, id));
  }
  EXPECT_NE(alone[0], alone[1]) << "the seeds should give different samples";

  struct Case {
    int64_t kv_tokens;
    bool preempts;
  };
  for (const Case c : {Case{512, false}, Case{160, true}}) {
    EngineOwner e(tiny.engine(c.kv_tokens));
    SchedulerOptions o;
    o.slots = kN;
    o.prefix_cache = false;  // the sharing is the fork's alone
    Scheduler s(e, o);
    int64_t max_shared = 0;
    s.on_token = [&](const Sequence&, int32_t) {
      max_shared = std::max(max_shared, e.blocks().shared_blocks());
    };
    const std::vector<int> ids = s.submit_samples(r, kN);
    ASSERT_EQ(ids.size(), static_cast<size_t>(kN));
    s.run();
    for (int i = 0; i < kN; ++i)
      EXPECT_EQ(output(s, ids[static_cast<size_t>(i)]), alone[static_cast<size_t>(i)])
          << "sample " << i << ", " << c.kv_tokens << " KV tokens";
    EXPECT_EQ(s.stats().sample_forks, kN - 1);
    EXPECT_EQ(s.stats().preemptions > 0, c.preempts) << s.stats().preemptions;
    if (!c.preempts) {
      // The prompt's 3 blocks (2 full, 1 partly filled) held by the samples;
      // the others computed one row each instead of the 37-token prompt.
      EXPECT_GE(max_shared, 2);
      EXPECT_EQ(s.stats().prefill_rows, 37 + (kN - 1));
    }
    EXPECT_EQ(e.blocks().free_blocks(), e.blocks().max_blocks()) << "every fork freed";
  }

  // A sample cancelled while it waits for the first's prompt: the others run.
  EngineOwner e(tiny.engine(512));
  Scheduler s(e, {});
  const std::vector<int> ids = s.submit_samples(r, 3);
  s.cancel(ids[1]);
  s.run();
  EXPECT_EQ(s.sequence(ids[1]).finish, FinishReason::kCancelled);
  EXPECT_EQ(output(s, ids[0]), alone[0]);
  EXPECT_EQ(output(s, ids[2]), alone[2]);
  EXPECT_EQ(s.stats().sample_forks, 1);
  EXPECT_EQ(e.blocks().free_blocks(), e.blocks().max_blocks());
}

TEST(SchedulerEngine, StopStringsCutTheTextAndEndTheRequest) {
  Tiny tiny;
  const Tokenizer tok = Tokenizer::from_gguf(tiny.model.file());
  EngineOwner e(tiny.engine(1024));
  SchedulerOptions o;
  o.tokenizer = &tok;
  Request r;
  r.prompt = tok.encode("Once upon a time", true, false);
  r.sampling = greedy();
  r.max_tokens = 40;
  r.ignore_eos = true;
  // The free run's text, then a stop string from its middle.
  Scheduler free_run(e, o);
  const int a = free_run.submit(r);
  std::string streamed;
  free_run.on_text = [&](const Sequence&, std::string_view piece) { streamed += piece; };
  free_run.run();
  const std::string text = free_run.sequence(a).text;
  ASSERT_GT(text.size(), 20u) << text;
  EXPECT_EQ(streamed, text) << "the pieces add up to the text";
  const std::string stop = text.substr(10, 4);
  const size_t at = text.find(stop);
  Scheduler stopped(e, o);
  r.stop = {stop, "a string that never comes"};
  std::string streamed2;
  stopped.on_text = [&](const Sequence&, std::string_view piece) { streamed2 += piece; };
  const int b = stopped.submit(r);
  stopped.run();
  const Sequence& q = stopped.sequence(b);
  EXPECT_EQ(q.finish, FinishReason::kStop);
  EXPECT_EQ(q.text, text.substr(0, at)) << "the text ends before the stop string";
  EXPECT_EQ(streamed2, q.text) << "nothing of the stop string was streamed";
  EXPECT_LT(q.output().size(), free_run.sequence(a).output().size());
  EXPECT_EQ(e.blocks().blocks_in_use(), 0);
}

// Greedy speculative decoding in the step, on the real engine: n-gram
// lookup and the model as its own draft (a ModelDrafter per sequence on a
// second engine whose pool holds every slot's context) give the plain ids,
// at one slot and at four, with a small budget too.
TEST(SchedulerSpec, LookupAndModelDraftsGiveThePlainIdsOnTheTinyModel) {
  Tiny tiny;
  auto rs = tiny_requests();
  for (auto& r : rs) r.max_tokens = 24;
  const Outputs alone =
      run_alone(rs, [&] { return std::make_unique<EngineOwner>(tiny.engine(256)); });
  Engine draft(tiny.model, EngineOptions{.n_threads = 1, .n_ctx = 256, .cache_tokens = 4 * 256});
  for (const char* kind : {"lookup", "model"}) {
    for (int slots : {1, 4}) {
      for (int64_t budget : {9, 512}) {
        EngineOwner e(tiny.engine(4096));
        SchedulerOptions o;
        o.slots = slots;
        o.max_batch_tokens = budget;
        o.draft_max = 4;
        const bool model = std::string(kind) == "model";
        o.drafter_for = [&](const Request& r) -> std::unique_ptr<Drafter> {
          if (model)
            return std::make_unique<ModelDrafter>(draft, ModelDrafterOptions{r.sampling}, "self");
          return std::make_unique<LookupDrafter>(3, 1);
        };
        SchedulerStats st;
        EXPECT_EQ(run_all(e, rs, o, &st), alone)
            << kind << ", " << slots << " slots, budget " << budget;
        EXPECT_GT(st.accepted, 0) << kind;
        if (model) EXPECT_EQ(st.accepted, st.draft_rows) << "its own draft is always right";
        EXPECT_EQ(e.blocks().blocks_in_use(), 0);
        EXPECT_EQ(draft.blocks().blocks_in_use(), 0) << "each drafter freed its sequence";
      }
    }
  }
}

// --draft-auto in the step: each sequence chooses its own gamma (plain
// steps included) and the ids stay the plain ones, alone and in a batch.
TEST(SchedulerSpec, DraftAutoPerSequenceGivesThePlainIds) {
  Tiny tiny;
  auto rs = tiny_requests();
  for (auto& r : rs) r.max_tokens = 24;
  const Outputs alone =
      run_alone(rs, [&] { return std::make_unique<EngineOwner>(tiny.engine(256)); });
  Engine draft(tiny.model, EngineOptions{.n_threads = 1, .n_ctx = 256, .cache_tokens = 4 * 256});
  for (const char* kind : {"lookup", "model"}) {
    for (int slots : {1, 4}) {
      EngineOwner e(tiny.engine(4096));
      SchedulerOptions o;
      o.slots = slots;
      o.draft_max = 6;
      o.draft_auto = true;
      const bool model = std::string(kind) == "model";
      o.drafter_for = [&](const Request& r) -> std::unique_ptr<Drafter> {
        if (model)
          return std::make_unique<ModelDrafter>(draft, ModelDrafterOptions{r.sampling}, "self");
        return std::make_unique<LookupDrafter>(3, 1);
      };
      SchedulerStats st;
      EXPECT_EQ(run_all(e, rs, o, &st), alone) << kind << ", " << slots << " slots";
      EXPECT_LE(st.accepted, st.draft_rows);
      EXPECT_EQ(e.blocks().blocks_in_use(), 0);
      EXPECT_EQ(draft.blocks().blocks_in_use(), 0);
    }
  }
}

// AutoGamma's rule for a shared step: a verify pass 30% dearer per extra
// row pays for one sequence (E(0.9, 1) = 1.9 tokens for 1.3 steps) but not
// when it delays seven others too ((7 + 1.9) / (8 x 1.3) < 1).
TEST(SchedulerSpec, AutoGammaWeighsTheSequencesAStepDelays) {
  for (int64_t n : {1, 8}) {
    AutoGamma a(8, 0.0);
    EXPECT_EQ(a.choose(1000, 0, n), 0) << "the first step is plain: it measures the step";
    a.plain(10.0);
    for (int k = 2; k <= 9; ++k) a.verify(k, 10.0 * (1.0 + 0.3 * (k - 1)));
    const int g = a.choose(1000, 0, n);
    if (n == 1)
      EXPECT_GT(g, 0);
    else
      EXPECT_EQ(g, 0);
  }
}

// Cancelling speculating sequences between steps (as the server does when a
// client goes away) frees their blocks in the target's pool and, with their
// drafters, in the draft model's.
TEST(SchedulerSpec, CancelFreesTheTargetsAndTheDraftsBlocks) {
  Tiny tiny;
  auto rs = tiny_requests();
  Engine draft(tiny.model, EngineOptions{.n_threads = 1, .n_ctx = 256, .cache_tokens = 4 * 256});
  EngineOwner e(tiny.engine(4096));
  SchedulerOptions o;
  o.slots = 4;
  o.drafter_for = [&](const Request& r) -> std::unique_ptr<Drafter> {
    return std::make_unique<ModelDrafter>(draft, ModelDrafterOptions{r.sampling}, "self");
  };
  Scheduler s(e, o);
  for (auto& r : rs) {
    r.max_tokens = 200;
    s.submit(r);
  }
  int64_t accepted = 0;
  for (int i = 0; i < 6; ++i) accepted += s.step().accepted;
  EXPECT_GT(accepted, 0) << "the sequences were speculating";
  EXPECT_GT(draft.blocks().blocks_in_use(), 0);
  for (int64_t id = 0; id < s.n_sequences(); ++id) s.cancel(static_cast<int>(id));
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(e.blocks().blocks_in_use(), 0);
  EXPECT_EQ(draft.blocks().blocks_in_use(), 0);
}

TEST(SchedulerEngine, StopStringsWithoutATokenizerFailTheRequest) {
  FakeEngine e(8);
  Scheduler s(e, SchedulerOptions{});
  Request r = req(4, 3, 0);
  r.stop = {"x"};
  s.submit(r);
  EXPECT_EQ(s.sequence(0).status, SeqStatus::kFailed);
  EXPECT_TRUE(s.idle());
}

}  // namespace
}  // namespace barata

namespace barata {
namespace {

// The pieces' bytes, a sentence of the grammar when complete (else a prefix).
bool sentence_or_prefix(const GrammarIndex& ix, const Tokenizer& tok, std::span<const int32_t> ids,
                        bool complete) {
  GrammarStacks st = ix.initial(), nx;
  for (int32_t id : ids) {
    if (tok.is_eog(id)) break;
    for (unsigned char c : tok.token_to_piece(id)) {
      ix.advance(st, c, nx);
      if (nx.empty()) return false;
      st.swap(nx);
    }
  }
  return !complete || (!st.empty() && st.front().empty());
}

// A grammar in the one loop on the real engine: every output is a sentence
// of it (or, cut by max_tokens, a prefix), the same alone and batched, and
// greedy speculative decoding (lookup and the model as its own draft) gives
// the plain constrained ids.
TEST(SchedulerGrammar, ConstrainedOutputsAloneBatchedAndSpeculated) {
  Tiny tiny;
  const Tokenizer tok = Tokenizer::from_gguf(tiny.model.file());
  auto ix = grammar_index(
      "root ::= (\"Once\" | \"The\" | \"Tim\") (\" \" [a-z]{1,8}){2,5} (\".\" | \"!\")\n", tok);
  auto rs = tiny_requests();
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].grammar = ix;
    rs[i].max_tokens = 64;
    rs[i].sampling.temperature = i % 2 ? 0.9f : 0.0f;
    rs[i].sampling.seed = i;
  }
  const Outputs alone =
      run_alone(rs, [&] { return std::make_unique<EngineOwner>(tiny.engine(256)); });
  int complete = 0;
  {
    EngineOwner e(tiny.engine(256));
    Scheduler s(e, SchedulerOptions{.slots = 1});
    for (const Request& r : rs) s.submit(r);
    s.run();
    for (size_t i = 0; i < rs.size(); ++i) {
      const Sequence& q = s.sequence(static_cast<int>(i));
      ASSERT_EQ(q.status, SeqStatus::kFinished) << q.error;
      const bool done = q.finish == FinishReason::kEos;
      complete += done;
      EXPECT_TRUE(done || q.finish == FinishReason::kLength) << finish_name(q.finish);
      EXPECT_TRUE(sentence_or_prefix(*ix, tok, q.output(), done))
          << i << ": " << tok.decode(q.output());
    }
  }
  EXPECT_GT(complete, static_cast<int>(rs.size()) / 2) << "most finish the sentence";
  EngineOwner batched(tiny.engine(4096));
  EXPECT_EQ(run_all(batched, rs, SchedulerOptions{.slots = 4}), alone);

  std::vector<Request> greedy;
  for (size_t i = 0; i < rs.size(); i += 2) greedy.push_back(rs[i]);
  Outputs plain;
  for (size_t i = 0; i < rs.size(); i += 2) plain.push_back(alone[i]);
  Engine draft(tiny.model, EngineOptions{.n_threads = 1, .n_ctx = 256, .cache_tokens = 4 * 256});
  for (const char* kind : {"lookup", "model"}) {
    EngineOwner e(tiny.engine(4096));
    SchedulerOptions o;
    o.slots = 4;
    o.draft_max = 4;
    const bool model = std::string(kind) == "model";
    o.drafter_for = [&](const Request& r) -> std::unique_ptr<Drafter> {
      if (model)
        return std::make_unique<ModelDrafter>(draft, ModelDrafterOptions{r.sampling}, "self");
      return std::make_unique<LookupDrafter>(3, 1);
    };
    SchedulerStats st;
    EXPECT_EQ(run_all(e, greedy, o, &st), plain) << kind;
    if (model) EXPECT_GT(st.accepted, 0);
  }
}

}  // namespace
}  // namespace barata
