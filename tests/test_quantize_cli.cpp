// `barata quantize`: every scheme on a synthetic llama model written here
// (d_ff 172, so the block types must fall back, and say so), the --report dry
// run, options, bad input, and a process killed mid-write leaving nothing.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <cmath>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "barata/engine.h"
#include "barata/gguf.h"
#include "barata/model.h"
#include "barata/quantize.h"
#include "test_util.h"

namespace barata {
namespace {

constexpr int64_t kD = 256, kFF = 172, kVocab = 96, kLayers = 2, kHeads = 4, kKvHeads = 2;

// A small llama with F32 weights: N(0, 0.05) plus a few large outliers, as
// real checkpoints have.
void write_model(const std::filesystem::path& path) {
  GgufWriter w;
  w.set("general.architecture", "llama");
  w.set("llama.block_count", uint32_t{kLayers});
  w.set("llama.context_length", uint32_t{64});
  w.set("llama.embedding_length", uint32_t{kD});
  w.set("llama.feed_forward_length", uint32_t{kFF});
  w.set("llama.attention.head_count", uint32_t{kHeads});
  w.set("llama.attention.head_count_kv", uint32_t{kKvHeads});
  w.set("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 0.05f);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones = false) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = ones ? 1.0f + 0.1f * g(rng) : g(rng);
    if (!ones)
      for (int i = 0; i < 3; ++i) v[rng() % v.size()] = (i % 2 ? -1.0f : 1.0f) * 0.9f;
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add_tensor(name, DType::F32, std::move(shape), std::move(bytes));
  };
  add("token_embd.weight", {kD, kVocab});
  add("output_norm.weight", {kD}, true);
  add("output.weight", {kD, kVocab});
  const int64_t hd = kD / kHeads;
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {kD}, true);
    add(p + "attn_q.weight", {kD, kD});
    add(p + "attn_k.weight", {kD, hd * kKvHeads});
    add(p + "attn_v.weight", {kD, hd * kKvHeads});
    add(p + "attn_output.weight", {kD, kD});
    add(p + "ffn_norm.weight", {kD}, true);
    add(p + "ffn_gate.weight", {kD, kFF});
    add(p + "ffn_up.weight", {kD, kFF});
    add(p + "ffn_down.weight", {kFF, kD});
  }
  w.write(path);
}

std::vector<float> logits_of(const std::filesystem::path& path) {
  const Model m = Model::load(path);
  Engine e(m, {.n_threads = 2, .n_ctx = 32});
  const std::vector<int32_t> toks = {1, 5, 17, 42, 8, 77, 3};
  std::vector<float> lg(toks.size() * static_cast<size_t>(kVocab));
  e.prefill(e.new_sequence(), toks, lg.data(), true);
  return lg;
}

// max |a - b| / max |a|
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - b[i]));
    m = std::max(m, std::fabs(double(a[i])));
  }
  return d / m;
}

std::string q(const std::filesystem::path& p) {
  return "'" + p.string() + "'";
}

class QuantizeCli : public ::testing::Test {
 protected:
  void SetUp() override { write_model(in_); }
  test::TempDir dir_;
  std::filesystem::path in_ = dir_ / "in.gguf";
};

TEST_F(QuantizeCli, EverySchemeWritesAModelThatRuns) {
  const std::vector<float> ref = logits_of(in_);
  struct Case {
    const char* type;
    DType dtype;
    bool ffn_down_falls_back;  // rows of 172
    double max_logit_diff;     // relative to max |logit| (~2x what this model gives)
  };
  const Case cases[] = {
      {"int8-tensor", DType::I8_TENSOR, false, 0.35},
      {"int8-row", DType::I8_ROW, false, 0.05},
      {"int4-tensor", DType::I4_TENSOR, false, 3.0},
      {"int4-row", DType::I4_ROW, false, 1.2},
      {"int4-g128", DType::I4_G128, true, 1.2},
      {"nf4", DType::NF4_B64, true, 0.8},
      {"q8_0", DType::Q8_0, true, 0.08},
      {"q4_0", DType::Q4_0, true, 0.8},
      {"f16", DType::F16, false, 0.002},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.type);
    const auto out = dir_ / (std::string(c.type) + ".gguf");
    const auto r =
        test::run_cli("quantize " + q(in_) + " " + q(out) + " --type " + c.type + " -t 2 --json");
    ASSERT_EQ(r.status, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["matrices"].size(), 2u + 7 * kLayers);
    bool listed = false;
    for (const auto& f : j["fallbacks"]) listed |= f["name"] == "blk.0.ffn_down.weight";
    EXPECT_EQ(listed, c.ffn_down_falls_back);
    EXPECT_EQ(j["fallbacks"].size(), c.ffn_down_falls_back ? size_t{kLayers} : 0u);

    const GgufFile f = GgufFile::open(out);
    EXPECT_EQ(f.file_size(), j["file_bytes"].get<uint64_t>());
    for (const auto& t : f.tensors()) {
      if (t.shape.size() == 1) {
        EXPECT_EQ(t.type, DType::F32) << t.name;
      } else if (t.name.find("ffn_down") == std::string::npos || !c.ffn_down_falls_back) {
        EXPECT_EQ(t.type, c.dtype) << t.name;
      } else {
        EXPECT_NE(t.type, c.dtype) << t.name;
      }
    }
    EXPECT_EQ(f.get<std::string>("barata.quant.scheme"), c.type);
    EXPECT_EQ(f.has("barata.quant.private_types"), dtype_traits(c.dtype).is_private);
    if (c.ffn_down_falls_back) EXPECT_TRUE(f.has("barata.quant.fallbacks"));

    const std::vector<float> got = logits_of(out);
    for (float x : got) ASSERT_TRUE(std::isfinite(x));
    const double diff = max_rel_diff(ref, got);
    EXPECT_LT(diff, c.max_logit_diff);
    std::printf("%-12s logits max rel. diff %.4f, mean rel. error %.4f\n", c.type, diff,
                j["mean_rel_error"].get<double>());
  }
}

TEST_F(QuantizeCli, ReportComparesAllSchemesAndWritesNothing) {
  const auto r = test::run_cli("quantize " + q(in_) + " --report --json -t 2");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["schemes"].size(), report_schemes().size());
  std::map<std::string, double> mean;
  for (const auto& s : j["schemes"]) {
    mean[s["scheme"]] = s["mean_rel_error"];
    EXPECT_EQ(s["matrices"].size(), 2u + 7 * kLayers);
    for (const auto& m : s["matrices"]) {
      EXPECT_GT(m["max_over_std"].get<double>(), 5.0);  // the planted outliers
      EXPECT_GE(m["beyond_6sigma"].get<int64_t>(), 1);
    }
    EXPECT_GT(s["file_bytes"].get<uint64_t>(), 0u);
  }
  EXPECT_LT(mean["int8-row"], mean["int8-tensor"]);
  EXPECT_LT(mean["int4-row"], mean["int4-tensor"]);
  EXPECT_LT(mean["int4-g128"], mean["int4-row"]);
  EXPECT_LT(mean["nf4"], mean["int4-row"]);
  EXPECT_LT(mean["q8_0"], mean["q4_0"]);
  // Nothing but the input in the folder.
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_.path())) ++n;
  EXPECT_EQ(n, 1);
  // The table form names every scheme.
  const auto t = test::run_cli("quantize " + q(in_) + " --report -t 1");
  ASSERT_EQ(t.status, 0) << t.err;
  for (const auto& s : report_schemes()) EXPECT_NE(t.out.find(s.name), std::string::npos);
}

TEST_F(QuantizeCli, OverridesAndEmbeddingTypes) {
  const auto out = dir_ / "mixed.gguf";
  const auto r = test::run_cli("quantize " + q(in_) + " " + q(out) +
                               " --type nf4 --embed-type q8_0 --output-type f16 "
                               "--override 'blk.1.*=int8-row' --override 'blk.*.attn_v.*=q4_0'");
  ASSERT_EQ(r.status, 0) << r.err;
  const GgufFile f = GgufFile::open(out);
  EXPECT_EQ(f.find_tensor("token_embd.weight")->type, DType::Q8_0);
  EXPECT_EQ(f.find_tensor("output.weight")->type, DType::F16);
  EXPECT_EQ(f.find_tensor("blk.1.attn_v.weight")->type, DType::I8_ROW);  // first match wins
  EXPECT_EQ(f.find_tensor("blk.1.attn_norm.weight")->type, DType::I8_ROW);
  EXPECT_EQ(f.find_tensor("blk.0.attn_v.weight")->type, DType::Q4_0);
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type, DType::NF4_B64);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_down.weight")->type, DType::I4_ROW);  // 172: fallback
  EXPECT_NE(r.out.find("blk.0.ffn_down.weight: row length 172"), std::string::npos) << r.out;
  for (float x : logits_of(out)) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(QuantizeCli, BadInputGetsOneClearLine) {
  auto one_line = [](const test::CliResult& r) {
    return r.err.find('\n') == r.err.size() - 1 && r.err.rfind("error: ", 0) == 0;
  };
  auto r = test::run_cli("quantize " + q(in_) + " " + q(dir_ / "o.gguf") + " --type int3");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(one_line(r)) << r.err;
  EXPECT_NE(r.err.find("unknown quantization type 'int3'"), std::string::npos) << r.err;
  for (const char* t : {"int8-tensor", "int4-g128", "nf4", "q8_0", "q4_0"})
    EXPECT_NE(r.err.find(t), std::string::npos) << r.err;

  r = test::run_cli("quantize " + q(in_) + " " + q(dir_ / "o.gguf") + " --type nf4 --override x");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("PATTERN=TYPE"), std::string::npos) << r.err;

  r = test::run_cli("quantize " + q(dir_ / "missing.gguf") + " " + q(dir_ / "o.gguf") +
                    " --type nf4");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("missing.gguf"), std::string::npos) << r.err;

  const auto before = test::read_bytes(in_);
  for (const std::string& same : {in_.string(), (dir_.path() / "." / "in.gguf").string()}) {
    r = test::run_cli("quantize " + q(in_) + " " + q(same) + " --type q8_0");
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.err.find("refusing to overwrite the input"), std::string::npos) << r.err;
    EXPECT_TRUE(one_line(r)) << r.err;
  }
  EXPECT_EQ(test::read_bytes(in_), before);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "o.gguf"));
}

// True once `pid` holds a file open inside `dir` (the output being written).
bool writing_into(pid_t pid, const std::filesystem::path& dir) {
  std::error_code ec;
  const std::filesystem::path fds = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(fds, ec)) {
    const auto target = std::filesystem::read_symlink(e.path(), ec);
    if (!ec && target.string().rfind(dir.string(), 0) == 0) return true;
  }
  return false;
}

// SIGKILL while the output file is being written (seen in /proc/PID/fd), at
// several points of the write: no output and no temporary file may remain.
TEST(QuantizeKill, NoPartialOutputAfterKillMidWrite) {
  const auto model = test::source_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(model))
    GTEST_SKIP() << model << " is absent: run scripts/fetch-model.sh";
  int killed_mid_write = 0;
  for (int delay_ms : {0, 20, 60}) {
    test::TempDir dir;
    const auto out = dir / "out.gguf";
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
      ::execl(BARATA_CLI_PATH, BARATA_CLI_PATH, "quantize", model.c_str(), out.c_str(), "--type",
              "q8_0", "-t", "2", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    bool seen = false;
    for (int i = 0; i < 60000 && !seen; ++i) {
      seen = writing_into(pid, dir.path());
      if (!seen) {
        int st = 0;
        if (::waitpid(pid, &st, WNOHANG) == pid) break;  // finished before we saw it
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (seen) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    std::vector<std::string> left;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      left.push_back(e.path().filename().string());
    if (seen && WIFSIGNALED(status)) {
      ++killed_mid_write;
      EXPECT_TRUE(left.empty()) << "killed " << delay_ms << " ms into the write, left: " << left[0];
    } else if (!left.empty()) {  // finished before the kill: the file must be whole
      ASSERT_EQ(left.size(), 1u) << left[0];
      EXPECT_NO_THROW(GgufFile::open(out));
    }
  }
  EXPECT_GE(killed_mid_write, 1) << "never caught the process writing";
}

}  // namespace
}  // namespace barata
