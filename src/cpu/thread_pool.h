// A small fork-join pool: parallel_for splits [0, n) into one contiguous chunk
// per thread; the caller's thread works too. Workers spin briefly before
// sleeping, because a decode step issues hundreds of short parallel regions
// and a futex wake costs more than the work in each.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace barata {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // total threads, caller included; >= 1
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(begin, end, thread_index) over disjoint chunks covering [0, n).
  // Chunks are multiples of `grain` (except the last).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                    int64_t grain = 1);

  static int default_threads();  // physical-ish core count: hardware_concurrency

 private:
  void worker(int index);
  void stop_workers();  // joins every worker (idempotent)
  void run_chunk(int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;

  // The job of the current generation.
  const std::function<void(int64_t, int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
};

}  // namespace barata
