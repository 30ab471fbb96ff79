#include "barata/agreement.h"

#include <span>

#include "barata/batch.h"
#include "barata/error.h"
#include "barata/sampler.h"

namespace barata {
namespace {

// Frees the sequence however the scope is left.
class SeqGuard {
 public:
  explicit SeqGuard(Engine& e) : e_(e), seq_(e.new_sequence()) {}
  ~SeqGuard() { e_.free_sequence(seq_); }
  SeqGuard(const SeqGuard&) = delete;
  SeqGuard& operator=(const SeqGuard&) = delete;
  int seq() const { return seq_; }

 private:
  Engine& e_;
  int seq_;
};

int64_t vocab_of(const Engine& e) {
  return e.model().config().n_vocab;
}

}  // namespace

std::vector<GreedyTrace> greedy_traces(Engine& base,
                                       const std::vector<std::vector<int32_t>>& prompts,
                                       int n_gen) {
  if (n_gen < 1) fail("the number of generated tokens must be at least 1 (got {})", n_gen);
  const int64_t n_vocab = vocab_of(base);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  std::vector<GreedyTrace> traces;
  traces.reserve(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    const std::vector<int32_t>& prompt = prompts[p];
    if (prompt.empty()) fail("prompt {} is empty", p + 1);
    if (static_cast<int64_t>(prompt.size()) > base.n_ctx())
      fail("prompt {} has {} tokens but the context holds {} (raise -c)", p + 1, prompt.size(),
           base.n_ctx());
    GreedyTrace t{prompt, {}, n_vocab};
    SeqGuard g(base);
    base.prefill(g.seq(), prompt, logits.data());
    t.generated.push_back(argmax(logits));
    // Token i is predicted at position P + i - 1, which must lie inside the context.
    while (static_cast<int>(t.generated.size()) < n_gen && base.length(g.seq()) < base.n_ctx()) {
      const int seq = g.seq();
      const int32_t tok = t.generated.back();
      base.decode(std::span<const int>(&seq, 1), std::span<const int32_t>(&tok, 1), logits.data());
      t.generated.push_back(argmax(logits));
    }
    traces.push_back(std::move(t));
  }
  return traces;
}

AgreementResult teacher_forced_agreement(Engine& cand, const std::vector<GreedyTrace>& traces) {
  const int64_t n_vocab = vocab_of(cand);
  AgreementResult r;
  std::vector<float> logits;
  Batch b;
  for (size_t p = 0; p < traces.size(); ++p) {
    const GreedyTrace& t = traces[p];
    if (t.n_vocab != n_vocab)
      fail(
          "the candidate's vocabulary has {} tokens but the base model's has {}: agreement needs "
          "the same tokenizer",
          n_vocab, t.n_vocab);
    PromptAgreement pa;
    if (t.prompt.empty()) fail("trace {} has an empty prompt", p + 1);
    const size_t n = t.generated.size();
    if (n > 0) {
      const int64_t len = static_cast<int64_t>(t.prompt.size() + n - 1);
      if (len > cand.n_ctx())
        fail("trace {} has {} tokens to read but the candidate's context holds {} (raise -c)",
             p + 1, len, cand.n_ctx());
      SeqGuard g(cand);
      b.clear();
      const size_t first = t.prompt.size() - 1;  // the row predicting generated[0]
      for (size_t i = 0; i < t.prompt.size(); ++i)
        b.add(t.prompt[i], static_cast<int64_t>(i), g.seq(), i >= first);
      for (size_t i = 0; i + 1 < n; ++i)
        b.add(t.generated[i], static_cast<int64_t>(t.prompt.size() + i), g.seq(), true);
      logits.resize(n * static_cast<size_t>(n_vocab));
      cand.forward(b, logits.data());
      for (size_t i = 0; i < n; ++i) {
        const std::span<const float> row(logits.data() + i * static_cast<size_t>(n_vocab),
                                         static_cast<size_t>(n_vocab));
        pa.matches += argmax(row) == t.generated[i] ? 1 : 0;
      }
      pa.n = static_cast<int64_t>(n);
    }
    r.matches += pa.matches;
    r.n += pa.n;
    r.per_prompt.push_back(pa);
  }
  return r;
}

void check_same_vocabulary(const Model& base, const Model& cand) {
  if (base.config().n_vocab != cand.config().n_vocab)
    fail(
        "the candidate's vocabulary has {} tokens but the base model's has {}: agreement needs "
        "the same tokenizer",
        cand.config().n_vocab, base.config().n_vocab);
}

AgreementResult teacher_forced_agreement(Engine& base, Engine& cand,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         int n_gen) {
  check_same_vocabulary(base.model(), cand.model());
  return teacher_forced_agreement(cand, greedy_traces(base, prompts, n_gen));
}

}  // namespace barata
