// The bench report as one JSON document; docs/bench-schema.md describes every
// field (bump kSchema when a field changes meaning or goes away).
#include <nlohmann/json.hpp>

#include "barata/bench.h"

namespace barata::bench {
namespace {

using nlohmann::json;

constexpr const char* kSchema = "barata.bench/1";

json stat_json(const Stats& s) {
  return {{"mean", s.mean}, {"sd", s.sd},   {"median", s.median},
          {"min", s.min},   {"max", s.max}, {"n", s.n}};
}

json run_json(const ThreadRun& t) {
  json j = {{"threads", t.n_threads}};
  json& pre = j["prefill"] = json::array();
  for (const PrefillRow& p : t.prefill)
    pre.push_back({{"n_tokens", p.n_tokens},
                   {"ms", stat_json(p.ms)},
                   {"ms_per_token", stat_json(p.ms_per_token)},
                   {"tokens_per_s", stat_json(p.tokens_per_s)},
                   {"ttft_ms", stat_json(p.ttft_ms)}});
  json& dec = j["decode"] = json::array();
  for (const DecodeRow& d : t.decode)
    dec.push_back({{"n_cached", d.n_cached},
                   {"bytes_per_step", d.bytes_per_step},
                   {"ms_per_step", stat_json(d.ms_per_step)},
                   {"tokens_per_s", stat_json(d.tokens_per_s)},
                   {"gb_per_s", stat_json(d.gb_per_s)}});
  if (t.cache.ran) {
    const CacheResult& c = t.cache;
    json points = json::array();
    for (const CachePoint& p : c.points)
      points.push_back({{"n_generated", p.n_generated},
                        {"cache_ms", stat_json(p.cache_ms)},
                        {"no_cache_ms", stat_json(p.no_cache_ms)},
                        {"cache_proj_macs", p.cache_proj_macs},
                        {"cache_attn_macs", p.cache_attn_macs},
                        {"no_cache_proj_macs", p.no_cache_proj_macs},
                        {"no_cache_attn_macs", p.no_cache_attn_macs}});
    j["cache"] = {{"prompt_tokens", c.prompt_tokens},
                  {"n_generate", c.n_generate},
                  {"ids_identical", c.ids_identical},
                  {"first_mismatch", c.first_mismatch < 0 ? json(nullptr) : json(c.first_mismatch)},
                  {"ids_cache", c.ids_cache},
                  {"ids_no_cache", c.ids_no_cache},
                  {"points", points}};
  } else {
    j["cache"] = nullptr;
  }
  json& bat = j["batch"] = json::array();
  for (const BatchRow& b : t.batch)
    bat.push_back({{"batch", b.batch},
                   {"n_cached", b.n_cached},
                   {"step_ms", stat_json(b.step_ms)},
                   {"tokens_per_s", stat_json(b.tokens_per_s)}});
  j["device"] = {{"kind", t.device},
                 {"name", t.report.name},
                 {"peak_gb_per_s", t.report.peak_gb_per_s},
                 {"peak_fp16_tflops", t.report.peak_fp16_tflops},
                 {"weight_bytes", t.report.weight_bytes},
                 {"kv_pool_bytes", t.report.kv_pool_bytes},
                 {"peak_bytes", t.report.peak_bytes},
                 {"notes", t.report.notes}};
  json& kern = j["device"]["kernels"] = json::array();
  for (const KernelChoice& k : t.report.kernels)
    kern.push_back({{"weight_type", k.weight_type}, {"width", k.width}, {"kernel", k.kernel}});
  const RooflineResult& f = t.roofline;
  if (f.ran) {
    j["roofline"] = {{"buffer_bytes", f.buffer_bytes},
                     {"bandwidth_gb_per_s", stat_json(f.bandwidth_gb_per_s)},
                     {"weight_bytes", f.weight_bytes},
                     {"n_cached", f.n_cached},
                     {"kv_bytes", f.kv_bytes},
                     {"decode_ms_per_step", stat_json(f.decode_ms_per_step)},
                     {"weight_gb_per_s", f.weight_gb_per_s},
                     {"fraction", f.fraction},
                     {"bound_tokens_per_s", f.bound_tokens_per_s}};
  } else {
    j["roofline"] = nullptr;
  }
  return j;
}

}  // namespace

std::string to_json(const Report& r) {
  const ModelInfo& m = r.model;
  const Settings& s = r.settings;
  json j = {
      {"schema", kSchema},
      {"model",
       {{"path", m.path},
        {"arch", m.arch},
        {"weight_type", m.weight_type},
        {"n_layer", m.n_layer},
        {"d_model", m.d_model},
        {"n_head", m.n_head},
        {"n_head_kv", m.n_head_kv},
        {"head_dim", m.head_dim},
        {"d_ff", m.d_ff},
        {"n_vocab", m.n_vocab},
        {"n_ctx", m.n_ctx},
        {"weight_bytes", m.weight_bytes},
        {"kv_bytes_per_token", m.kv_bytes_per_token},
        {"kv_cache", m.kv_cache},
        {"kv_bytes_at_ctx", m.kv_bytes_at_ctx},
        {"total_params", m.total_params},
        {"active_params", m.active_params},
        {"total_weight_bytes", m.total_weight_bytes},
        {"n_expert", m.n_expert},
        {"n_expert_used", m.n_expert_used},
        {"d_ff_exp", m.d_ff_exp}}},
      {"machine", {{"cpu", r.cpu}, {"hardware_threads", r.hardware_threads}}},
      {"settings",
       {{"reps", s.reps},
        {"warmup", 1},
        {"threads", r.threads},
        {"tests", r.tests},
        {"prefill_tokens", s.prefill_tokens},
        {"cache_tokens", s.cache_tokens},
        {"batch_sizes", s.batch_sizes},
        {"batch_cached", s.batch_cached},
        {"decode_steps", s.decode_steps},
        {"n_generate", s.n_generate},
        {"bandwidth_bytes", s.bandwidth_bytes}}},
      {"notices", r.notices},
      {"interrupted", r.interrupted},
  };
  json& kv = j["kv"] = json::array();
  for (const KvRow& k : r.kv)
    kv.push_back({{"name", k.shape.name},
                  {"n_layer", k.shape.n_layer},
                  {"n_head_kv", k.shape.n_head_kv},
                  {"head_dim", k.shape.head_dim},
                  {"n_tokens", k.shape.n_tokens},
                  {"bytes_per_token", k.bytes_per_token},
                  {"block_tokens", PagedKvCache::kBlockTokens},
                  {"n_blocks", k.n_blocks},
                  {"rounded_tokens", k.rounded_tokens},
                  {"formula_bytes", k.formula_bytes},
                  {"unrounded_bytes", k.exact_bytes},
                  {"bytes_allocated", k.bytes_allocated},
                  {"equal", k.equal}});
  json& runs = j["runs"] = json::array();
  for (const ThreadRun& t : r.runs) runs.push_back(run_json(t));
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

}  // namespace barata::bench
