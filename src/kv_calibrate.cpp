#include "barata/kv_calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include <spdlog/spdlog.h>

#include "barata/backend.h"
#include "barata/engine.h"
#include "barata/error.h"
#include "barata/tokenizer.h"

namespace barata {

std::string_view kv_calibration_text() {
  // Written for this file. Several kinds of text, so that no one domain's
  // channels decide the scales.
  return R"(The river had been rising for three days when the ferry stopped running. Mara
packed the last of the seed bags into the loft, tied the goat to the porch post,
and sat down to write to her brother in the city: "The water is at the second
step. If it reaches the fourth, we go to the school on the hill."

def merge_intervals(intervals):
    """Return the union of closed intervals, sorted by start."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out

| year | rainfall (mm) | change |
|------|---------------|--------|
| 2021 | 812.4         | -3.1%  |
| 2022 | 1,046.0       | +28.8% |

User: How many seconds are there in a leap year?
Assistant: A leap year has 366 days, and each day has 86,400 seconds, so it has
366 x 86,400 = 31,622,400 seconds.

SELECT name, COUNT(*) AS n FROM orders WHERE total > 100 GROUP BY name ORDER BY n DESC;
La lluvia en Sevilla es una maravilla; il pleut sur la ville comme il pleut dans mon coeur.
)";
}

namespace {

std::vector<int32_t> calibration_tokens(const Model& model) {
  const ModelConfig& c = model.config();
  std::vector<int32_t> ids;
  try {
    const Tokenizer tok = Tokenizer::from_gguf(model.file());
    ids = tok.encode(kv_calibration_text(), tok.add_bos_default(), false);
  } catch (const Error& e) {
    spdlog::warn("kv: no vocabulary to calibrate the key scales with ({}); using fixed token ids",
                 e.what());
  }
  if (ids.size() < 16) {  // a fixed sequence of ids (a 64-bit LCG)
    ids.clear();
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 256; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      ids.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(c.n_vocab)));
    }
  }
  const int64_t cap = std::max<int64_t>(c.n_ctx_train, 16);
  if (static_cast<int64_t>(ids.size()) > cap) ids.resize(static_cast<size_t>(cap));
  return ids;
}

}  // namespace

std::vector<float> calibrate_key_scales(const Model& model, int64_t n_ctx, int n_threads,
                                        std::unique_ptr<Backend>* lend) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = model.config();
  const int64_t hd = c.head_dim, kv_dim = c.n_head_kv * hd, q_dim = c.n_head * hd;
  const int64_t group = c.n_head / c.n_head_kv;
  const std::vector<int32_t> ids = calibration_tokens(model);
  const std::vector<float> off = key_offsets(model, n_ctx);

  const size_t n = static_cast<size_t>(c.n_layer * kv_dim);
  std::vector<double> kmax(n, 0.0), qsq(n, 0.0);
  std::vector<int64_t> qn(static_cast<size_t>(c.n_layer), 0);
  {
    EngineOptions o;
    o.n_threads = n_threads;
    o.n_ctx = static_cast<int64_t>(ids.size());
    o.device = DeviceKind::kCpu;
    o.swa_full = true;
    const bool borrow = lend != nullptr && *lend && (*lend)->kind() == DeviceKind::kCpu;
    std::optional<Engine> e;
    if (borrow) {
      e.emplace(model, o, std::move(*lend));
    } else {
      e.emplace(model, o);
    }
    e->backend().set_qk_observer([&](int64_t layer, const float* q, const float* k, int64_t rows) {
      const size_t base = static_cast<size_t>(layer * kv_dim);
      for (int64_t t = 0; t < rows; ++t) {
        for (int64_t i = 0; i < kv_dim; ++i) {
          const double v = std::fabs(static_cast<double>(k[t * kv_dim + i]) - off[base + i]);
          kmax[base + i] = std::max(kmax[base + i], v);
        }
        for (int64_t h = 0; h < c.n_head; ++h)
          for (int64_t i = 0; i < hd; ++i) {
            const double v = q[t * q_dim + h * hd + i];
            qsq[base + (h / group) * hd + i] += v * v;
          }
      }
      qn[static_cast<size_t>(layer)] += rows * group;
    });
    std::vector<float> logits(static_cast<size_t>(c.n_vocab));
    e->prefill(e->new_sequence(), ids, logits.data());
    e->backend().set_qk_observer(nullptr);
    if (borrow) *lend = e->release_backend();
  }

  // The two channels of a RoPE pair whose angle turns far over the context
  // share one scale. RoPE turns a key's energy from one channel of a pair
  // into the other as the position grows, and the calibration saw only the
  // first few hundred positions; a scale the same on both channels commutes
  // with the turn, so it holds at every position. (Scaled per channel,
  // SmolLM2 at 8k context lost 33% perplexity with a 4-bit K.) The slow
  // pairs, which turn less than kMaxTurn radians over the whole context (in
  // Qwen2 the ones that carry the bias channels), keep a scale per channel:
  // what was measured holds there. Tied pairs pool their statistics: the
  // larger max |k|, the summed q^2.
  // pi/4; measured: 0.3 and pi/4 alike, pi/2 worse at 8k (SmolLM2 KL 0.072
  // against 0.109), tying every pair worse at 512 (Qwen KL 0.041 against 0.035).
  constexpr double kMaxTurn = 0.7853981633974483;
  const int64_t half = c.rope_dims / 2;
  const bool neox = c.rope_style == RopeStyle::kNeox;
  std::vector<double> qcount(n, 0.0);
  std::vector<float> cs1(static_cast<size_t>(2 * std::max<int64_t>(half, 1))), sn1(cs1.size());
  for (int64_t l = 0; l < c.n_layer; ++l) {
    rope_tables(c, 0, 2, cs1.data(), sn1.data(), n_ctx, c.is_swa(l));  // positions 0 and 1
    for (int64_t h = 0; h < c.n_head_kv; ++h) {
      const size_t b = static_cast<size_t>(l * kv_dim + h * hd);
      for (int64_t i = 0; i < hd; ++i) qcount[b + i] = static_cast<double>(qn[l]);
      for (int64_t i = 0; i < half; ++i) {
        const double step = std::atan2(static_cast<double>(sn1[static_cast<size_t>(half + i)]),
                                       static_cast<double>(cs1[static_cast<size_t>(half + i)]));
        if (std::fabs(step) * static_cast<double>(std::max<int64_t>(n_ctx - 1, 1)) <= kMaxTurn)
          continue;
        const size_t x = b + static_cast<size_t>(neox ? i : 2 * i);
        const size_t y = b + static_cast<size_t>(neox ? i + half : 2 * i + 1);
        kmax[x] = kmax[y] = std::max(kmax[x], kmax[y]);
        qsq[x] = qsq[y] = qsq[x] + qsq[y];
        qcount[x] = qcount[y] = 2.0 * static_cast<double>(qn[l]);
      }
    }
  }
  std::vector<float> scales(n, 1.0f);
  for (int64_t l = 0; l < c.n_layer; ++l)
    for (int64_t h = 0; h < c.n_head_kv; ++h) {
      const size_t b = static_cast<size_t>(l * kv_dim + h * hd);
      std::vector<double> lg(static_cast<size_t>(hd), 0.0);
      double mean = 0.0;
      int64_t used = 0;
      for (int64_t i = 0; i < hd; ++i) {
        const double q_rms = std::sqrt(qsq[b + i] / std::max(qcount[b + i], 1.0));
        if (kmax[b + i] > 0.0 && q_rms > 0.0 && std::isfinite(kmax[b + i]) &&
            std::isfinite(q_rms)) {
          lg[i] = 0.5 * std::log2(kmax[b + i] / q_rms);
          mean += lg[i];
          ++used;
        } else {
          lg[i] = std::nan("");
        }
      }
      if (used == 0) continue;
      mean /= static_cast<double>(used);
      for (int64_t i = 0; i < hd; ++i) {
        if (std::isnan(lg[i])) continue;
        const double e = std::clamp(lg[i] - mean, -12.0, 12.0);
        scales[b + i] = static_cast<float>(std::exp2(e));
      }
    }
  spdlog::info("kv: key scales measured on {} tokens in {:.2f} s", ids.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return scales;
}

void check_key_scales(const ModelConfig& c, const KvLayout& kv, const std::vector<float>& scales) {
  if (!kv_type_info(kv.k_type).scaled) {
    if (!scales.empty())
      fail("internal: key scales given for a {} cache, which does not use them",
           kv_type_name(kv.k_type));
    return;
  }
  const size_t want = static_cast<size_t>(c.n_layer * c.n_head_kv * c.head_dim);
  if (scales.size() != want)
    fail("internal: a {} cache needs {} key scales (n_layer x kv_dim), got {}",
         kv_type_name(kv.k_type), want, scales.size());
  for (size_t i = 0; i < scales.size(); ++i)
    if (!(scales[i] > 0.0f) || !std::isfinite(scales[i]))
      fail("internal: key scale {} is {}, not a positive finite number", i, scales[i]);
}

}  // namespace barata
