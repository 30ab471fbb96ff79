// Activation outliers in the residual stream (`barata outliers`): per layer,
// the largest |h| of every dimension over the captured rows; the dimensions
// that top those per-layer lists and the layers where they do; median and p99
// |h|; a log2 histogram of one layer's per-dimension maxima; and what one
// int8 scale for a whole tensor does to the ordinary dimensions, with and
// without the top outlier dimensions. Pure statistics over captured floats
// (Engine::set_residual_hook captures them), so tests need no model.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace barata::outliers {

// One layer's residual stream, rows x d, summarised.
struct LayerSummary {
  int64_t layer = 0, rows = 0, d = 0;
  std::vector<float> dim_max;         // d values: max |h| over the rows, per dimension
  float max_abs = 0;                  // over all rows x d values
  int64_t max_dim = 0;                // the dimension holding max_abs (the lowest on ties)
  int64_t max_row = 0;                // and its row (token), the first on ties
  float median_abs = 0, p99_abs = 0;  // over all rows x d values of |h|
  float median_dim_max = 0;           // the median of dim_max
};
// Throws barata::Error when rows < 1 or d < 1.
LayerSummary summarize_layer(int64_t layer, const float* x, int64_t rows, int64_t d);

// The q-quantile (0..1) of values by linear interpolation between the two
// nearest order statistics; 0 for no values. `values` is reordered.
float quantile(std::vector<float>& values, double q);

// The dimensions among each layer's top_k (by dim_max, ties to the lower
// dimension), with the layers where each is, its largest dim_max over all
// layers and the layer of that; sorted by that maximum, largest first.
struct TopDim {
  int64_t dim = 0;
  float max_abs = 0;
  int64_t max_layer = 0;
  std::vector<int64_t> layers;  // ascending
};
std::vector<TopDim> top_dims(std::span<const LayerSummary> layers, int64_t top_k);
// The top_k dimensions of one layer by dim_max, largest first (ties to the lower dimension).
std::vector<int64_t> top_k_dims(const LayerSummary& s, int64_t top_k);

// Log2 bins of non-negative values: bin 0 is [0, 1), bin i >= 1 is
// [2^(i-1), 2^i). Bins run from 0 to the one holding the largest value, so
// empty bins in between are listed.
struct Bin {
  double lo = 0, hi = 1;
  int64_t count = 0;
};
std::vector<Bin> log2_histogram(std::span<const float> values);
// "0-1", "1-2", "2-4", ..., "1024-2048".
std::string bin_label(const Bin& b);
// One line per bin: label, a bar of '#' scaled so the fullest bin has `width`
// characters (a non-empty bin has at least one), and the count.
std::string histogram_bars(std::span<const Bin> bins, int width = 50);
// The same histogram as an SVG bar chart (one bar per bin, its count on top).
std::string histogram_svg(std::span<const Bin> bins, const std::string& title);

// Symmetric int8 with one scale for a tensor: scale = max |h| / 127 over the
// dimensions kept, q = round(h / scale) clamped to [-127, 127]. `levels` counts
// the distinct q a dimension takes over the rows (of 256 int8 values).
struct Int8Levels {
  float scale = 0;                      // 0 when every kept value is 0
  std::vector<int64_t> excluded;        // dimensions left out of the scale and the counts
  std::vector<int64_t> typical;         // the dimensions reported one by one
  std::vector<int64_t> typical_levels;  // distinct levels of each typical dimension
  double median_levels = 0;             // over every kept dimension
  int64_t tensor_levels = 0;            // distinct levels over all kept values
};
// x is rows x d. Excluded and typical dimensions outside [0, d) are an error.
Int8Levels int8_levels(const float* x, int64_t rows, int64_t d, std::span<const int64_t> typical,
                       std::span<const int64_t> excluded);

// Dimensions "typical" of a layer: the ones whose dim_max sits at the 25th,
// 50th, 75th and 90th percentile of all dimensions, leaving out `excluded`.
std::vector<int64_t> typical_dims(const LayerSummary& s, std::span<const int64_t> excluded);

// The whole analysis of one capture.
struct Analysis {
  std::vector<LayerSummary> layers;
  std::vector<TopDim> top;
  int64_t top_k = 0;
  int64_t layer = 0;            // the layer of the histogram and the int8 study
  std::vector<Bin> histogram;   // of that layer's dim_max
  Int8Levels with_outliers;     // one scale over every dimension
  Int8Levels without_outliers;  // the layer's top_k dimensions excluded
  double scale_shrink = 0;      // with_outliers.scale / without_outliers.scale (0 if undefined)
};
// layers: every layer summarised, in order; x_layer: the chosen layer's rows x d.
Analysis analyze(std::vector<LayerSummary> layers, int64_t layer, const float* x_layer,
                 int64_t top_k);

}  // namespace barata::outliers
