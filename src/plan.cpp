#include "barata/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

#include <fmt/core.h>

#include "barata/error.h"
#include "barata/kv_cache.h"
#include "barata/model_config.h"

namespace barata::plan {
namespace {

// Eighths of a bit per weight: int4's 4.125 is 33 / 8, so every size is an
// integer computation.
int64_t eighth_bits(WeightFormat f) {
  switch (f) {
    case WeightFormat::kFp16:
      return 128;
    case WeightFormat::kInt8:
      return 64;
    case WeightFormat::kInt4:
      return 33;  // 4 bits + one fp16 scale per 128 weights: 4 + 16 / 128
  }
  return 128;
}

struct Preset {
  const char* name;
  double n_params;
  int64_t n_layer, n_head_kv, head_dim;
};
constexpr Preset kPresets[] = {
    {"7b", 7.0e9, 32, 8, 128},
    {"13b", 13.0e9, 40, 40, 128},
    {"70b", 70.0e9, 80, 8, 128},
};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool iends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && iequals(s.substr(s.size() - suffix.size()), suffix);
}

// [+-]? digits [. digits], or [+-]? . digits: what strtod would read, without
// hex, exponents, inf or nan.
bool plain_decimal(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  bool digits = false, dot = false;
  for (; i < s.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(s[i]))) {
      digits = true;
    } else if (s[i] == '.' && !dot) {
      dot = true;
    } else {
      return false;
    }
  }
  return digits;
}

std::string mib_or_gib(double bytes) {
  if (bytes >= static_cast<double>(kGiB))
    return fmt::format("{:.2f} GiB", bytes / static_cast<double>(kGiB));
  return fmt::format("{:.1f} MiB", bytes / double(1 << 20));
}

}  // namespace

std::optional<WeightFormat> parse_weight_format(std::string_view name) {
  if (name == "fp16") return WeightFormat::kFp16;
  if (name == "int8") return WeightFormat::kInt8;
  if (name == "int4") return WeightFormat::kInt4;
  return std::nullopt;
}

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kFp16:
      return "fp16";
    case WeightFormat::kInt8:
      return "int8";
    case WeightFormat::kInt4:
      return "int4";
  }
  return "?";
}

double bits_per_weight(WeightFormat f) {
  return static_cast<double>(eighth_bits(f)) / 8.0;
}

int64_t weight_bytes(int64_t n_params, WeightFormat f) {
  return (n_params * eighth_bits(f) + 63) / 64;  // eighths of a bit -> bytes, rounded up
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& p : kPresets) v.emplace_back(p.name);
    return v;
  }();
  return names;
}

ModelShape preset(std::string_view name, WeightFormat format) {
  for (const auto& p : kPresets) {
    if (!iequals(name, p.name)) continue;
    ModelShape m;
    m.name = p.name;
    m.n_params = static_cast<int64_t>(p.n_params);
    m.format = format;
    m.weight_bytes = weight_bytes(m.n_params, format);
    m.active_params = m.n_params;
    m.active_weight_bytes = m.weight_bytes;
    m.n_layer = p.n_layer;
    m.n_head_kv = p.n_head_kv;
    m.head_dim = p.head_dim;
    return m;
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown model preset '{}' (known: {})", name, known);
}

int64_t ModelShape::kv_bytes_for(int64_t len) const {
  const int64_t sw = sliding() ? n_swa_layers : 0;
  return kv_sequence_bytes(len, n_layer - sw, sw, sliding() ? n_swa : 0, kv_pair_bytes(),
                           KvBlockManager::kDefaultKeepBack);
}

namespace {

// The largest len in [0, cap] with fits(len), fits being monotone (0 fits).
int64_t largest_fitting(int64_t cap, const std::function<bool(int64_t)>& fits) {
  int64_t lo = 0, hi = cap;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace

int64_t context_per_user(const ModelShape& m, int64_t free_bytes, int64_t users, int64_t cap) {
  if (free_bytes <= 0 || users <= 0) return 0;
  return largest_fitting(cap,
                         [&](int64_t len) { return m.kv_bytes_for(len) <= free_bytes / users; });
}

ModelShape from_gguf(const GgufFile& f, std::optional<WeightFormat> format, bool swa_full, KvType k,
                     KvType v) {
  const ModelConfig c = ModelConfig::from_gguf(f);
  kv_layout_for(c, swa_full, k, v);  // checks the cache types against the head size
  ModelShape m;
  m.k_type = k;
  m.v_type = v;
  m.name = f.name();
  m.from_file = true;
  m.format = format;
  int64_t bytes = 0, inactive_params = 0, inactive_bytes = 0;
  m.n_expert = c.n_expert;
  m.n_expert_used = c.n_expert_used;
  for (const auto& t : f.tensors()) {
    m.n_params += t.n_elements;
    bytes += static_cast<int64_t>(t.n_bytes);
    // ffn_{gate,up,down}_exps: a token reads n_used of its n_expert matrices.
    const std::string_view name = t.name;
    if (c.moe() && name.size() > 12 && name.substr(name.size() - 12) == "_exps.weight") {
      const int64_t unused = c.n_expert - c.n_expert_used;
      inactive_params += static_cast<int64_t>(t.n_elements) / c.n_expert * unused;
      inactive_bytes += static_cast<int64_t>(t.n_bytes) / c.n_expert * unused;
    }
  }
  m.weight_bytes = format ? weight_bytes(m.n_params, *format) : bytes;
  m.active_params = m.n_params - inactive_params;
  m.active_weight_bytes = format ? weight_bytes(m.active_params, *format) : bytes - inactive_bytes;
  m.n_layer = c.n_layer;
  m.n_head_kv = c.n_head_kv;
  m.head_dim = c.head_dim;
  if (!swa_full && c.n_swa > 0) {
    m.n_swa_layers = c.n_swa_layers;
    m.n_swa = c.n_swa;
  }
  return m;
}

int64_t parse_gib(std::string_view text, std::string_view what, bool allow_zero) {
  std::string_view num = text;
  if (iends_with(num, "gib")) {
    num.remove_suffix(3);
  } else if (iends_with(num, "g")) {
    num.remove_suffix(1);
  }
  if (!plain_decimal(num))
    fail("{}: '{}' is not a size in GiB (write 16, 16G or 16GiB)", what, text);
  const std::string s(num);
  const double x = std::strtod(s.c_str(), nullptr);
  if (x < 0 || (x == 0 && !allow_zero))
    fail("{}: {} is not a size: it must be {}", what, text, allow_zero ? "0 or more" : "positive");
  constexpr double kMaxGiB = double(1 << 20);
  if (x > kMaxGiB) fail("{}: {} is beyond {} GiB", what, text, kMaxGiB);
  return std::llround(x * static_cast<double>(kGiB));
}

int64_t max_resident_tokens(int64_t memory_bytes, int64_t weight_bytes, int64_t reserve_bytes,
                            int64_t kv_bytes_per_token) {
  const int64_t free_bytes = memory_bytes - weight_bytes - reserve_bytes;
  if (free_bytes <= 0 || kv_bytes_per_token <= 0) return 0;
  return free_bytes / kv_bytes_per_token;
}

MemoryPlan plan_memory(const ModelShape& m, int64_t memory_bytes, int64_t reserve_bytes) {
  MemoryPlan p;
  p.memory_bytes = memory_bytes;
  p.free_bytes = memory_bytes - m.weight_bytes - reserve_bytes;
  p.fits = p.free_bytes >= 0;
  p.max_tokens =
      max_resident_tokens(memory_bytes, m.weight_bytes, reserve_bytes, m.kv_bytes_per_token());
  if (m.sliding()) {
    // A user's cost is not linear in its context: each count is searched.
    constexpr int64_t kCap = int64_t{1} << 31;
    for (int64_t u : kUserCounts)
      p.users.emplace_back(u, context_per_user(m, p.free_bytes, u, kCap));
    p.max_tokens = p.users.front().second;
    return p;
  }
  for (int64_t u : kUserCounts) p.users.emplace_back(u, p.max_tokens / u);
  return p;
}

namespace {

// "1 user x C1 context, or 4 x C4, ...": the counts past 1 while their
// context, context_for(users), is at least min(n_ctx, 256).
std::string users_and_contexts(int64_t n_ctx, const std::function<int64_t(int64_t)>& context_for) {
  std::string s;
  const int64_t useful = std::min<int64_t>(n_ctx, 256);
  for (int64_t u : kUserCounts) {
    const int64_t ctx = context_for(u);
    if (u == 1) {
      s += fmt::format("1 user x {} context", ctx);
    } else {
      if (ctx < useful) break;
      s += fmt::format("{} {} x {}", u == kUserCounts[1] ? ", or" : ",", u, ctx);
    }
  }
  return s;
}

}  // namespace

std::string describe_kv_pool(int64_t pool_tokens, int64_t n_ctx, int64_t bytes_per_token,
                             std::string_view types) {
  pool_tokens = std::max<int64_t>(pool_tokens, 0);
  n_ctx = std::max<int64_t>(n_ctx, 1);
  return fmt::format(
             "KV pool: {} tokens ({}, {}): ", pool_tokens,
             mib_or_gib(static_cast<double>(pool_tokens) * static_cast<double>(bytes_per_token)),
             types) +
         users_and_contexts(n_ctx, [&](int64_t u) { return std::min(n_ctx, pool_tokens / u); });
}

std::string describe_kv_pool_bytes(int64_t pool_bytes, int64_t n_ctx,
                                   const std::function<int64_t(int64_t)>& seq_bytes,
                                   std::string_view types) {
  n_ctx = std::max<int64_t>(n_ctx, 1);
  auto context_for = [&](int64_t u) {  // the longest context u users fit
    return largest_fitting(n_ctx, [&](int64_t len) { return seq_bytes(len) * u <= pool_bytes; });
  };
  return fmt::format("KV pool: {} ({}; sliding-window layers keep their window): ",
                     mib_or_gib(static_cast<double>(std::max<int64_t>(pool_bytes, 0))), types) +
         users_and_contexts(n_ctx, context_for);
}

std::string group_thousands(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace barata::plan
