// barata serve's Prometheus histogram (text format 0.0.4). Internal to
// barata_server.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/core.h>

namespace barata::net {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += v;
    ++n_;
  }
  void write(std::string& out, const std::string& name, const std::string& help) const {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    int64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cum += counts_[i];
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
    }
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, n_, name,
                       sum_, name, n_);
  }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  double sum_ = 0;
  int64_t n_ = 0;
};

inline const std::vector<double> kTimeBuckets = {0.025, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                                 5,     10,   20,  30,   60,  120};

}  // namespace barata::net
