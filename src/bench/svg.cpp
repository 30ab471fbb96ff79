// Simple SVG line charts (no dependencies): axes with ticks, one polyline with
// markers per series, a legend. Enough to show a trend; not a plotting library.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "barata/bench.h"

namespace barata::bench {
namespace {

// The legend sits right of the plot, where it cannot hide a line.
constexpr double kWidth = 900, kHeight = 440;
constexpr double kLeft = 80, kRight = 210, kTop = 48, kBottom = 56;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};

std::string tick_label(double v) {
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a >= 1e5 || a < 1e-3) {  // 1e9, 2.5e-4: short enough for an axis
    const int e = static_cast<int>(std::floor(std::log10(a)));
    const double m = v / std::pow(10.0, e);
    if (std::fabs(std::fabs(m) - 1) < 1e-9) return fmt::format("{}1e{}", v < 0 ? "-" : "", e);
    return fmt::format("{:.3g}e{}", m, e);
  }
  if (a >= 100 || std::fabs(v - std::round(v)) < 1e-9) return fmt::format("{:.0f}", v);
  return fmt::format("{:g}", v);
}

// One axis: maps data values to [0, 1] and lists tick values.
struct Axis {
  bool log = false;
  double base = 10;
  double lo = 0, hi = 1;  // in transformed units
  double tf(double v) const { return log ? std::log(v) / std::log(base) : v; }
  double frac(double v) const { return hi > lo ? (tf(v) - lo) / (hi - lo) : 0.5; }
  std::vector<double> ticks;
};

Axis make_axis(const std::vector<double>& vals, bool log, double base) {
  Axis a;
  a.log = log;
  a.base = base;
  if (vals.empty()) return a;
  const auto [mn, mx] = std::minmax_element(vals.begin(), vals.end());
  if (log) {
    a.lo = std::floor(a.tf(*mn));
    a.hi = std::ceil(a.tf(*mx));
    if (a.hi == a.lo) a.hi = a.lo + 1;
    const double step = std::max(1.0, std::ceil((a.hi - a.lo) / 10));
    for (double e = a.lo; e <= a.hi + 1e-9; e += step) a.ticks.push_back(std::pow(base, e));
    return a;
  }
  // Linear: from zero (costs and rates are compared with nothing) to a round top.
  const double top = std::max(*mx, 0.0) > 0 ? *mx : 1.0;
  const double raw = top / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  a.lo = std::min(0.0, *mn);
  a.hi = std::ceil(top / step) * step;
  for (double v = a.lo; v <= a.hi + step * 1e-9; v += step) a.ticks.push_back(v);
  return a;
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&')
      o += "&amp;";
    else if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

std::string to_svg(const Chart& c) {
  // Points a log axis cannot show (<= 0) are dropped.
  std::vector<double> xs, ys;
  for (const Series& s : c.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if ((c.log2_x && s.x[i] <= 0) || (c.log10_y && s.y[i] <= 0)) continue;
      xs.push_back(s.x[i]);
      ys.push_back(s.y[i]);
    }
  }
  const Axis ax = make_axis(xs, c.log2_x, 2), ay = make_axis(ys, c.log10_y, 10);
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + ax.frac(x) * pw; };
  auto py = [&](double y) { return kTop + (1 - ay.frac(y)) * ph; };

  std::string o = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      kWidth, kHeight, kWidth / 2, xml_escape(c.title));
  // Grid and ticks.
  for (double t : ax.ticks) {
    const double x = px(t);
    o += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#e0e0e0\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        x, kTop, kTop + ph, kTop + ph + 16, tick_label(t));
  }
  for (double t : ay.ticks) {
    const double y = py(t);
    o += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#e0e0e0\"/>\n"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        kLeft, y, kLeft + pw, kLeft - 6, y + 4, tick_label(t));
  }
  o += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n",
      kLeft, kTop, pw, ph);
  o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", kLeft + pw / 2,
                   kHeight - 14, xml_escape(c.x_label));
  o += fmt::format(
      "<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
      "{0})\">{1}</text>\n",
      kTop + ph / 2, xml_escape(c.y_label));
  if (xs.empty())
    o += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data</text>\n",
                     kLeft + pw / 2, kTop + ph / 2);

  // Series and legend.
  for (size_t k = 0; k < c.series.size(); ++k) {
    const Series& s = c.series[k];
    const char* color = kColors[k % std::size(kColors)];
    std::string pts;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if ((c.log2_x && s.x[i] <= 0) || (c.log10_y && s.y[i] <= 0)) continue;
      pts += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
      o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(s.x[i]),
                       py(s.y[i]), color);
    }
    if (!pts.empty())
      o += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n",
                       pts, color);
    const double ly = kTop + 8 + 18 * static_cast<double>(k), lx = kLeft + pw + 12;
    o += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>\n"
        "<text x=\"{4}\" y=\"{5}\">{6}</text>\n",
        lx, ly, lx + 24, color, lx + 30, ly + 4, xml_escape(s.name));
  }
  o += "</svg>\n";
  return o;
}

std::vector<std::pair<std::string, Chart>> report_charts(const Report& r) {
  std::vector<std::pair<std::string, Chart>> out;
  Chart pd{"Per-token cost: prefill against decode (medians)",
           "tokens: P prompt tokens (prefill), C cached tokens (decode)",
           "ms per token",
           true,
           false,
           {}};
  Chart tput{"Batch sweep: throughput (medians)",
             "B sequences decoded together",
             "tokens/s (all sequences)",
             true,
             false,
             {}};
  Chart lat{"Batch sweep: step latency (medians)",
            "B sequences decoded together",
            "ms per decode step",
            true,
            false,
            {}};
  Chart macs{"Greedy generation: counted multiply-accumulates",
             "T generated tokens",
             "MACs, cumulative (log)",
             true,
             true,
             {}};
  Chart time{"Greedy generation: time (medians)",
             "T generated tokens",
             "ms, cumulative (log)",
             true,
             true,
             {}};
  for (const ThreadRun& t : r.runs) {
    const std::string th = fmt::format(" (t={})", t.n_threads);
    Series pre{"prefill ms/token" + th, {}, {}}, dec{"decode ms/step" + th, {}, {}};
    for (const PrefillRow& p : t.prefill) {
      pre.x.push_back(static_cast<double>(p.n_tokens));
      pre.y.push_back(p.ms_per_token.median);
    }
    for (const DecodeRow& d : t.decode) {
      dec.x.push_back(static_cast<double>(d.n_cached));
      dec.y.push_back(d.ms_per_step.median);
    }
    if (!pre.x.empty()) pd.series.push_back(pre);
    if (!dec.x.empty()) pd.series.push_back(dec);
    Series tp{"t=" + std::to_string(t.n_threads), {}, {}}, la = tp;
    for (const BatchRow& b : t.batch) {
      tp.x.push_back(static_cast<double>(b.batch));
      tp.y.push_back(b.tokens_per_s.median);
      la.x.push_back(static_cast<double>(b.batch));
      la.y.push_back(b.step_ms.median);
    }
    if (!tp.x.empty()) {
      tput.series.push_back(tp);
      lat.series.push_back(la);
    }
    Series ct{"KV cache" + th, {}, {}}, nt{"no cache" + th, {}, {}};
    Series cm{"KV cache: all", {}, {}}, nm{"no cache: all", {}, {}};
    Series ca{"KV cache: attention", {}, {}}, na{"no cache: attention", {}, {}};
    for (const CachePoint& p : t.cache.points) {
      const double x = static_cast<double>(p.n_generated);
      ct.x.push_back(x);
      ct.y.push_back(p.cache_ms.median);
      nt.x.push_back(x);
      nt.y.push_back(p.no_cache_ms.median);
      cm.x.push_back(x);
      cm.y.push_back(static_cast<double>(p.cache_proj_macs + p.cache_attn_macs));
      nm.x.push_back(x);
      nm.y.push_back(static_cast<double>(p.no_cache_proj_macs + p.no_cache_attn_macs));
      ca.x.push_back(x);
      ca.y.push_back(static_cast<double>(p.cache_attn_macs));
      na.x.push_back(x);
      na.y.push_back(static_cast<double>(p.no_cache_attn_macs));
    }
    if (!ct.x.empty()) {
      time.series.push_back(ct);
      time.series.push_back(nt);
      if (macs.series.empty()) {  // counts do not depend on threads
        macs.series.push_back(cm);
        macs.series.push_back(nm);
        macs.series.push_back(ca);
        macs.series.push_back(na);
      }
    }
  }
  for (auto* c : {&pd, &tput, &lat, &macs, &time}) {
    if (c->series.empty()) continue;
    const char* name = c == &pd     ? "prefill_decode.svg"
                       : c == &tput ? "batch_throughput.svg"
                       : c == &lat  ? "batch_latency.svg"
                       : c == &macs ? "cache_macs.svg"
                                    : "cache_time.svg";
    out.emplace_back(name, *c);
  }
  return out;
}

}  // namespace barata::bench
