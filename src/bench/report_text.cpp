// The bench report as markdown tables (for people) and as one long CSV table
// (for machines: one row per measured quantity).
#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "barata/bench.h"

namespace barata::bench {
namespace {

// About three significant digits, never scientific for ordinary sizes.
std::string num(double x) {
  const double a = std::fabs(x);
  if (a >= 100 || a == 0) return fmt::format("{:.0f}", x);
  if (a >= 10) return fmt::format("{:.1f}", x);
  if (a >= 1) return fmt::format("{:.2f}", x);
  if (a >= 0.01) return fmt::format("{:.3f}", x);
  return fmt::format("{:.3g}", x);
}

std::string stat(const Stats& s) {
  if (s.n == 0) return "-";
  return fmt::format("{} ± {} ({})", num(s.mean), num(s.sd), num(s.median));
}

// 1.23 G style, for counts of multiply-accumulates and bytes.
std::string si(double x, const char* unit = "") {
  static const char* kPrefix[] = {"", " k", " M", " G", " T", " P"};
  int i = 0;
  while (std::fabs(x) >= 1000 && i < 5) {
    x /= 1000;
    ++i;
  }
  return fmt::format("{}{}{}", num(x), kPrefix[i], unit);
}

double ratio(double a, double b) {
  return b != 0 ? a / b : 0.0;
}

void prefill_md(std::string& o, const Report& r) {
  o += "\n### Prefill: one pass over P prompt tokens\n\n"
       "TTFT = the prefill plus one sampling step (the default sampler) on its logits.\n\n"
       "| threads | P | ms | ms/token | tokens/s | TTFT ms |\n|---:|---:|---|---|---|---|\n";
  for (const ThreadRun& t : r.runs)
    for (const PrefillRow& p : t.prefill)
      o += fmt::format("| {} | {} | {} | {} | {} | {} |\n", t.n_threads, p.n_tokens, stat(p.ms),
                       stat(p.ms_per_token), stat(p.tokens_per_s), stat(p.ttft_ms));
}

void decode_md(std::string& o, const Report& r) {
  o += fmt::format(
      "\n### Decode: one-token steps against a cache of C tokens\n\n"
      "Each repetition times {} consecutive steps from a cache of exactly C tokens (then truncates "
      "back to C). GB/s = (weights + K/V read per step) / step time.\n\n"
      "| threads | C | ms/step | tokens/s | bytes/step | GB/s |\n|---:|---:|---|---|---:|---|\n",
      r.settings.decode_steps);
  for (const ThreadRun& t : r.runs)
    for (const DecodeRow& d : t.decode)
      o += fmt::format("| {} | {} | {} | {} | {} | {} |\n", t.n_threads, d.n_cached,
                       stat(d.ms_per_step), stat(d.tokens_per_s), si(d.bytes_per_step, "B"),
                       stat(d.gb_per_s));
  bool header = false;
  for (const ThreadRun& t : r.runs) {
    for (const PrefillRow& p : t.prefill) {
      for (const DecodeRow& d : t.decode) {
        if (d.n_cached != p.n_tokens) continue;
        if (!header) {
          o += "\n#### Per token: prefill against decode (medians, P = C)\n\n"
               "| threads | tokens | prefill ms/token | decode ms/token | decode / prefill |\n"
               "|---:|---:|---:|---:|---:|\n";
          header = true;
        }
        o += fmt::format("| {} | {} | {} | {} | {} |\n", t.n_threads, p.n_tokens,
                         num(p.ms_per_token.median), num(d.ms_per_step.median),
                         num(ratio(d.ms_per_step.median, p.ms_per_token.median)));
      }
    }
  }
}

void cache_md(std::string& o, const Report& r) {
  o += "\n### KV cache against no cache: greedy generation of T tokens\n\n"
       "Cumulative over the first T generated tokens (the prompt's prefill included). MACs are "
       "the multiply-accumulates the engine counted: projections (every matrix, logits included) "
       "and attention (q·k and p·v). MAC ratio = no-cache total / cache total.\n\n";
  for (const ThreadRun& t : r.runs) {
    const CacheResult& c = t.cache;
    if (!c.ran) continue;
    if (c.ids_identical)
      o += fmt::format("- threads {}: ids **identical** ({} tokens from a {}-token prompt)\n",
                       t.n_threads, c.n_generate, c.prompt_tokens);
    else
      o += fmt::format(
          "- threads {}: ids **NOT identical**: first difference at generated token {}\n",
          t.n_threads, c.first_mismatch);
  }
  o += "\n| threads | T | cache ms | no-cache ms | time ratio | cache proj MACs | cache attn MACs "
       "| no-cache proj MACs | no-cache attn MACs | attn MAC ratio | MAC ratio |\n"
       "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const ThreadRun& t : r.runs) {
    for (const CachePoint& p : t.cache.points) {
      const double cache_total = static_cast<double>(p.cache_proj_macs + p.cache_attn_macs);
      const double none_total = static_cast<double>(p.no_cache_proj_macs + p.no_cache_attn_macs);
      o += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", t.n_threads,
                       p.n_generated, stat(p.cache_ms), stat(p.no_cache_ms),
                       num(ratio(p.no_cache_ms.median, p.cache_ms.median)), si(p.cache_proj_macs),
                       si(p.cache_attn_macs), si(p.no_cache_proj_macs), si(p.no_cache_attn_macs),
                       num(ratio(p.no_cache_attn_macs, p.cache_attn_macs)),
                       num(ratio(none_total, cache_total)));
    }
  }
}

void kv_md(std::string& o, const Report& r) {
  o += "\n### KV memory: allocated against the formula\n\n"
       "The cache hands out whole blocks of 16 tokens, so the formula is "
       "2 (K and V) × layers × kv_heads × head_dim × 2 bytes (fp16) × ceil(tokens / 16) × 16. "
       "`unrounded` is the same product for the exact token count.\n\n"
       "| shape | layers | kv heads | head dim | tokens | bytes/token | blocks | rounded tokens "
       "| formula bytes | allocated bytes | unrounded bytes | equal |\n"
       "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const KvRow& k : r.kv)
    o +=
        fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", k.shape.name,
                    k.shape.n_layer, k.shape.n_head_kv, k.shape.head_dim, k.shape.n_tokens,
                    k.bytes_per_token, k.n_blocks, k.rounded_tokens, k.formula_bytes,
                    k.bytes_allocated, k.exact_bytes, k.equal ? "equal" : "NOT equal");
}

void batch_md(std::string& o, const Report& r) {
  o += fmt::format(
      "\n### Batch sweep: B sequences of {} cached tokens, one decode step together\n\n"
      "| threads | B | step ms | tokens/s |\n|---:|---:|---|---|\n",
      r.settings.batch_cached);
  for (const ThreadRun& t : r.runs)
    for (const BatchRow& b : t.batch)
      o += fmt::format("| {} | {} | {} | {} |\n", t.n_threads, b.batch, stat(b.step_ms),
                       stat(b.tokens_per_s));
}

void roofline_md(std::string& o, const Report& r) {
  o += "\n### Roofline: decode against the memory bandwidth\n\n"
       "Bandwidth: a streaming read of the buffer by all threads. A decode token reads every "
       "weight matrix once; fraction = (weight bytes / median step time) / median bandwidth; "
       "bound = the tokens/s that bandwidth allows.\n\n"
       "| threads | buffer | bandwidth GB/s | weight bytes/token | C | decode ms/step | weights "
       "GB/s "
       "| fraction | bound tokens/s |\n|---:|---:|---|---:|---:|---|---:|---:|---:|\n";
  for (const ThreadRun& t : r.runs) {
    const RooflineResult& f = t.roofline;
    if (!f.ran) continue;
    o += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {:.0f}% | {} |\n", t.n_threads,
                     fmt::format("{} MiB", f.buffer_bytes >> 20), stat(f.bandwidth_gb_per_s),
                     si(f.weight_bytes, "B"), f.n_cached, stat(f.decode_ms_per_step),
                     num(f.weight_gb_per_s), 100 * f.fraction, num(f.bound_tokens_per_s));
  }
  for (const ThreadRun& t : r.runs) {
    if (t.roofline.ran && t.roofline.fraction > 1) {
      o += fmt::format(
          "\nAbove 100%: the weights ({}) fit in the CPU's caches, so decode does not stream them "
          "from memory; the bound does not apply.\n",
          si(t.roofline.weight_bytes, "B"));
      break;
    }
  }
}

// What the backend holds and the peaks it runs against: the fraction of the
// memory bandwidth decode reaches, and of the fp16 tensor peak prefill does.
void device_md(std::string& o, const Report& r) {
  bool any = false;
  for (const ThreadRun& t : r.runs) any = any || t.device != "cpu";
  if (!any) return;
  const ModelInfo& m = r.model;
  o += "\n### Device\n\n";
  for (const ThreadRun& t : r.runs) {
    const DeviceReport& d = t.report;
    o += fmt::format("- {}: {}\n", t.device, d.name);
    if (d.peak_gb_per_s > 0)
      o += fmt::format(
          "  - peak memory bandwidth {:.0f} GB/s (memory clock x bus width); dense "
          "fp16 tensor peak {:.0f} TFLOP/s\n",
          d.peak_gb_per_s, d.peak_fp16_tflops);
    const int64_t pool_tokens =
        m.kv_bytes_per_token > 0 ? d.kv_pool_bytes / m.kv_bytes_per_token : 0;
    o += fmt::format(
        "  - weights on the device {}; KV pool {} for {} tokens: {} bytes per token "
        "measured from the pool, {} by the formula\n",
        si(d.weight_bytes, "B"), si(d.kv_pool_bytes, "B"), pool_tokens,
        pool_tokens > 0 ? d.kv_pool_bytes / pool_tokens : 0, m.kv_bytes_per_token);
    if (d.peak_bytes > 0)
      o += fmt::format(
          "  - peak device memory allocated by barata {} (weights, KV pool, "
          "activations and workspaces)\n",
          si(d.peak_bytes, "B"));
    for (const std::string& n : d.notes) o += fmt::format("  - note: {}\n", n);
    if (r.verbose && !d.kernels.empty()) {
      o += "\n  | weight type | width | kernel |\n  |---|---:|---|\n";
      for (const KernelChoice& k : d.kernels)
        o += fmt::format("  | {} | {} | {} |\n", k.weight_type, k.width, k.kernel);
      o += "\n";
    }
    if (t.roofline.ran && d.peak_gb_per_s > 0)
      o += fmt::format("  - decode at C={}: weights {:.0f} GB/s = {:.0f}% of the peak bandwidth\n",
                       t.roofline.n_cached, t.roofline.weight_gb_per_s,
                       100 * t.roofline.weight_gb_per_s / d.peak_gb_per_s);
    for (const PrefillRow& p : t.prefill) {
      // 2 flops per multiply-accumulate: every matrix for each token (the
      // output only for the last), plus causal attention's QK and PV.
      const double P = static_cast<double>(p.n_tokens);
      const double proj = 2.0 * P * static_cast<double>(m.matmul_params - m.n_vocab * m.d_model) +
                          2.0 * static_cast<double>(m.n_vocab * m.d_model);
      const double attn = 2.0 * 2.0 * (P * (P + 1) / 2) * static_cast<double>(m.head_dim) *
                          static_cast<double>(m.n_head * m.n_layer);
      const double tflops = (proj + attn) / (p.ms.median * 1e-3) / 1e12;
      o += fmt::format("  - prefill P={}: {:.2f} TFLOP/s{}\n", p.n_tokens, tflops,
                       d.peak_fp16_tflops > 0 ? fmt::format(" = {:.1f}% of the fp16 tensor peak",
                                                            100 * tflops / d.peak_fp16_tflops)
                                              : "");
    }
  }
}

bool has(const Report& r, const char* test) {
  return std::find(r.tests.begin(), r.tests.end(), test) != r.tests.end();
}

}  // namespace

std::string to_markdown(const Report& r) {
  const ModelInfo& m = r.model;
  std::string o = "## barata bench\n\n";
  o += fmt::format(
      "- model: `{}`: {}, {}, {} layers, d_model {}, {}/{} heads × {}, d_ff {}, vocab {}\n", m.path,
      m.arch, m.weight_type, m.n_layer, m.d_model, m.n_head, m.n_head_kv, m.head_dim, m.d_ff,
      m.n_vocab);
  if (m.n_expert > 0)
    o += fmt::format(
        "- mixture of experts: {} of {} experts (width {}) per token: {} of {} parameters "
        "active; a decode token reads {} of the {} of matrices held (decode's GB/s and the "
        "roofline below count the active bytes)\n",
        m.n_expert_used, m.n_expert, m.d_ff_exp, si(m.active_params, ""), si(m.total_params, ""),
        si(m.weight_bytes, "B"), si(m.total_weight_bytes, "B"));
  o += fmt::format(
      "- context {} tokens; weights read per decode token {} ({} bytes); KV cache {} bytes per "
      "token ({})",
      m.n_ctx, si(m.weight_bytes, "B"), m.weight_bytes, m.kv_bytes_per_token, m.kv_cache);
  if (m.kv_bytes_at_ctx > 0 && m.kv_bytes_at_ctx < m.n_ctx * m.kv_bytes_per_token)
    o += fmt::format(
        "; a sequence at {} tokens holds {} ({:.0f}% of the full cache: the sliding-window "
        "layers keep their window)",
        m.n_ctx, si(m.kv_bytes_at_ctx, "B"),
        100.0 * static_cast<double>(m.kv_bytes_at_ctx) /
            static_cast<double>(m.n_ctx * m.kv_bytes_per_token));
  o += "\n";
  o += fmt::format("- machine: {}, {} hardware threads; threads measured: {}\n", r.cpu,
                   r.hardware_threads, fmt::join(r.threads, ", "));
  o += fmt::format("- method: {} repetitions after one warm-up; cells read mean ± sd (median)\n",
                   r.settings.reps);
  for (const std::string& n : r.notices) o += fmt::format("- note: {}\n", n);
  if (r.interrupted) o += "- **interrupted**: the tables hold what was measured before Ctrl-C\n";
  if (has(r, "prefill")) prefill_md(o, r);
  if (has(r, "decode")) decode_md(o, r);
  if (has(r, "cache")) cache_md(o, r);
  if (has(r, "kv")) kv_md(o, r);
  if (has(r, "batch")) batch_md(o, r);
  if (has(r, "roofline")) roofline_md(o, r);
  device_md(o, r);
  return o;
}

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

struct Csv {
  std::string out = "test,threads,param,x,label,metric,mean,sd,median,min,max,n\n";
  void stat(const char* test, int threads, const char* param, int64_t x, const std::string& label,
            const char* metric, const Stats& s) {
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{}\n", test,
                       threads > 0 ? std::to_string(threads) : "", param, x, csv_field(label),
                       metric, s.mean, s.sd, s.median, s.min, s.max, s.n);
  }
  void value(const char* test, int threads, const char* param, int64_t x, const std::string& label,
             const char* metric, double v) {
    stat(test, threads, param, x, label, metric, Stats{v, 0, v, v, v, 1});
  }
};

}  // namespace

std::string to_csv(const Report& r) {
  Csv c;
  for (const ThreadRun& t : r.runs) {
    const int th = t.n_threads;
    for (const PrefillRow& p : t.prefill) {
      c.stat("prefill", th, "P", p.n_tokens, "", "ms", p.ms);
      c.stat("prefill", th, "P", p.n_tokens, "", "ms_per_token", p.ms_per_token);
      c.stat("prefill", th, "P", p.n_tokens, "", "tokens_per_s", p.tokens_per_s);
      c.stat("prefill", th, "P", p.n_tokens, "", "ttft_ms", p.ttft_ms);
    }
    for (const DecodeRow& d : t.decode) {
      c.stat("decode", th, "C", d.n_cached, "", "ms_per_step", d.ms_per_step);
      c.stat("decode", th, "C", d.n_cached, "", "tokens_per_s", d.tokens_per_s);
      c.stat("decode", th, "C", d.n_cached, "", "gb_per_s", d.gb_per_s);
      c.value("decode", th, "C", d.n_cached, "", "bytes_per_step", d.bytes_per_step);
    }
    if (t.cache.ran) {
      c.value("cache", th, "T", t.cache.n_generate, "", "ids_identical", t.cache.ids_identical);
      for (const CachePoint& p : t.cache.points) {
        c.stat("cache", th, "T", p.n_generated, "", "cache_ms", p.cache_ms);
        c.stat("cache", th, "T", p.n_generated, "", "no_cache_ms", p.no_cache_ms);
        c.value("cache", th, "T", p.n_generated, "", "cache_proj_macs", p.cache_proj_macs);
        c.value("cache", th, "T", p.n_generated, "", "cache_attn_macs", p.cache_attn_macs);
        c.value("cache", th, "T", p.n_generated, "", "no_cache_proj_macs", p.no_cache_proj_macs);
        c.value("cache", th, "T", p.n_generated, "", "no_cache_attn_macs", p.no_cache_attn_macs);
      }
    }
    for (const BatchRow& b : t.batch) {
      c.stat("batch", th, "B", b.batch, "", "step_ms", b.step_ms);
      c.stat("batch", th, "B", b.batch, "", "tokens_per_s", b.tokens_per_s);
    }
    const RooflineResult& f = t.roofline;
    if (f.ran) {
      c.stat("roofline", th, "C", f.n_cached, "", "bandwidth_gb_per_s", f.bandwidth_gb_per_s);
      c.stat("roofline", th, "C", f.n_cached, "", "decode_ms_per_step", f.decode_ms_per_step);
      c.value("roofline", th, "C", f.n_cached, "", "weight_bytes", f.weight_bytes);
      c.value("roofline", th, "C", f.n_cached, "", "weight_gb_per_s", f.weight_gb_per_s);
      c.value("roofline", th, "C", f.n_cached, "", "fraction", f.fraction);
      c.value("roofline", th, "C", f.n_cached, "", "bound_tokens_per_s", f.bound_tokens_per_s);
    }
  }
  for (const KvRow& k : r.kv) {
    const std::string label = fmt::format("{} L{} H{} D{}", k.shape.name, k.shape.n_layer,
                                          k.shape.n_head_kv, k.shape.head_dim);
    c.value("kv", 0, "tokens", k.shape.n_tokens, label, "bytes_allocated", k.bytes_allocated);
    c.value("kv", 0, "tokens", k.shape.n_tokens, label, "formula_bytes", k.formula_bytes);
    c.value("kv", 0, "tokens", k.shape.n_tokens, label, "unrounded_bytes", k.exact_bytes);
    c.value("kv", 0, "tokens", k.shape.n_tokens, label, "equal", k.equal);
  }
  return c.out;
}

}  // namespace barata::bench
