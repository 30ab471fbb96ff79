// Heap allocations per scheduler step (issue: "no allocation in the step").
// Its own binary: it replaces the global operator new/delete with counting
// ones, which must not change what the other tests' binaries measure.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <execinfo.h>
#include <unistd.h>

#include "barata/engine.h"
#include "barata/model.h"
#include "barata/scheduler.h"
#include "barata/tokenizer.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocs{0};
// BARATA_ALLOC_TRACE=1: each counted allocation's call stack on stderr (for
// finding one; resolve the addresses with addr2line -f -C -e the binary).
const bool g_trace = std::getenv("BARATA_ALLOC_TRACE") != nullptr;
thread_local bool t_in_trace = false;

void* counted_alloc(std::size_t n, std::size_t align) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_allocs.fetch_add(1, std::memory_order_relaxed);
    if (g_trace && !t_in_trace) {
      t_in_trace = true;
      void* frames[24];
      const int k = backtrace(frames, 24);
      const char head[] = "counted allocation:\n";
      (void)!write(2, head, sizeof head - 1);
      backtrace_symbols_fd(frames, k, 2);
      t_in_trace = false;
    }
  }
  if (n == 0) n = 1;
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(n)
                : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
  return p;
}

// Counts the allocations made while it lives (every thread's: the engine's
// worker threads are included).
class AllocCounter {
 public:
  AllocCounter() {
    g_allocs = 0;
    g_counting = true;
  }
  ~AllocCounter() { g_counting = false; }
  int64_t count() const { return g_allocs.load(); }
};

}  // namespace

void* operator new(std::size_t n) {
  return counted_alloc(n, alignof(std::max_align_t));
}
void* operator new[](std::size_t n) {
  return counted_alloc(n, alignof(std::max_align_t));
}
void* operator new(std::size_t n, std::align_val_t a) {
  return counted_alloc(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted_alloc(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, alignof(std::max_align_t));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, alignof(std::max_align_t));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace barata {
namespace {

TEST(StepAllocations, TheCounterSeesAnAllocation) {
  AllocCounter c;
  auto* v = new std::vector<int>(100);
  delete v;
  EXPECT_GE(c.count(), 2) << "the vector object and its storage";
}

// Four sequences on the CPU backend: two greedy, two sampled (top-k,
// top-p, min-p, repetition penalty), with text and stop strings that never
// match. After warm-up (the prompts prefilled, the buffers grown), a decode
// step allocates nothing: not the batch, the KV tables, the sampler, the
// text, nor the backend.
//
// One thread, so that every kernel runs on the caller and the count does not
// depend on the OS: with more, a pool thread sizes a kernel's per-thread
// scratch the first time it runs that kernel, and which thread runs which
// chunk is decided at run time (a worker kept off the CPU through the
// warm-up makes its one allocation later). The step's own code is the same.
TEST(StepAllocations, DecodeStepsAllocateNothingAfterWarmUp) {
  const Model model =
      Model::load(std::string(BARATA_SOURCE_DIR) + "/tests/data/models/stories260K.gguf");
  const Tokenizer tok = Tokenizer::from_gguf(model.file());
  for (int threads : {1}) {
    Engine engine(model, EngineOptions{.n_threads = threads, .n_ctx = 256});
    EngineSteps steps(engine);
    SchedulerOptions o;
    o.slots = 4;
    o.tokenizer = &tok;
    // The prefix cache records each full block it publishes (a hash table
    // node per 16 tokens): off here, so that what is measured is the step.
    o.prefix_cache = false;
    Scheduler sch(steps, o);
    int64_t streamed = 0;
    sch.on_text = [&](const Sequence&, std::string_view t) {
      streamed += static_cast<int64_t>(t.size());
    };
    const char* prompts[] = {"Once upon a time", "The little dog", "Lily and Tom went",
                             "One day, a bird"};
    for (int i = 0; i < 4; ++i) {
      Request r;
      r.prompt = tok.encode(prompts[i], true, false);
      r.max_tokens = 120;
      r.ignore_eos = true;
      r.stop = {"a string the tiny model never writes"};
      if (i % 2 == 0) {
        r.sampling.temperature = 0;
      } else {
        r.sampling.temperature = 0.9f;
        r.sampling.repeat_penalty = 1.1f;
        r.sampling.seed = 7 + static_cast<uint64_t>(i);
      }
      sch.submit(std::move(r));
    }
    for (int i = 0; i < 8; ++i) sch.step();  // warm-up
    ASSERT_EQ(sch.n_running(), 4);
    int64_t decode_steps = 0, allocs = 0;
    for (int i = 0; i < 40; ++i) {
      StepInfo info;
      {
        AllocCounter c;
        info = sch.step();
        allocs += c.count();
      }
      ASSERT_EQ(info.prefill_rows, 0) << "step " << i << " is a decode step";
      ASSERT_EQ(info.decode_rows, 4);
      ++decode_steps;
    }
    EXPECT_EQ(allocs, 0) << "heap allocations in " << decode_steps << " decode steps of 4 rows, "
                         << threads << " thread(s)";
    EXPECT_GT(streamed, 0) << "the text was made (and passed on) during the steps";
  }
}

}  // namespace
}  // namespace barata
