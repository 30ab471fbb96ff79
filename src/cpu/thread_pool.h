// A small fork-join pool. parallel_for cuts [0, n) into a few chunks per
// thread; every thread, the caller's included, takes the next chunk from a
// shared counter until none is left, so a thread that the OS has descheduled
// (a busy machine) delays only the chunk it holds, and the others take the
// rest. Workers spin briefly before sleeping, because a decode step issues
// hundreds of short parallel regions and a futex wake costs more than the
// work in each. The callable is borrowed, never copied: no allocation per call.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace barata {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // total threads, caller included; >= 1
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(begin, end, thread_index) over disjoint ranges covering [0, n), each a
  // multiple of `grain` long (except the last). Which thread runs which range
  // is not fixed: results must not depend on it.
  template <typename F>
  void parallel_for(int64_t n, F&& fn, int64_t grain = 1) {
    using Fn = std::remove_reference_t<F>;
    run(n, grain,
        Job{const_cast<void*>(static_cast<const void*>(&fn)),
            [](void* f, int64_t b, int64_t e, int t) { (*static_cast<Fn*>(f))(b, e, t); }});
  }

  // Physical cores this process may run on (SMT siblings counted once).
  static int default_threads();

 private:
  struct Job {
    void* fn;
    void (*call)(void* fn, int64_t begin, int64_t end, int thread);
  };
  void run(int64_t n, int64_t grain, Job job);
  void worker(int index);
  void stop_workers();  // joins every worker (idempotent)
  // Claims and runs chunks of job generation `gen` until none is left.
  void work(uint32_t gen, int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};

  // The current job. `claim_` packs generation (24 bits), chunk count (20)
  // and the next chunk (20), so that a claim is one compare-and-swap that a
  // worker still holding an old generation cannot win; a claimed chunk keeps
  // its job (and the fields below) alive until it is counted in done_.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  Job job_{nullptr, nullptr};
  int64_t n_ = 0;
  int64_t chunk_ = 1;  // elements per chunk
};

}  // namespace barata
