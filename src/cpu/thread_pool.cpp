#include "thread_pool.h"

#include <algorithm>
#include <system_error>

#include <immintrin.h>

#include "barata/error.h"

namespace barata {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  // Far more threads than the machine has only spin against each other (1024
  // on 2 cores made a step take seconds): refused, like any bad flag value.
  const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int max_threads = std::max(64, 4 * hw);
  if (n_threads_ > max_threads)
    fail("{} threads asked for, on a machine with {} hardware threads: give at most {}", n_threads_,
         hw, max_threads);
  try {
    for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
  } catch (const std::system_error& e) {
    stop_workers();
    fail("cannot start {} threads ({} started): {}", n_threads_, threads_.size() + 1, e.what());
  }
}

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

ThreadPool::~ThreadPool() {
  stop_workers();
}

int ThreadPool::default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::run_chunk(int index) {
  const int64_t n_chunks = (n_ + grain_ - 1) / grain_;
  const int64_t per = n_chunks / n_threads_, extra = n_chunks % n_threads_;
  const int64_t c0 = index * per + std::min<int64_t>(index, extra);
  const int64_t c1 = c0 + per + (index < extra ? 1 : 0);
  const int64_t begin = std::min(n_, c0 * grain_), end = std::min(n_, c1 * grain_);
  if (begin < end) (*fn_)(begin, end, index);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  fn_ = &fn;
  n_ = n;
  grain_ = std::max<int64_t>(1, grain);
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  run_chunk(0);
  // Spin, then yield: on a busy machine a descheduled worker must get the core.
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < 2000) {
      _mm_pause();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little: the next region usually starts within microseconds.
    for (int spin = 0; spin < 20000 && generation_.load(std::memory_order_acquire) == seen;
         ++spin) {
      if (spin < 2000) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_) return;
    run_chunk(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace barata
