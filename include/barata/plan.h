// Capacity planning behind `barata plan`: how many tokens of fp16 KV cache,
// for how many users, fit on a card beside the weights. The sum is
//   weights + KV bytes per token x resident tokens + reserve <= memory,
// so the resident tokens are floor((memory - weights - reserve) / KV bytes per
// token), and 0 when the weights and the reserve alone do not fit.
// docs/plan.md gives the assumptions and the reference numbers.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "barata/gguf.h"
#include "barata/kv_types.h"

namespace barata::plan {

inline constexpr int64_t kGiB = int64_t{1} << 30;
inline constexpr int64_t kDefaultReserveBytes = kGiB * 3 / 2;  // 1.5 GiB
// Users the tables show the context of.
inline constexpr int64_t kUserCounts[] = {1, 4, 16, 64};

// How the weights are stored: fp16 (16 bits), int8 (8) or int4 (4.125: 4-bit
// values in groups of 128 with one fp16 scale per group).
enum class WeightFormat { kFp16, kInt8, kInt4 };
std::optional<WeightFormat> parse_weight_format(std::string_view name);  // "fp16", "int8", "int4"
const char* weight_format_name(WeightFormat f);
double bits_per_weight(WeightFormat f);
// Bytes of n_params weights in format f, rounded up to a whole byte.
int64_t weight_bytes(int64_t n_params, WeightFormat f);

// What the plan needs of a model.
struct ModelShape {
  std::string name;          // "7b" or the file's path
  bool from_file = false;    // read from a GGUF file rather than a preset
  int64_t n_params = 0;      // weights (a file: the tensors' element counts)
  int64_t weight_bytes = 0;  // what the weights take in memory
  // A mixture of experts (a file with expert_count > 0): memory holds every
  // expert, a decode token reads n_expert_used of each layer's n_expert.
  int64_t n_expert = 0, n_expert_used = 0;
  int64_t active_params = 0;           // = n_params when dense
  int64_t active_weight_bytes = 0;     // what one decode token reads (= weight_bytes when dense)
  std::optional<WeightFormat> format;  // unset: a file's own bytes, as stored
  int64_t n_layer = 0, n_head_kv = 0, head_dim = 0;
  // Sliding-window layers whose KV blocks behind the window are freed
  // (Gemma 3's local layers; 0 with --swa-full or without such layers).
  int64_t n_swa_layers = 0, n_swa = 0;

  // The cache's element types (--cache-type-k/-v; kv_types.h).
  KvType k_type = KvType::kF16, v_type = KvType::kF16;

  // K and V of one layer and position in the cache types (fp16: 2 x
  // n_head_kv x head_dim x 2 bytes).
  int64_t kv_pair_bytes() const {
    return kv_row_bytes(k_type, n_head_kv * head_dim) + kv_row_bytes(v_type, n_head_kv * head_dim);
  }
  int64_t kv_bytes_per_token() const { return n_layer * kv_pair_bytes(); }
  // What one sequence of len tokens holds (kv_cache.h, kv_sequence_bytes):
  // len x kv_bytes_per_token() in whole blocks, less the sliding layers'
  // blocks behind their window.
  int64_t kv_bytes_for(int64_t len) const;
  bool sliding() const { return n_swa_layers > 0 && n_swa > 0; }
};

// "7b" (7.0e9 params, 32 layers, 8 KV heads of 128), "13b" (13.0e9, 40
// layers, 40 KV heads of 128: full multi-head) and "70b" (70.0e9, 80 layers,
// 8 KV heads of 128), stored as `format`. An unknown name is an Error naming
// the known ones.
ModelShape preset(std::string_view name, WeightFormat format);
const std::vector<std::string>& preset_names();
// The shape from the file's metadata (llama/qwen2, as ModelConfig reads it).
// Without a format the weights take the file's exact tensor bytes; with one,
// the file's element count at that format's bits per weight.
ModelShape from_gguf(const GgufFile& f, std::optional<WeightFormat> format, bool swa_full = false,
                     KvType k = KvType::kF16, KvType v = KvType::kF16);

// A memory size in GiB: "16", "16G", "16GiB", "1.5g"; positive and finite
// (zero too when allow_zero), at most 2^20 GiB, the whole string. An Error
// naming `what` and the value otherwise. The result is in bytes.
int64_t parse_gib(std::string_view text, std::string_view what, bool allow_zero = false);

// floor((memory - weights - reserve) / kv_bytes_per_token), 0 when the
// weights and the reserve do not leave a byte (or kv_bytes_per_token <= 0).
int64_t max_resident_tokens(int64_t memory_bytes, int64_t weight_bytes, int64_t reserve_bytes,
                            int64_t kv_bytes_per_token);

struct MemoryPlan {
  int64_t memory_bytes = 0;
  bool fits = false;       // weights + reserve <= memory
  int64_t free_bytes = 0;  // memory - weights - reserve (negative when it does not fit)
  // Total resident tokens over all users; with sliding layers, one user's
  // longest context (users x context varies with the count).
  int64_t max_tokens = 0;
  std::vector<std::pair<int64_t, int64_t>> users;  // (users, context per user), kUserCounts
};
MemoryPlan plan_memory(const ModelShape& m, int64_t memory_bytes, int64_t reserve_bytes);

// One line on what a KV pool of pool_tokens holds, each sequence at most
// n_ctx: "KV pool: 4096 tokens (96.0 MiB, fp16): 1 user x 4096 context, or 4
// x 1024, 16 x 256". Each user count of kUserCounts gets min(n_ctx, pool /
// users) tokens; the counts past 1 are shown while that is at least
// min(n_ctx, 256) (a user with a handful of tokens is no use).
// `types` names the cache's element types (kv_cache_label).
std::string describe_kv_pool(int64_t pool_tokens, int64_t n_ctx, int64_t bytes_per_token,
                             std::string_view types = "fp16");
// The same for a pool of pool_bytes whose sequences of len tokens hold
// seq_bytes(len) bytes (sliding-window layers: less than len x per token).
std::string describe_kv_pool_bytes(int64_t pool_bytes, int64_t n_ctx,
                                   const std::function<int64_t(int64_t)>& seq_bytes,
                                   std::string_view types = "fp16");
// The longest context, at most cap, of which `users` sequences fit in
// free_bytes: the largest len with users x m.kv_bytes_for(len) <= free_bytes.
int64_t context_per_user(const ModelShape& m, int64_t free_bytes, int64_t users, int64_t cap);

// 65378 -> "65,378".
std::string group_thousands(int64_t n);

}  // namespace barata::plan
