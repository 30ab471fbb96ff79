// The emulation's launch check against what ptxas gives each kernel for sm_90
// (kernels/emu/sm90_limits.inc, from scripts/cuda-resources.sh --emu-table):
// every kernel has a row, a launch above its __launch_bounds__ or the
// register file is refused as an H200 refuses it, and every launcher, at the
// largest configuration it can choose, launches what sm_90 accepts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "argmax.cuh"
#include "attention.cuh"
#include "barata/batch.h"
#include "barata/dtype.h"
#include "barata/kv_types.h"
#include "common.cuh"
#include "dequant.cuh"
#include "device_types.cuh"
#include "elementwise.cuh"
#include "embed.cuh"
#include "gemv.cuh"
#include "qdecode.cuh"
#include "qmm.cuh"
#include "rmsnorm.cuh"
#include "rope_kv.cuh"

namespace barata {
namespace {

namespace fs = std::filesystem;
using barata_emu::detail::kernel_limits;
using barata_emu::detail::KernelLimits;

// A kernel of this test only: no row in the table, so only sm_90's own limits apply.
__global__ void limits_test_only_kernel(int* out) {
  if (out) out[threadIdx.x] = 1;
}

const char* const kRegen = "scripts/cuda-resources.sh --emu-table > kernels/emu/sm90_limits.inc";

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The source without comments (a "__global__" in a comment is no kernel).
std::string strip_comments(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "//") == 0) {
      i = s.find('\n', i);
      if (i == std::string::npos) break;
      out += '\n';
    } else if (s.compare(i, 2, "/*") == 0) {
      i = s.find("*/", i + 2);
      if (i == std::string::npos) break;
      ++i;
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

bool ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// The names of the __global__ functions of one source: after "__global__",
// the identifier that a '(' follows, past "void" and a __launch_bounds__(...).
std::vector<std::string> global_functions(const std::string& src) {
  const std::string s = strip_comments(src);
  std::vector<std::string> names;
  const std::string key = "__global__";
  for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + key.size())) {
    if ((at > 0 && ident_char(s[at - 1])) ||
        (at + key.size() < s.size() && ident_char(s[at + key.size()])))
      continue;
    size_t i = at + key.size();
    for (int guard = 0; guard < 16 && i < s.size(); ++guard) {
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      size_t j = i;
      while (j < s.size() && ident_char(s[j])) ++j;
      if (j == i) break;  // not a declaration we understand: the test fails below
      const std::string word = s.substr(i, j - i);
      i = j;
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      if (word == "__launch_bounds__" && i < s.size() && s[i] == '(') {
        int depth = 0;
        do {
          depth += s[i] == '(' ? 1 : s[i] == ')' ? -1 : 0;
          ++i;
        } while (i < s.size() && depth > 0);
        continue;
      }
      if (i < s.size() && s[i] == '(') {
        names.push_back(word);
        break;
      }
    }
  }
  return names;
}

// Each kernels/*.cu (but device.cu, the driver probe, which the emulation
// does not build) with the __global__ functions it defines.
std::map<std::string, std::vector<std::string>> kernels_by_file() {
  std::map<std::string, std::vector<std::string>> out;
  for (const auto& e : fs::directory_iterator(fs::path(BARATA_SOURCE_DIR) / "kernels")) {
    const fs::path& p = e.path();
    if (p.extension() != ".cu" || p.filename() == "device.cu") continue;
    out["kernels/" + p.filename().string()] = global_functions(read_text(p));
  }
  return out;
}

// BARATA_LAUNCH's first argument up to '<' or '(' : the family the check looks up.
std::string family(const std::string& launch_name) {
  size_t b = 0;
  while (b < launch_name.size() && (launch_name[b] == '(' || launch_name[b] == ' ')) ++b;
  const size_t e = launch_name.find_first_of("<( ", b);
  return launch_name.substr(b, e == std::string::npos ? std::string::npos : e - b);
}

TEST(EmuLimits, TheSourceParserFindsKernels) {
  const std::string src =
      "// __global__ void commented_kernel(int*);\n"
      "template <int N>\n__global__ void __launch_bounds__(kWarps * (N + 1))\n"
      "    templ_kernel(float* x) {}\n"
      "__global__ void plain_kernel(int n) {}\n/* __global__ void c2(int); */\n";
  EXPECT_EQ(global_functions(src), (std::vector<std::string>{"templ_kernel", "plain_kernel"}));
  EXPECT_EQ(family("(qmm_kernel<TY, R, T>)"), "qmm_kernel");
  EXPECT_EQ(family("attention_decode_kernel<kMaxHd>"), "attention_decode_kernel");
  EXPECT_EQ(family("argmax_kernel"), "argmax_kernel");
}

// (a) A kernel without a row would be launched unchecked: every __global__
// of kernels/*.cu, and every kernel a BARATA_LAUNCH names, has one.
TEST(EmuLimits, EveryKernelFamilyHasARow) {
  const auto by_file = kernels_by_file();
  ASSERT_GE(by_file.size(), 9u) << "kernels/*.cu not found under " << BARATA_SOURCE_DIR;
  int n = 0;
  for (const auto& [file, names] : by_file)
    for (const std::string& k : names) {
      ++n;
      const KernelLimits lim = kernel_limits(k.c_str());
      EXPECT_GT(lim.registers, 0)
          << k << " (" << file << ") has no row in kernels/emu/sm90_limits.inc, so the emulation "
          << "cannot refuse what sm_90 would; run " << kRegen << " (needs nvcc)";
    }
  EXPECT_GE(n, 20);
  // The spelling the check looks up: BARATA_LAUNCH's, in the kernels and the backend.
  const std::regex launch(R"(BARATA_LAUNCH\(\s*(\(?\s*\w+))");
  std::vector<fs::path> sources;
  for (const char* dir : {"kernels", "src/cuda"})
    for (const auto& e : fs::directory_iterator(fs::path(BARATA_SOURCE_DIR) / dir)) {
      const std::string ext = e.path().extension().string();
      if ((ext == ".cu" || ext == ".cpp") && e.path().filename() != "device.cu")
        sources.push_back(e.path());
    }
  int launches = 0;
  for (const fs::path& p : sources) {
    const std::string s = strip_comments(read_text(p));
    for (std::sregex_iterator it(s.begin(), s.end(), launch), end; it != end; ++it) {
      if ((*it)[1].str() == "kernel") continue;  // the macro's own definition (common.cuh)
      ++launches;
      EXPECT_GT(kernel_limits((*it)[1].str().c_str()).registers, 0)
          << "BARATA_LAUNCH(" << (*it)[1].str() << "...) in " << p.filename().string()
          << " has no row in kernels/emu/sm90_limits.inc; run " << kRegen;
    }
  }
  EXPECT_GE(launches, 20);
}

// No stale rows: each row of the table is a kernel of kernels/*.cu, in order.
TEST(EmuLimits, EveryRowIsAKernel) {
  std::set<std::string> kernels;
  for (const auto& [file, names] : kernels_by_file()) kernels.insert(names.begin(), names.end());
  const std::string inc =
      read_text(fs::path(BARATA_SOURCE_DIR) / "kernels" / "emu" / "sm90_limits.inc");
  const std::regex row(R"re(\{"(\w+)", (\d+), (\d+)\},)re");
  std::vector<std::string> families;
  for (std::sregex_iterator it(inc.begin(), inc.end(), row), end; it != end; ++it) {
    const std::string f = (*it)[1].str();
    families.push_back(f);
    EXPECT_TRUE(kernels.count(f)) << "row " << f << " is no kernel of kernels/*.cu; run " << kRegen;
    const KernelLimits lim = kernel_limits(f.c_str());
    EXPECT_EQ(lim.registers, std::stoi((*it)[2].str())) << f;
    EXPECT_EQ(lim.max_threads, std::stoi((*it)[3].str())) << f;
  }
  EXPECT_EQ(families.size(), kernels.size());
  EXPECT_TRUE(std::is_sorted(families.begin(), families.end()));
}

// Dry launches (checked and logged, no thread run) while in scope.
struct DryLaunches {
  DryLaunches() { barata_emu::set_dry_launches(true); }
  ~DryLaunches() { barata_emu::set_dry_launches(false); }
  DryLaunches(const DryLaunches&) = delete;
  DryLaunches& operator=(const DryLaunches&) = delete;
};

// (b) The check itself, through launch_config_ok as the launches call it,
// with this test's kernel for the dynamic shared memory lookup (none set).
TEST(EmuLimits, AboveLaunchBoundsOrRegisterFileIsRefused) {
  const void* kp = reinterpret_cast<const void*>(&limits_test_only_kernel);
  using barata_emu::detail::launch_config_ok;
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  // qmm's 128 threads: accepted at its bound, refused one warp above.
  const KernelLimits q = kernel_limits("(qmm_kernel<TY, R, T>)");
  ASSERT_GT(q.max_threads, 0);
  EXPECT_TRUE(launch_config_ok("(qmm_kernel<TY, R, T>)", kp, dim3(1), dim3(q.max_threads), 0));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_FALSE(
      launch_config_ok("(qmm_kernel<TY, R, T>)", kp, dim3(1), dim3(q.max_threads + 32), 0));
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // cleared
  // Also when the threads are spread over y and z.
  EXPECT_FALSE(launch_config_ok("qmm_kernel", kp, dim3(1), dim3(32, 2, 4), 0));
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources);

  // Every family: accepted at the most threads it can run, refused one warp
  // above. That is its __launch_bounds__, within which ptxas keeps the
  // registers inside the SM's 65,536 (allocated per warp in units of 256);
  // for a kernel without a bound, the most warps its registers leave room
  // for, above which the register test refuses (the same error).
  for (const auto& [file, names] : kernels_by_file())
    for (const std::string& k : names) {
      SCOPED_TRACE(k + " (" + file + ")");
      const KernelLimits lim = kernel_limits(k.c_str());
      const unsigned per_warp = (static_cast<unsigned>(lim.registers) * 32 + 255) / 256 * 256;
      const unsigned by_regs = std::min(32u, 65536u / std::max(per_warp, 1u)) * 32;
      unsigned most = by_regs;
      if (lim.max_threads > 0) {
        EXPECT_LE(static_cast<unsigned>(lim.max_threads), by_regs)
            << lim.registers << " registers a thread do not fit the kernel's bound";
        most = std::min(most, static_cast<unsigned>(lim.max_threads));
      }
      EXPECT_TRUE(launch_config_ok(k.c_str(), kp, dim3(2), dim3(most), 0));
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
      if (most < 1024) {
        EXPECT_FALSE(launch_config_ok(k.c_str(), kp, dim3(2), dim3(most + 32), 0));
        EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchOutOfResources);
      }
    }
  // A kernel with no row (this one) is held to sm_90's own limits only: 1024
  // threads launch, 1025 do not (an invalid configuration, not resources).
  EXPECT_EQ(kernel_limits("limits_test_only_kernel").registers, 0);
  const DryLaunches dry;
  BARATA_LAUNCH(limits_test_only_kernel, 1, 1024, 0, nullptr, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  BARATA_LAUNCH(limits_test_only_kernel, 1, 1025, 0, nullptr, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
}

// (c) Every launcher at the largest configuration it can choose (its block
// size, shared memory and template variant: widths, head dims, weight
// types), as dry launches: each configuration checked (the table's bounds and
// registers included) and logged, no thread run, so the buffers are dummies
// the launchers never read on the host.
class EmuLimitsLaunchers : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    barata_emu::set_dry_launches(true);
    barata_emu::start_launch_log();
  }
  void TearDown() override {
    barata_emu::stop_launch_log();
    barata_emu::set_dry_launches(false);
    cudaGetLastError();
  }
  // The families launched since the last call.
  std::vector<std::string> take_log() {
    std::vector<std::string> f;
    for (const std::string& n : barata_emu::launch_log()) f.push_back(family(n));
    barata_emu::start_launch_log();  // clears it
    return f;
  }
  static std::vector<std::string> times(const std::string& f, size_t n) {
    return std::vector<std::string>(n, f);
  }

  // 16-byte-aligned dummies (dry launches never touch them).
  alignas(16) float f_[1024] = {};
  alignas(16) signed char q8_[1024] = {};
  alignas(16) uint16_t h_[1024] = {};
  alignas(16) unsigned char w_[1024] = {};
  int32_t i_[1024] = {};
};

#define BARATA_EXPECT_LAUNCHES(call)                     \
  do {                                                   \
    ASSERT_NO_THROW(call);                               \
    ASSERT_EQ(cudaGetLastError(), cudaSuccess) << #call; \
  } while (0)

std::vector<DType> every_qfmt_type() {
  return {
#define BARATA_LIMITS_TYPE(T) DType::T,
      BARATA_QFMT_TYPES(BARATA_LIMITS_TYPE)
#undef BARATA_LIMITS_TYPE
  };
}

TEST_F(EmuLimitsLaunchers, SmallKernels) {
  cudaStream_t s = nullptr;
  const int64_t big = int64_t{1} << 28;  // grid-stride kernels at their largest grid
  BARATA_EXPECT_LAUNCHES(cuda::launch_argmax(f_, 65535, 262144, i_, s));
  // rmsnorm: 256 threads from d = 1024 on; with the 8-bit copy too.
  BARATA_EXPECT_LAUNCHES(cuda::launch_rmsnorm(f_, f_, f_ + 512, 4096, 8192, 1e-5f, i_, s));
  BARATA_EXPECT_LAUNCHES(
      cuda::launch_rmsnorm(f_, f_, f_, 4096, 8192, 1e-5f, nullptr, s, cuda::Q8Out{q8_, f_ + 512}));
  BARATA_EXPECT_LAUNCHES(cuda::launch_add(f_, f_, big, s));
  BARATA_EXPECT_LAUNCHES(cuda::launch_add_bias(f_, f_, 65536, 4096, s));
  for (bool gelu : {false, true}) {
    BARATA_EXPECT_LAUNCHES(cuda::launch_swiglu(f_, f_, big, s, gelu));
    BARATA_EXPECT_LAUNCHES(cuda::launch_swiglu_q8(f_, f_, big, cuda::Q8Out{q8_, f_}, s, gelu));
  }
  BARATA_EXPECT_LAUNCHES(cuda::launch_f32_to_f16(f_, h_, big, s));
  BARATA_EXPECT_LAUNCHES(cuda::launch_quantize_q8(f_, 65535, 8192, q8_, f_, s));
  std::vector<std::string> want = {"argmax_kernel", "rmsnorm_kernel", "rmsnorm_kernel",
                                   "add_kernel", "add_bias_kernel"};
  for (int i = 0; i < 2; ++i) {
    want.push_back("swiglu_kernel");
    want.push_back("swiglu_q8_kernel");
  }
  want.push_back("f32_to_f16_kernel");
  want.push_back("quantize_q8_kernel");
  EXPECT_EQ(take_log(), want);
}

TEST_F(EmuLimitsLaunchers, EmbedEveryType) {
  std::vector<std::string> want;
  for (DType t : every_qfmt_type()) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t d = 8192;  // whole blocks of every type
    ASSERT_TRUE(cuda::embed_supported(t));
    BARATA_EXPECT_LAUNCHES(
        cuda::launch_embed(t, w_, row_bytes(t, d), 1.0f, d, i_, 65535, f_, nullptr));
    want.push_back(cuda::device_reads_type(t) ? "embed_kernel" : "embed_q_kernel");
  }
  EXPECT_EQ(take_log(), want);
}

TEST_F(EmuLimitsLaunchers, DequantToF16EveryType) {
  std::vector<std::string> want;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1}) {
    SCOPED_TRACE(dtype_name(t));
    ASSERT_TRUE(cuda::dequant_f16_supported(t));
    BARATA_EXPECT_LAUNCHES(cuda::cuda_dequantize_to_f16(t, w_, h_, int64_t{1} << 30, nullptr));
    want.push_back(dtype_traits(t).block_size == 1 ? "float_to_f16_kernel"
                                                   : "dequant_to_f16_kernel");
  }
  EXPECT_EQ(take_log(), want);
}

// gemv: 4 warps from 4 segments of k on (the most dynamic shared memory),
// every type it reads, every width 1..8 (a template variant each).
TEST_F(EmuLimitsLaunchers, GemvEveryTypeAndWidth) {
  const int64_t k = 16384, n_rows = 1 << 20;
  size_t n = 0;
  for (DType t : every_qfmt_type()) {
    if (!cuda::gemv_supported(t)) continue;
    for (int64_t tok = 1; tok <= cuda::kGemvMaxTokens; ++tok) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " x " + std::to_string(tok));
      BARATA_EXPECT_LAUNCHES(cuda::launch_gemv(t, w_, row_bytes(t, k), k, n_rows, 1.0f, f_, tok, f_,
                                               n_rows, nullptr, cuda::Epilogue{f_, true}));
      ++n;
    }
  }
  EXPECT_EQ(n, 6u * cuda::kGemvMaxTokens);
  EXPECT_EQ(take_log(), times("gemv_kernel", n));
}

// qmm, its 8-bit form and the row dequantizer: every type, every padded
// width (1, 2, 4, ..., 64: a template variant each, the widest the most registers).
TEST_F(EmuLimitsLaunchers, QmmEveryTypeAndWidth) {
  const int64_t k = 16384, n_rows = 1 << 20;
  size_t n = 0, n_q8 = 0;
  for (DType t : every_qfmt_type()) {
    ASSERT_TRUE(cuda::qmm_supported(t));
    for (int64_t tok = 1; tok <= cuda::kQmmMaxTokens; tok *= 2) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " x " + std::to_string(tok));
      BARATA_EXPECT_LAUNCHES(cuda::launch_qmm(t, w_, row_bytes(t, k), k, n_rows, 1.0f, f_, tok, f_,
                                              n_rows, nullptr, cuda::Epilogue{f_, true}));
      ++n;
    }
  }
  EXPECT_EQ(take_log(), times("qmm_kernel", n));
  for (DType t : every_qfmt_type()) {
    if (!cuda::qmm_q8_supported(t)) continue;
    for (int64_t tok = 1; tok <= cuda::kQmmMaxTokens; tok *= 2) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " x " + std::to_string(tok) + ", 8-bit");
      BARATA_EXPECT_LAUNCHES(cuda::launch_qmm_q8(t, w_, row_bytes(t, k), k, n_rows, 1.0f, q8_, f_,
                                                 tok, f_, n_rows, nullptr,
                                                 cuda::Epilogue{f_, true}));
      ++n_q8;
    }
  }
  EXPECT_GE(n_q8, 7u * 10);
  EXPECT_EQ(take_log(), times("qmm_q8_kernel", n_q8));
  size_t n_dq = 0;
  for (DType t : every_qfmt_type()) {
    SCOPED_TRACE(dtype_name(t));
    BARATA_EXPECT_LAUNCHES(
        cuda::launch_dequant_rows_f16(t, w_, row_bytes(t, k), k, 65535, h_, nullptr));
    ++n_dq;
  }
  EXPECT_EQ(take_log(), times("dequant_rows_kernel", n_dq));
}

// Attention: each head-dim class at its largest head_dim, a GQA group of 8
// and more (8 warps: the most threads), decode split (so the merge kernel
// runs, with head_dim threads); rope_kv with every K transform on.
TEST_F(EmuLimitsLaunchers, AttentionAndRopeEveryHeadDim) {
  std::vector<std::string> want;
  for (int hd : {64, 128, 256}) {
    for (KvType kt : {KvType::kF16, KvType::kQ8_0}) {
      SCOPED_TRACE("head_dim " + std::to_string(hd) + ", K " + kv_type_name(kt));
      cuda::AttnArgs a;
      a.n_head = 64;
      a.n_head_kv = 4;  // a group of 16
      a.head_dim = hd;
      a.scale = 0.125f;
      a.window = 4096;
      cuda::KvDeviceView kv;
      kv.pool = w_;
      kv.kv_dim = a.n_head_kv * hd;
      kv.block_tokens = 256;
      kv.k_type = kt;
      kv.v_type = kt;
      kv.k_row = static_cast<int32_t>(kv_row_bytes(kt, kv.kv_dim));
      kv.v_row = static_cast<int32_t>(kv_row_bytes(kt, kv.kv_dim));
      kv.layer = 3;
      kv.block_bytes = int64_t{kv.layer + 1} * kv.block_tokens * (kv.k_row + kv.v_row);
      kv.block_tables = i_;
      const cuda::PrefillTile tiles[1] = {{0, cuda::kPrefillTileRows}};
      BARATA_EXPECT_LAUNCHES(
          cuda::launch_attention_prefill(f_, f_, nullptr, tiles, 65535, a, kv, nullptr));
      const cuda::DecodeSplit split{16, 512};
      const int64_t n_rows = 2;
      std::vector<float> ws(cuda::attention_decode_workspace(n_rows, a, split));
      BARATA_EXPECT_LAUNCHES(
          cuda::launch_attention_decode(f_, f_, nullptr, n_rows, a, kv, split, ws.data(), nullptr));
      want.insert(want.end(), {"attention_prefill_kernel", "attention_decode_kernel",
                               "attention_merge_kernel"});

      cuda::RopeArgs r;
      r.n_head = a.n_head;
      r.n_head_kv = a.n_head_kv;
      r.head_dim = hd;
      r.rope_dims = hd;
      r.neox = true;
      r.cos = f_;
      r.sin = f_;
      kv.rotate_k = kt != KvType::kF16;
      kv.k_offset = f_;
      kv.k_scale = f_;
      BARATA_EXPECT_LAUNCHES(cuda::launch_rope_kv(f_, f_, f_, nullptr, 65535, r, kv, nullptr));
      want.push_back("rope_kv_kernel");
    }
  }
  EXPECT_EQ(take_log(), want);
}

}  // namespace
}  // namespace barata
