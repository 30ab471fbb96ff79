// Shared by the bench measurements: a monotonic clock and the repeat loop
// (one untimed warm-up, then up to `reps` timed runs, stopping early when the
// user interrupts).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "barata/bench.h"

namespace barata::bench {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Calls body(rep) with rep = -1 for the warm-up, then 0..reps-1; body returns
// the rep's milliseconds. Returns the timed samples (fewer when stopped).
template <typename Body>
std::vector<double> repeat(const Settings& s, const Hooks& h, const std::string& what, Body body) {
  std::vector<double> samples;
  if (h.stopped()) return samples;
  h.progress(fmt::format("{} warm-up", what));
  body(-1);
  for (int rep = 0; rep < s.reps && !h.stopped(); ++rep) {
    h.progress(fmt::format("{} rep {}/{}", what, rep + 1, s.reps));
    samples.push_back(body(rep));
  }
  return samples;
}

// f(x) of every sample, then summarised.
template <typename F>
Stats derive(const std::vector<double>& samples, F f) {
  std::vector<double> v;
  v.reserve(samples.size());
  for (double x : samples) v.push_back(f(x));
  return summarize(v);
}

}  // namespace barata::bench
