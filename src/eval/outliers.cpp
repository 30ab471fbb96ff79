#include "barata/outliers.h"

#include "barata/bench.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <fmt/core.h>

#include "barata/error.h"

namespace barata::outliers {

float quantile(std::vector<float>& v, double q) {
  if (v.empty()) return 0;
  q = std::clamp(q, 0.0, 1.0);
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(lo), v.end());
  const float a = v[lo];
  if (hi == lo) return a;
  // The next order statistic is the smallest of the part above lo.
  const float b = *std::min_element(v.begin() + static_cast<long>(lo) + 1, v.end());
  return static_cast<float>(a + (pos - static_cast<double>(lo)) * (b - a));
}

LayerSummary summarize_layer(int64_t layer, const float* x, int64_t rows, int64_t d) {
  if (rows < 1 || d < 1) fail("outliers: a residual of {} rows x {} dimensions", rows, d);
  LayerSummary s;
  s.layer = layer;
  s.rows = rows;
  s.d = d;
  s.dim_max.assign(static_cast<size_t>(d), 0.0f);
  std::vector<float> all(static_cast<size_t>(rows * d));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < d; ++j) {
      const float a = std::fabs(x[r * d + j]);
      all[static_cast<size_t>(r * d + j)] = a;
      float& m = s.dim_max[static_cast<size_t>(j)];
      m = std::max(m, a);
    }
  }
  const auto it = std::max_element(s.dim_max.begin(), s.dim_max.end());
  s.max_abs = *it;
  s.max_dim = it - s.dim_max.begin();
  while (std::fabs(x[s.max_row * d + s.max_dim]) != s.max_abs) ++s.max_row;
  s.median_abs = quantile(all, 0.5);
  s.p99_abs = quantile(all, 0.99);
  std::vector<float> dm = s.dim_max;
  s.median_dim_max = quantile(dm, 0.5);
  return s;
}

std::vector<int64_t> top_k_dims(const LayerSummary& s, int64_t top_k) {
  std::vector<int64_t> idx(s.dim_max.size());
  std::iota(idx.begin(), idx.end(), int64_t{0});
  const auto k = static_cast<size_t>(std::clamp<int64_t>(top_k, 0, s.d));
  std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(k), idx.end(),
                    [&](int64_t a, int64_t b) {
                      const float fa = s.dim_max[static_cast<size_t>(a)];
                      const float fb = s.dim_max[static_cast<size_t>(b)];
                      return fa != fb ? fa > fb : a < b;
                    });
  idx.resize(k);
  return idx;
}

std::vector<TopDim> top_dims(std::span<const LayerSummary> layers, int64_t top_k) {
  std::map<int64_t, TopDim> by_dim;
  for (const LayerSummary& s : layers) {
    for (int64_t j : top_k_dims(s, top_k)) {
      auto [it, fresh] = by_dim.try_emplace(j);
      TopDim& t = it->second;
      t.dim = j;
      t.layers.push_back(s.layer);
    }
  }
  std::vector<TopDim> out;
  for (auto& [j, t] : by_dim) {
    for (const LayerSummary& s : layers) {
      const float v = s.dim_max[static_cast<size_t>(j)];
      if (v > t.max_abs) {
        t.max_abs = v;
        t.max_layer = s.layer;
      }
    }
    std::sort(t.layers.begin(), t.layers.end());
    out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const TopDim& a, const TopDim& b) {
    return a.max_abs != b.max_abs ? a.max_abs > b.max_abs : a.dim < b.dim;
  });
  return out;
}

std::vector<Bin> log2_histogram(std::span<const float> values) {
  std::vector<Bin> bins;
  auto bin_of = [](float v) -> size_t {
    if (!(v >= 1.0f)) return 0;  // [0, 1), and NaN
    int e = 0;
    std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1): v in [2^(e-1), 2^e)
    return static_cast<size_t>(e);
  };
  for (float v : values) {
    if (std::isinf(v)) fail("outliers: an infinite activation");
    const size_t i = bin_of(v);
    while (bins.size() <= i) {
      const size_t n = bins.size();
      bins.push_back({n == 0 ? 0.0 : std::ldexp(1.0, static_cast<int>(n) - 1),
                      std::ldexp(1.0, static_cast<int>(n)), 0});
    }
    ++bins[i].count;
  }
  return bins;
}

std::string bin_label(const Bin& b) {
  return fmt::format("{:g}-{:g}", b.lo, b.hi);
}

std::string histogram_bars(std::span<const Bin> bins, int width) {
  int64_t most = 0;
  size_t label_w = 0;
  for (const Bin& b : bins) {
    most = std::max(most, b.count);
    label_w = std::max(label_w, bin_label(b).size());
  }
  std::string o;
  for (const Bin& b : bins) {
    int64_t n = most > 0 ? (b.count * width + most / 2) / most : 0;
    if (b.count > 0) n = std::max<int64_t>(n, 1);
    o += fmt::format("  {:>{}} | {:<{}} {}\n", bin_label(b), label_w,
                     std::string(static_cast<size_t>(n), '#'), width, b.count);
  }
  return o;
}

namespace {}  // namespace

std::string histogram_svg(std::span<const Bin> bins, const std::string& title) {
  constexpr double kW = 900, kH = 440, kL = 70, kR = 30, kT = 48, kB = 64;
  const double pw = kW - kL - kR, ph = kH - kT - kB;
  int64_t most = 1;
  for (const Bin& b : bins) most = std::max(most, b.count);
  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 "
      "{0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      kW, kH, kW / 2, bench::xml_escape(title));
  // Five horizontal grid lines from 0 to the fullest bin.
  for (int i = 0; i <= 5; ++i) {
    const double v = static_cast<double>(most) * i / 5, y = kT + ph * (1 - i / 5.0);
    o += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#e0e0e0\"/>\n"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:.0f}</text>\n",
        kL, y, kL + pw, kL - 6, y + 4, v);
  }
  const double slot = bins.empty() ? pw : pw / static_cast<double>(bins.size());
  for (size_t i = 0; i < bins.size(); ++i) {
    const double h = ph * static_cast<double>(bins[i].count) / static_cast<double>(most);
    const double x = kL + slot * static_cast<double>(i);
    o += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
        "fill=\"#1f77b4\"/>\n",
        x + slot * 0.1, kT + ph - h, slot * 0.8, h);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                     x + slot / 2, kT + ph - h - 4, bins[i].count);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                     x + slot / 2, kT + ph + 16, bin_label(bins[i]));
  }
  o += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", kL,
      kT, pw, ph);
  o += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">max |h| of a dimension over the tokens "
      "(log2 bins)</text>\n",
      kL + pw / 2, kH - 18);
  o += fmt::format(
      "<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
      "{0})\">dimensions</text>\n",
      kT + ph / 2);
  o += "</svg>\n";
  return o;
}

Int8Levels int8_levels(const float* x, int64_t rows, int64_t d, std::span<const int64_t> typical,
                       std::span<const int64_t> excluded) {
  std::vector<char> skip(static_cast<size_t>(d), 0);
  for (int64_t j : excluded) {
    if (j < 0 || j >= d) fail("outliers: excluded dimension {} is outside 0..{}", j, d - 1);
    skip[static_cast<size_t>(j)] = 1;
  }
  for (int64_t j : typical)
    if (j < 0 || j >= d) fail("outliers: dimension {} is outside 0..{}", j, d - 1);
  Int8Levels r;
  r.excluded.assign(excluded.begin(), excluded.end());
  r.typical.assign(typical.begin(), typical.end());
  float mx = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < d; ++j)
      if (!skip[static_cast<size_t>(j)]) mx = std::max(mx, std::fabs(x[i * d + j]));
  r.scale = mx / 127.0f;
  auto code = [&](float v) -> int {
    if (r.scale == 0) return 0;
    return static_cast<int>(std::clamp(std::nearbyint(v / r.scale), -127.0f, 127.0f));
  };
  std::vector<char> seen_tensor(256, 0);
  std::vector<float> per_dim;
  std::vector<int64_t> levels(static_cast<size_t>(d), 0);
  for (int64_t j = 0; j < d; ++j) {
    if (skip[static_cast<size_t>(j)]) continue;
    std::vector<char> seen(256, 0);
    int64_t n = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const int q = code(x[i * d + j]) + 128;
      if (!seen[static_cast<size_t>(q)]) {
        seen[static_cast<size_t>(q)] = 1;
        ++n;
      }
      seen_tensor[static_cast<size_t>(q)] = 1;
    }
    levels[static_cast<size_t>(j)] = n;
    per_dim.push_back(static_cast<float>(n));
  }
  for (int64_t j : typical) r.typical_levels.push_back(levels[static_cast<size_t>(j)]);
  r.median_levels = quantile(per_dim, 0.5);
  r.tensor_levels = std::count(seen_tensor.begin(), seen_tensor.end(), 1);
  return r;
}

std::vector<int64_t> typical_dims(const LayerSummary& s, std::span<const int64_t> excluded) {
  std::vector<int64_t> idx;
  for (int64_t j = 0; j < s.d; ++j)
    if (std::find(excluded.begin(), excluded.end(), j) == excluded.end()) idx.push_back(j);
  if (idx.empty()) return {};
  std::sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    const float fa = s.dim_max[static_cast<size_t>(a)];
    const float fb = s.dim_max[static_cast<size_t>(b)];
    return fa != fb ? fa < fb : a < b;
  });
  std::vector<int64_t> out;
  for (double q : {0.25, 0.5, 0.75, 0.9}) {
    const auto i = static_cast<size_t>(std::lround(q * static_cast<double>(idx.size() - 1)));
    if (std::find(out.begin(), out.end(), idx[i]) == out.end()) out.push_back(idx[i]);
  }
  return out;
}

Analysis analyze(std::vector<LayerSummary> layers, int64_t layer, const float* x_layer,
                 int64_t top_k) {
  if (layers.empty()) fail("outliers: no layers captured");
  if (layer < 0 || layer >= static_cast<int64_t>(layers.size()))
    fail("outliers: layer {} is outside 0..{}", layer, layers.size() - 1);
  const LayerSummary& s = layers[static_cast<size_t>(layer)];
  if (top_k < 0 || top_k >= s.d)
    fail("outliers: --top {} must leave at least one of the {} dimensions", top_k, s.d);
  Analysis a;
  a.top_k = top_k;
  a.layer = layer;
  a.top = top_dims(layers, top_k);
  a.histogram = log2_histogram(s.dim_max);
  const std::vector<int64_t> out_dims = top_k_dims(s, top_k);
  const std::vector<int64_t> typical = typical_dims(s, out_dims);
  a.with_outliers = int8_levels(x_layer, s.rows, s.d, typical, {});
  a.without_outliers = int8_levels(x_layer, s.rows, s.d, typical, out_dims);
  a.scale_shrink = a.without_outliers.scale > 0
                       ? static_cast<double>(a.with_outliers.scale) / a.without_outliers.scale
                       : 0.0;
  a.layers = std::move(layers);
  return a;
}

}  // namespace barata::outliers
