#include "thread_pool.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <system_error>
#include <utility>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "barata/error.h"

namespace barata {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

constexpr int kChunksPerThread = 4;
constexpr uint64_t kIdxBits = 20, kMask = (uint64_t{1} << kIdxBits) - 1;

uint64_t pack(uint32_t gen, int64_t n_chunks, int64_t next) {
  return (static_cast<uint64_t>(gen & 0xffffff) << 40) | (static_cast<uint64_t>(n_chunks) << 20) |
         static_cast<uint64_t>(next);
}

}  // namespace

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
    stop_.store(true);
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
  const int logical = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return logical;
  std::set<std::pair<std::string, std::string>> cores;  // (package, core id)
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    std::ifstream core(dir + "core_id"), pkg(dir + "physical_package_id");
    std::string core_id, pkg_id;
    if (!(core >> core_id) || !(pkg >> pkg_id)) return std::max(1, CPU_COUNT(&set));
    cores.emplace(pkg_id, core_id);
  }
  return std::max<int>(1, static_cast<int>(cores.size()));
#else
  return logical;
#endif
}

void ThreadPool::work(uint32_t gen, int index) {
  uint64_t cur = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(cur >> 40) != (gen & 0xffffff)) return;  // a newer job
    const int64_t n_chunks = static_cast<int64_t>((cur >> 20) & kMask);
    const int64_t c = static_cast<int64_t>(cur & kMask);
    if (c >= n_chunks) return;
    if (!claim_.compare_exchange_weak(cur, cur + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;  // cur now holds the newer value
    const int64_t begin = c * chunk_, end = std::min(n_, begin + chunk_);
    job_.call(job_.fn, begin, end, index);
    done_.fetch_add(1, std::memory_order_acq_rel);
    cur = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::run(int64_t n, int64_t grain, Job job) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    job.call(job.fn, 0, n, 0);
    return;
  }
  const int64_t n_grains = (n + grain - 1) / grain;
  const int64_t want = std::min<int64_t>(n_grains, int64_t{kChunksPerThread} * n_threads_);
  const int64_t grains_per_chunk = (n_grains + want - 1) / want;
  chunk_ = grains_per_chunk * grain;
  const int64_t n_chunks = (n + chunk_ - 1) / chunk_;
  job_ = job;
  n_ = n;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  claim_.store(pack(gen, n_chunks, 0), std::memory_order_release);
  // seq_cst, with the sleeper's increment: either it sees the new generation
  // before it sleeps, or we see it counted and wake it.
  generation_.store(gen);
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);  // pairs with the sleeper's check under mu_
    cv_.notify_all();
  }
  work(gen, 0);
  // Spin, then yield: on a busy machine a descheduled worker must get the core
  // to finish the chunk it holds.
  for (int spin = 0; done_.load(std::memory_order_acquire) != n_chunks; ++spin) {
    if (spin < 4000) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::worker(int index) {
  uint32_t seen = 0;
  for (;;) {
    // Spin a little: the next region usually starts within microseconds.
    for (int spin = 0; spin < 20000 && generation_.load(std::memory_order_acquire) == seen;
         ++spin) {
      if (spin < 4000) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      sleepers_.fetch_add(1);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    work(seen, index);
  }
}

}  // namespace barata
