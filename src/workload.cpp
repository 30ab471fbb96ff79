#include "barata/workload.h"

#include "barata/error.h"
#include "barata/grammar.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "barata/error.h"
#include "barata/file_io.h"
#include "barata/tokenizer.h"

namespace barata::workload {
namespace {

using nlohmann::json;

// ---- JSONL ------------------------------------------------------------------

const char* const kKeys[] = {"prompt",     "id",      "max_tokens", "temperature", "top_k",
                             "top_p",      "min_p",   "seed",       "ignore_eos",  "stop",
                             "arrival_ms", "grammar", "json_schema"};

std::string known_keys() {
  std::string s;
  for (const char* k : kKeys) s += (s.empty() ? "" : ", ") + std::string(k);
  return s;
}

struct LineContext {
  const std::string& file;
  int64_t line;
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    barata::fail("{}: line {}: {}", file, line, fmt::format(f, std::forward<Args>(args)...));
  }
};

// An integer of the JSON value in [lo, hi].
int64_t get_int(const LineContext& c, const json& v, const char* key, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) c.fail("\"{}\" must be an integer, not {}", key, v.type_name());
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    c.fail("\"{}\" is {}, outside [{}, {}]", key, v.get<uint64_t>(), lo, hi);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) c.fail("\"{}\" is {}, outside [{}, {}]", key, x, lo, hi);
  return x;
}

double get_real(const LineContext& c, const json& v, const char* key) {
  if (!v.is_number()) c.fail("\"{}\" must be a number, not {}", key, v.type_name());
  const double x = v.get<double>();
  if (!std::isfinite(x)) c.fail("\"{}\" must be finite", key);
  return x;
}

RequestSpec parse_line(const LineContext& c, std::string_view text, int64_t index) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 8e888
    c.fail("not valid JSON ({})", e.what());
  }
  if (!j.is_object()) c.fail("expected a JSON object, found {}", j.type_name());
  for (const auto& [k, v] : j.items()) {
    (void)v;
    if (std::find(std::begin(kKeys), std::end(kKeys), k) == std::end(kKeys))
      c.fail("unknown key \"{}\" (the keys are: {})", printable(k, 60), known_keys());
  }
  RequestSpec r;
  r.line = c.line;
  r.sampling.temperature = 0;
  r.sampling.seed = static_cast<uint64_t>(index);
  if (!j.contains("prompt")) c.fail("no \"prompt\" (a string)");
  if (!j["prompt"].is_string())
    c.fail("\"prompt\" must be a string, not {}", j["prompt"].type_name());
  r.prompt = j["prompt"].get<std::string>();
  if (j.contains("id")) {
    const json& v = j["id"];
    if (v.is_string())
      r.id = v.get<std::string>();
    else if (v.is_number_integer())
      r.id = v.dump();
    else
      c.fail("\"id\" must be a string or an integer, not {}", v.type_name());
  }
  if (j.contains("max_tokens"))
    r.max_tokens = get_int(c, j["max_tokens"], "max_tokens", 1, 1 << 30);
  if (j.contains("temperature")) {
    const double t = get_real(c, j["temperature"], "temperature");
    if (t < 0) c.fail("\"temperature\" is {}, below 0", t);
    r.sampling.temperature = static_cast<float>(t);
  }
  if (j.contains("top_k"))
    r.sampling.top_k = static_cast<int>(get_int(c, j["top_k"], "top_k", 0, 1 << 30));
  if (j.contains("top_p")) {
    const double p = get_real(c, j["top_p"], "top_p");
    if (p <= 0 || p > 1) c.fail("\"top_p\" is {}, outside (0, 1]", p);
    r.sampling.top_p = static_cast<float>(p);
  }
  if (j.contains("min_p")) {
    const double p = get_real(c, j["min_p"], "min_p");
    if (p < 0 || p > 1) c.fail("\"min_p\" is {}, outside [0, 1]", p);
    r.sampling.min_p = static_cast<float>(p);
  }
  if (j.contains("seed")) {
    const json& v = j["seed"];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      c.fail("\"seed\" must be an integer in [0, 2^64), not {}", v.dump());
    r.sampling.seed = v.get<uint64_t>();
  }
  if (j.contains("ignore_eos")) {
    if (!j["ignore_eos"].is_boolean())
      c.fail("\"ignore_eos\" must be true or false, not {}", j["ignore_eos"].type_name());
    r.ignore_eos = j["ignore_eos"].get<bool>();
  }
  if (j.contains("stop")) {
    const json& v = j["stop"];
    if (!v.is_array()) c.fail("\"stop\" must be an array of strings, not {}", v.type_name());
    for (const json& s : v) {
      if (!s.is_string() || s.get<std::string>().empty())
        c.fail("\"stop\" must hold non-empty strings, found {}", printable(s.dump(), 60));
      r.stop.push_back(s.get<std::string>());
    }
  }
  if (j.contains("grammar") && j.contains("json_schema"))
    c.fail("give \"grammar\" or \"json_schema\", not both");
  if (j.contains("grammar")) {
    if (!j["grammar"].is_string()) c.fail("\"grammar\" must be a string (GBNF)");
    r.grammar = j["grammar"].get<std::string>();
  }
  if (j.contains("json_schema")) {
    // Read again with its keys in order: properties are written as listed.
    try {
      r.grammar = json_schema_to_gbnf(nlohmann::ordered_json::parse(text)["json_schema"]);
    } catch (const Error& e) {
      c.fail("\"json_schema\": {}", e.what());
    }
  }
  if (!r.grammar.empty()) {
    try {
      Grammar::parse(r.grammar);
    } catch (const Error& e) {
      c.fail("\"grammar\": {}", e.what());
    }
  }
  if (j.contains("arrival_ms")) {
    r.arrival_ms = get_real(c, j["arrival_ms"], "arrival_ms");
    if (r.arrival_ms < 0) c.fail("\"arrival_ms\" is {}, below 0", r.arrival_ms);
  }
  return r;
}

// ---- reference64 -------------------------------------------------------------

const char* const kTopics[16] = {
    "the moon",           "a lighthouse keeper", "honey bees",         "the first snow of winter",
    "a lost umbrella",    "volcanoes",           "an old clock",       "a friendly robot",
    "the ocean tides",    "a small bakery",      "paper airplanes",    "the northern lights",
    "a library at night", "desert foxes",        "a rainy train ride", "the game of chess",
};
const char* const kFramings[4] = {
    "Tell me a short story about {}.",
    "Explain {} to a child.",
    "Write three sentences about {}.",
    "Describe {} in a few words.",
};

const char* const kPrefixParagraph =
    "You are a careful and friendly assistant. You answer questions about science, history, "
    "language and everyday life in plain English, with short sentences and concrete examples. "
    "When a question is unclear you say what you assume. When you do not know something you "
    "say so instead of guessing. You never invent sources, names or numbers, and you keep "
    "every answer brief unless you are asked for more detail.";

}  // namespace

std::vector<RequestSpec> parse_jsonl(std::string_view text, const std::string& file_name) {
  std::vector<RequestSpec> out;
  int64_t line = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t nl = text.find('\n', pos);
    std::string_view l =
        text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    ++line;
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    if (l.find_first_not_of(" \t\r\f\v") == std::string_view::npos) continue;
    out.push_back(parse_line(LineContext{file_name, line}, l, line - 1));
  }
  if (out.empty())
    fail("{}: no requests (one JSON object per line, each with a \"prompt\")", file_name);
  return out;
}

const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> names = {"reference64"};
  return names;
}

uint64_t SplitMix64::next() {
  s_ += 0x9e3779b97f4a7c15ull;
  uint64_t z = s_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double SplitMix64::uniform() {
  return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53;
}

double SplitMix64::normal() {
  if (have_spare_) {
    have_spare_ = false;
    return spare_;
  }
  const double u1 = uniform(), u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double a = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(a);
  have_spare_ = true;
  return r * std::cos(a);
}

std::vector<int64_t> reference64_lengths() {
  constexpr size_t n = 64;
  SplitMix64 rng(kReference64Seed);
  std::vector<double> z(n);
  for (double& v : z) v = rng.normal();
  std::vector<size_t> rank(n);  // request indices by ascending z (ties by index)
  std::iota(rank.begin(), rank.end(), size_t{0});
  std::stable_sort(rank.begin(), rank.end(), [&](size_t a, size_t b) { return z[a] < z[b]; });
  const double z_med = (z[rank[n / 2 - 1]] + z[rank[n / 2]]) / 2, z_max = z[rank[n - 1]];
  const double med = static_cast<double>(kReference64Median);
  const double c = std::log(static_cast<double>(kReference64Max) / med) / (z_max - z_med);
  std::vector<int64_t> len(n);
  for (size_t i = 0; i < n; ++i)
    len[i] = std::max<int64_t>(1, std::llround(med * std::exp(c * (z[i] - z_med))));
  len[rank[n - 1]] = kReference64Max;  // exactly, whatever exp rounds to
  // The two median elements must round to the median (true for the seed).
  if (len[rank[n / 2 - 1]] != kReference64Median || len[rank[n / 2]] != kReference64Median)
    fail("reference64: the median elements are {} and {}, not {}", len[rank[n / 2 - 1]],
         len[rank[n / 2]], kReference64Median);
  // +/-1 on the interquartile ranks (not the median two) until the total is
  // exact; an element below the median stays at most the median, one above at
  // least the median and below the maximum, so neither statistic moves.
  int64_t diff = kReference64Total - std::accumulate(len.begin(), len.end(), int64_t{0});
  while (diff != 0) {
    bool moved = false;
    for (size_t r = n / 4; r < 3 * n / 4 && diff != 0; ++r) {
      if (r == n / 2 - 1 || r == n / 2) continue;
      int64_t& v = len[rank[r]];
      const int64_t d = diff > 0 ? 1 : -1, nv = v + d;
      const bool ok = r < n / 2 ? (nv >= 1 && nv <= kReference64Median)
                                : (nv >= kReference64Median && nv < kReference64Max);
      if (!ok) continue;
      v = nv;
      diff -= d;
      moved = true;
    }
    if (!moved) fail("reference64: cannot reach a total of {}", kReference64Total);
  }
  return len;
}

std::vector<RequestSpec> reference64() {
  const std::vector<int64_t> len = reference64_lengths();
  std::vector<RequestSpec> out;
  for (size_t i = 0; i < len.size(); ++i) {
    RequestSpec r;
    r.id = fmt::format("ref-{:02}", i);
    r.prompt = fmt::format(fmt::runtime(kFramings[i / 16]), kTopics[i % 16]);
    r.max_tokens = len[i];
    r.sampling.temperature = 0;
    r.sampling.seed = i;
    r.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<int32_t> shared_prefix_ids(const Tokenizer& tok, int64_t n) {
  if (n <= 0) return {};
  std::string text = kPrefixParagraph;
  size_t last = 0;
  for (;;) {
    std::vector<int32_t> ids = tok.encode(text, false, false);
    if (static_cast<int64_t>(ids.size()) >= n) {
      ids.resize(static_cast<size_t>(n));
      return ids;
    }
    if (ids.size() <= last)
      fail("the tokenizer gives no more than {} ids of the shared prefix text ({} asked)",
           ids.size(), n);
    last = ids.size();
    text += " ";
    text += text;  // doubles: a few encodes reach any n
  }
}

std::vector<int32_t> prompt_ids(const Tokenizer& tok, std::string_view text,
                                std::span<const int32_t> prefix) {
  const bool bos = tok.add_bos_default();
  std::vector<int32_t> ids = tok.encode(text, bos, false);
  if (prefix.empty()) return ids;
  const size_t at = bos && !ids.empty() && ids[0] == tok.bos_id() ? 1 : 0;
  ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(at), prefix.begin(), prefix.end());
  return ids;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double h = std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= v.size()) return v.back();
  return v[lo] + (h - static_cast<double>(lo)) * (v[lo + 1] - v[lo]);
}

LatencySummary summarize_latency(std::span<const double> v) {
  LatencySummary s;
  s.n = static_cast<int64_t>(v.size());
  if (v.empty()) return s;
  std::vector<double> c(v.begin(), v.end());
  s.mean = std::accumulate(c.begin(), c.end(), 0.0) / static_cast<double>(c.size());
  s.median = quantile(c, 0.5);
  s.p90 = quantile(c, 0.9);
  s.p99 = quantile(c, 0.99);
  s.max = *std::max_element(c.begin(), c.end());
  return s;
}

double SimResult::mean_latency_s() const {
  if (latency_s.empty()) return 0;
  return std::accumulate(latency_s.begin(), latency_s.end(), 0.0) /
         static_cast<double>(latency_s.size());
}

SimResult simulate(BatchPolicy policy, std::span<const int64_t> lengths,
                   std::span<const double> arrivals_s, int slots,
                   std::span<const double> cost_ms_per_B) {
  const size_t n = lengths.size();
  if (slots < 1) fail("simulate: {} slots", slots);
  if (cost_ms_per_B.size() < static_cast<size_t>(slots))
    fail("simulate: {} step costs for {} slots", cost_ms_per_B.size(), slots);
  for (double c : cost_ms_per_B)
    if (!std::isfinite(c) || c < 0) fail("simulate: a step cost of {} ms", c);
  if (!arrivals_s.empty() && arrivals_s.size() != n)
    fail("simulate: {} arrivals for {} requests", arrivals_s.size(), n);
  for (double a : arrivals_s)
    if (!std::isfinite(a) || a < 0) fail("simulate: an arrival at {} s", a);
  for (int64_t l : lengths)
    if (l < 1) fail("simulate: a request of length {}", l);
  auto arrival = [&](size_t i) { return arrivals_s.empty() ? 0.0 : arrivals_s[i]; };

  SimResult r;
  r.finish_s.assign(n, 0);
  r.latency_s.assign(n, 0);
  for (int64_t l : lengths) r.tokens += l;
  std::vector<size_t> pending(n);  // not yet admitted, in request order
  std::iota(pending.begin(), pending.end(), size_t{0});
  struct Slot {
    size_t req;
    int64_t left;
  };
  std::vector<Slot> batch;  // sequences holding a slot
  double t = 0;
  size_t done = 0;
  // Admits arrived requests, in order, into free slots.
  auto admit = [&] {
    for (auto it = pending.begin();
         it != pending.end() && batch.size() < static_cast<size_t>(slots);) {
      if (arrival(*it) <= t) {
        batch.push_back({*it, lengths[*it]});
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  };
  auto next_arrival = [&] {
    double a = std::numeric_limits<double>::infinity();
    for (size_t i : pending) a = std::min(a, arrival(i));
    return a;
  };
  while (done < n) {
    const bool can_admit = policy == BatchPolicy::kContinuous || batch.empty();
    if (can_admit) admit();
    if (batch.empty()) {
      t = std::max(t, next_arrival());
      continue;
    }
    const size_t rows = batch.size();
    t += cost_ms_per_B[rows - 1] / 1e3;
    ++r.steps;
    for (Slot& s : batch) {
      if (s.left == 0) {
        ++r.padding_slot_steps;
        continue;
      }
      ++r.busy_slot_steps;
      if (--s.left == 0) {
        r.finish_s[s.req] = t;
        r.latency_s[s.req] = t - arrival(s.req);
        ++done;
      }
    }
    if (policy == BatchPolicy::kContinuous) {
      std::erase_if(batch, [](const Slot& s) { return s.left == 0; });
    } else if (std::all_of(batch.begin(), batch.end(), [](const Slot& s) { return s.left == 0; })) {
      for (const Slot& s : batch) {  // delivered together
        r.finish_s[s.req] = t;
        r.latency_s[s.req] = t - arrival(s.req);
      }
      batch.clear();
    }
  }
  r.total_s = t;
  return r;
}

}  // namespace barata::workload
