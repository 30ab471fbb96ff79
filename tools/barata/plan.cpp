// barata plan: how much context, for how many users, fits on a card: weights
// + fp16 KV bytes per token x resident tokens + a reserve, per memory size,
// for a preset shape or a GGUF file; as plain tables or (--json) one JSON
// document. docs/plan.md.
#include <cstdio>
#include <memory>
#include <optional>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/gguf.h"
#include "barata/kv_cache.h"
#include "barata/plan.h"
#include "commands.h"
#include "session.h"

namespace barata::cli {
namespace {

using json = nlohmann::ordered_json;
using plan::group_thousands;

struct PlanArgs {
  std::string preset, model, weights;
  std::vector<std::string> mem{"8G", "16G", "24G", "80G"};
  std::string reserve = "1.5G";
  bool json = false;
  bool swa_full = false;
  std::string cache_k = "f16", cache_v = "f16";
  double gb_per_s = 0;  // --gb-per-s: the decode bound the weights' reads allow
};

// 7e9 -> "6.52 GiB", 2e7 -> "19.1 MiB".
std::string human(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= double(1 << 30)) return fmt::format("{:.2f} GiB", b / double(1 << 30));
  if (b >= double(1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  if (b >= double(1 << 10)) return fmt::format("{:.1f} KiB", b / double(1 << 10));
  return fmt::format("{} B", bytes);
}

// A memory size as given: 17179869184 -> "16 GiB", 1610612736 -> "1.5 GiB",
// at most four decimals.
std::string gib_label(int64_t bytes) {
  std::string s =
      fmt::format("{:.4f}", static_cast<double>(bytes) / static_cast<double>(plan::kGiB));
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s + " GiB";
}

double stored_bits(const plan::ModelShape& m) {
  return m.n_params > 0 ? 8.0 * static_cast<double>(m.weight_bytes) / m.n_params : 0.0;
}

json to_json(const plan::ModelShape& m, int64_t reserve, const std::vector<plan::MemoryPlan>& ps,
             double gb_per_s) {
  json j;
  j["model"] = {{"name", m.name},
                {"source", m.from_file ? "file" : "preset"},
                {"params", m.n_params},
                {"weights", m.format ? plan::weight_format_name(*m.format) : "file"},
                {"bits_per_weight", m.format ? plan::bits_per_weight(*m.format) : stored_bits(m)},
                {"weight_bytes", m.weight_bytes},
                {"active_params", m.active_params},
                {"active_weight_bytes", m.active_weight_bytes},
                {"n_expert", m.n_expert},
                {"n_expert_used", m.n_expert_used},
                {"n_layer", m.n_layer},
                {"n_head_kv", m.n_head_kv},
                {"head_dim", m.head_dim},
                {"kv_cache_type_k", kv_type_name(m.k_type)},
                {"kv_cache_type_v", kv_type_name(m.v_type)},
                {"kv_bytes_per_token", m.kv_bytes_per_token()},
                {"sliding_window_layers", m.n_swa_layers},
                {"sliding_window", m.n_swa}};
  j["reserve_bytes"] = reserve;
  if (gb_per_s > 0)
    j["decode_bound"] = {
        {"gb_per_s", gb_per_s},
        {"tokens_per_s", gb_per_s * 1e9 / static_cast<double>(m.active_weight_bytes)}};
  json mem = json::array();
  for (const auto& p : ps) {
    json users = json::array();
    for (const auto& [u, ctx] : p.users) users.push_back({{"users", u}, {"context", ctx}});
    mem.push_back({{"gib", static_cast<double>(p.memory_bytes) / static_cast<double>(plan::kGiB)},
                   {"bytes", p.memory_bytes},
                   {"fits", p.fits},
                   {"free_bytes", p.free_bytes},
                   {"max_tokens", p.max_tokens},
                   {"context_per_user", users}});
  }
  j["memory"] = std::move(mem);
  return j;
}

void print_text(const plan::ModelShape& m, int64_t reserve, const std::vector<plan::MemoryPlan>& ps,
                double gb_per_s) {
  const std::string what =
      m.format ? fmt::format("{} ({} bits/weight)", plan::weight_format_name(*m.format),
                             plan::bits_per_weight(*m.format))
               : fmt::format("as stored ({:.2f} bits/weight)", stored_bits(m));
  fmt::print("model: {} {}, {} params, {}: weights {}\n", m.from_file ? "file" : "preset", m.name,
             group_thousands(m.n_params), what, human(m.weight_bytes));
  if (m.n_expert > 0)
    fmt::print(
        "mixture of experts: {} of {} experts per token: memory holds all {} weights, a decode "
        "token reads {} ({} params active)\n",
        m.n_expert_used, m.n_expert, human(m.weight_bytes), human(m.active_weight_bytes),
        group_thousands(m.active_params));
  if (gb_per_s > 0)
    fmt::print("decode at {} GB/s: at most {:.1f} tokens/s per step from the {} of weights read\n",
               gb_per_s, gb_per_s * 1e9 / static_cast<double>(m.active_weight_bytes),
               human(m.active_weight_bytes));
  if (m.k_type == KvType::kF16 && m.v_type == KvType::kF16) {
    fmt::print("KV cache: fp16, {} B/token (2 x {} layers x {} KV heads x {} x 2 B)\n",
               group_thousands(m.kv_bytes_per_token()), m.n_layer, m.n_head_kv, m.head_dim);
  } else {
    const int64_t kv_dim = m.n_head_kv * m.head_dim;
    fmt::print(
        "KV cache: {}, {} B/token ({} layers x (K {} + V {} B for {} KV heads x {}); fp16 would "
        "take {})\n",
        kv_cache_label(m.k_type, m.v_type), group_thousands(m.kv_bytes_per_token()), m.n_layer,
        kv_row_bytes(m.k_type, kv_dim), kv_row_bytes(m.v_type, kv_dim), m.n_head_kv, m.head_dim,
        group_thousands(4 * m.n_layer * kv_dim));
  }
  if (m.sliding()) {
    constexpr int64_t kAt = 8192;
    fmt::print(
        "sliding window: {} of the {} layers see the last {} positions; their blocks behind it "
        "(and {} kept back) are freed: a user at {} tokens holds {}, {:.0f}% of the full {} "
        "(--swa-full counts every position)\n",
        m.n_swa_layers, m.n_layer, m.n_swa, KvBlockManager::kDefaultKeepBack, group_thousands(kAt),
        human(m.kv_bytes_for(kAt)),
        100.0 * static_cast<double>(m.kv_bytes_for(kAt)) /
            static_cast<double>(kAt * m.kv_bytes_per_token()),
        human(kAt * m.kv_bytes_per_token()));
  }
  fmt::print("reserve: {}\n", human(reserve));
  for (const auto& p : ps) {
    fmt::print("\n");
    if (!p.fits) {
      fmt::print("{}: does not fit: weights {} + reserve {} exceed it by {} (0 tokens)\n",
                 gib_label(p.memory_bytes), human(m.weight_bytes), human(reserve),
                 human(-p.free_bytes));
      continue;
    }
    fmt::print("{}: {} tokens{} ({} for KV after weights and reserve)\n\n",
               gib_label(p.memory_bytes), group_thousands(p.max_tokens),
               m.sliding() ? " for one user" : "", human(p.free_bytes));
    fmt::print("| users | context per user |\n");
    fmt::print("|------:|-----------------:|\n");
    for (const auto& [u, ctx] : p.users)
      fmt::print("| {:>5} | {:>16} |\n", u, group_thousands(ctx));
  }
}

int run(const PlanArgs& a) {
  std::optional<plan::WeightFormat> format;
  if (!a.weights.empty()) format = plan::parse_weight_format(a.weights);  // checked by CLI11
  std::vector<int64_t> mem;
  for (const auto& s : a.mem) mem.push_back(plan::parse_gib(s, "--mem"));
  const int64_t reserve = plan::parse_gib(a.reserve, "--reserve", /*allow_zero=*/true);

  const KvType k = parse_kv_type(a.cache_k).value(), v = parse_kv_type(a.cache_v).value();
  if (kv_type_info(v).k_only)
    fail("--cache-type-v: {} rotates keys only; V takes {}", a.cache_v, kv_type_names(false));
  plan::ModelShape m;
  if (!a.model.empty()) {
    m = plan::from_gguf(GgufFile::open(a.model), format, a.swa_full, k, v);
  } else if (!a.preset.empty()) {
    m = plan::preset(a.preset, format.value_or(plan::WeightFormat::kFp16));
    m.k_type = k;
    m.v_type = v;
  } else {
    fail("plan: name a model: --preset 7b|13b|70b or -m FILE");
  }
  std::vector<plan::MemoryPlan> ps;
  for (int64_t b : mem) ps.push_back(plan::plan_memory(m, b, reserve));
  if (a.json) {
    fmt::print(
        "{}\n",
        to_json(m, reserve, ps, a.gb_per_s).dump(2, ' ', false, json::error_handler_t::replace));
  } else {
    print_text(m, reserve, ps, a.gb_per_s);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

Command add_plan(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "plan", "How much context, for how many users, fits in a memory size (weights + KV cache)");
  auto a = std::make_shared<PlanArgs>();
  auto* preset = sub->add_option("--preset", a->preset, "Model shape: 7b, 13b or 70b");
  auto* model = sub->add_option("-m,--model", a->model, "GGUF file: its exact weights and shape")
                    ->check(CLI::ExistingFile);
  preset->excludes(model);
  sub->add_option("--weights", a->weights,
                  "Weights as fp16, int8 or int4 (4.125 bits: group-128, fp16 scales); default: "
                  "fp16 for a preset, the file's own bytes for -m")
      ->check(CLI::IsMember({"fp16", "int8", "int4"}));
  sub->add_option("--mem", a->mem, "Memory sizes in GiB, e.g. 8G,16G,24G (default: 8,16,24,80)")
      ->delimiter(',');
  sub->add_option("--reserve", a->reserve,
                  "GiB kept free for activations, the runtime and fragmentation (default: 1.5)");
  sub->add_flag("--json", a->json, "Print one JSON document instead of tables");
  sub->add_option("--gb-per-s", a->gb_per_s,
                  "Memory bandwidth in GB/s: print the decode rate the weights one token reads "
                  "allow (a mixture of experts: its active experts only)")
      ->check(CLI::Range(0.001, 1e6));
  sub->add_flag("--swa-full", a->swa_full,
                "Count every position of the sliding-window layers (as barata run --swa-full)");
  add_cache_type_options(sub, a->cache_k, a->cache_v);
  return {sub, [a] { return run(*a); }};
}

}  // namespace barata::cli
