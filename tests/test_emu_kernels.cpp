// The forward pass's small kernels (rmsnorm, element-wise, embed, argmax,
// rope_kv) under the CUDA emulation, each against a plain CPU reference, on
// small random shapes, odd ones included. Exact where the arithmetic is the
// reference's; otherwise the bound named at the check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "argmax.cuh"
#include "barata/batch.h"
#include "barata/dtype.h"
#include "barata/error.h"
#include "barata/half.h"
#include "barata/kv_types.h"
#include "elem_decode.cuh"
#include "elementwise.cuh"
#include "embed.cuh"
#include "rmsnorm.cuh"
#include "rope_kv.cuh"

namespace barata {
namespace {

std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- rmsnorm -------------------------------------------------------------------

void ref_rmsnorm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

TEST(EmuKernels, RmsNormMatchesReference) {
  std::mt19937 rng(1);
  for (int64_t d : {1, 5, 31, 32, 64, 100, 257, 576, 1000, 4099})
    for (int64_t n_rows : {1, 3}) {
      for (int mode = 0; mode < 3; ++mode) {  // 0 plain, 1 row index, 2 in place
        SCOPED_TRACE("d " + std::to_string(d) + ", rows " + std::to_string(n_rows) + ", mode " +
                     std::to_string(mode));
        const int64_t n_src = n_rows + 2;
        std::vector<float> x = random_floats(static_cast<size_t>(n_src * d), rng);
        const std::vector<float> w = random_floats(static_cast<size_t>(d), rng, 0.5f, 1.5f);
        std::vector<int32_t> idx(static_cast<size_t>(n_rows));
        for (int64_t i = 0; i < n_rows; ++i) idx[i] = static_cast<int32_t>((i * 2 + 1) % n_src);
        std::vector<float> want(static_cast<size_t>(n_rows * d));
        for (int64_t i = 0; i < n_rows; ++i)
          ref_rmsnorm(x.data() + (mode == 1 ? idx[i] : i) * d, w.data(), want.data() + i * d, d,
                      1e-5f);
        std::vector<float> y(want.size(), -7.0f);
        if (mode == 2) {
          cuda::launch_rmsnorm(x.data(), w.data(), x.data(), n_rows, d, 1e-5f, nullptr, nullptr);
          y.assign(x.begin(), x.begin() + n_rows * d);
        } else {
          cuda::launch_rmsnorm(x.data(), w.data(), y.data(), n_rows, d, 1e-5f,
                               mode == 1 ? idx.data() : nullptr, nullptr);
        }
        // fp32 sum of squares on the device, double on the CPU: relative 1e-5.
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(y[i], want[i], 1e-5 * std::fabs(want[i]) + 1e-30) << "at " << i;
      }
    }
}

TEST(EmuKernels, RmsNormRejectsBadArguments) {
  float x[4] = {};
  int32_t idx[1] = {0};
  EXPECT_THROW(cuda::launch_rmsnorm(x, x, x, 1, 0, 1e-5f, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::launch_rmsnorm(x, x, x, -1, 4, 1e-5f, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::launch_rmsnorm(x, x, x, 1, 4, 1e-5f, idx, nullptr), Error);
  EXPECT_NO_THROW(cuda::launch_rmsnorm(x, x, x, 0, 4, 1e-5f, nullptr, nullptr));
}

// ---- element-wise --------------------------------------------------------------

TEST(EmuKernels, ElementwiseMatchReference) {
  std::mt19937 rng(2);
  for (int64_t n : {1, 3, 4, 7, 255, 256, 1025, 10001})
    for (int64_t off : {0, 1}) {  // off 1: pointers not 16-byte aligned (scalar path)
      SCOPED_TRACE("n " + std::to_string(n) + ", offset " + std::to_string(off));
      const size_t m = static_cast<size_t>(n + off);
      std::vector<float> x = random_floats(m, rng), y = random_floats(m, rng, -8.0f, 8.0f);

      std::vector<float> a = x;
      cuda::launch_add(a.data() + off, y.data() + off, n, nullptr);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bits(a[off + i]), bits(x[off + i] + y[off + i]));
      if (off) {
        ASSERT_EQ(bits(a[0]), bits(x[0])) << "wrote before the start";
      }

      std::vector<float> g = y;
      cuda::launch_swiglu(g.data() + off, x.data() + off, n, nullptr);
      for (int64_t i = 0; i < n; ++i) {
        const float gv = y[off + i];
        const float want = gv / (1.0f + std::exp(-gv)) * x[off + i];
        // exact here; a GPU's expf is within 2 ulp: relative 1e-6 is the contract
        ASSERT_NEAR(g[off + i], want, 1e-6 * std::fabs(want) + 1e-30) << i;
      }

      std::vector<uint16_t> h(m, 0xdead);
      cuda::launch_f32_to_f16(y.data() + off, h.data() + off, n, nullptr);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[off + i], fp32_to_fp16(y[off + i])) << i;
      if (off) {
        ASSERT_EQ(h[0], 0xdead);
      }
    }
  // fp16 rounding corner cases: ties, subnormals, overflow, infinities
  const std::vector<float> special = {0.0f,        -0.0f,        1.0f + 1.0f / 2048,
                                      65504.0f,    65520.0f,     -65536.0f,
                                      6.0e-8f,     2.98e-8f,     1e-10f,
                                      1.0f / 0.0f, -1.0f / 0.0f, 3.0f * 0.00048828125f};
  std::vector<uint16_t> h(special.size());
  cuda::launch_f32_to_f16(special.data(), h.data(), static_cast<int64_t>(special.size()), nullptr);
  for (size_t i = 0; i < special.size(); ++i) EXPECT_EQ(h[i], fp32_to_fp16(special[i])) << i;
}

TEST(EmuKernels, AddBiasMatchesReference) {
  std::mt19937 rng(3);
  for (int64_t width : {1, 5, 64, 100, 897})
    for (int64_t n_rows : {1, 2, 7}) {
      std::vector<float> y = random_floats(static_cast<size_t>(n_rows * width), rng);
      const std::vector<float> b = random_floats(static_cast<size_t>(width), rng);
      std::vector<float> want = y;
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t c = 0; c < width; ++c) want[r * width + c] += b[c];
      cuda::launch_add_bias(y.data(), b.data(), n_rows, width, nullptr);
      for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bits(y[i]), bits(want[i])) << i;
    }
  float z[1];
  EXPECT_THROW(cuda::launch_add_bias(z, z, 1, 0, nullptr), Error);
  EXPECT_THROW(cuda::launch_add(z, z, -1, nullptr), Error);
  EXPECT_THROW(cuda::launch_swiglu(z, z, -1, nullptr), Error);
  EXPECT_THROW(cuda::launch_f32_to_f16(z, nullptr, -1, nullptr), Error);
}

// ---- embed -----------------------------------------------------------------------

const DType kEmbedTypes[] = {DType::F32,  DType::F16,  DType::BF16,
                             DType::Q8_0, DType::Q4_0, DType::Q4_1};

// A table of n_vocab rows quantized from random floats, each row padded to
// row_bytes (a gap between rows that the kernel must skip).
std::vector<uint8_t> make_table(DType t, int64_t d, int64_t n_vocab, size_t pad, size_t* rb,
                                std::mt19937& rng) {
  const std::vector<float> w = random_floats(static_cast<size_t>(d * n_vocab), rng, -3.0f, 3.0f);
  const size_t packed = row_bytes(t, d);
  *rb = packed + pad;
  std::vector<uint8_t> dense(tensor_bytes(t, d, n_vocab));
  quantize_tensor(t, w.data(), d, n_vocab, dense.data());
  std::vector<uint8_t> table(*rb * static_cast<size_t>(n_vocab), 0xee);
  for (int64_t r = 0; r < n_vocab; ++r)
    std::memcpy(table.data() + r * *rb, dense.data() + r * packed, packed);
  return table;
}

TEST(EmuKernels, EmbedMatchesReference) {
  std::mt19937 rng(4);
  for (DType t : kEmbedTypes) {
    ASSERT_TRUE(cuda::embed_supported(t));
    const int64_t bs = dtype_traits(t).block_size;
    for (int64_t d : {32, 96, 288, 33, 1})
      for (size_t pad : {0, 6}) {
        if (d % bs) continue;
        SCOPED_TRACE(std::string(dtype_name(t)) + ", d " + std::to_string(d) + ", pad " +
                     std::to_string(pad));
        const int64_t n_vocab = 11;
        size_t rb = 0;
        const std::vector<uint8_t> table = make_table(t, d, n_vocab, pad, &rb, rng);
        std::vector<uint8_t> dense(tensor_bytes(t, d, n_vocab));
        for (int64_t r = 0; r < n_vocab; ++r)
          std::memcpy(dense.data() + r * row_bytes(t, d), table.data() + r * rb, row_bytes(t, d));
        const std::vector<int32_t> tokens = {3, 0, 10, 3, 7};
        for (float scale : {1.0f, 0.37f}) {
          std::vector<float> x(tokens.size() * d, -1.0f);
          cuda::launch_embed(t, table.data(), rb, scale, d, tokens.data(),
                             static_cast<int64_t>(tokens.size()), x.data(), nullptr);
          std::vector<float> want(static_cast<size_t>(d));
          for (size_t i = 0; i < tokens.size(); ++i) {
            dequantize_tensor_row(t, dense.data(), d, tokens[i], want.data());
            for (int64_t j = 0; j < d; ++j) {
              if (scale != 1.0f) want[j] *= scale;  // what Model::embed does
              ASSERT_EQ(bits(x[i * d + j]), bits(want[j])) << "row " << i << " element " << j;
            }
          }
        }
      }
  }
  float x[32];
  int32_t tok = 0;
  uint8_t table[64] = {};
  // Every stored type has an embedding kernel now; a value outside the enum has none.
  const DType not_a_type = static_cast<DType>(999);
  EXPECT_FALSE(cuda::embed_supported(not_a_type));
  EXPECT_THROW(cuda::launch_embed(not_a_type, table, 64, 1, 256, &tok, 1, x, nullptr), Error);
  EXPECT_THROW(cuda::launch_embed(DType::Q8_0, table, 64, 1, 33, &tok, 1, x, nullptr), Error);
  EXPECT_THROW(cuda::launch_embed(DType::F32, table, 64, 1, 32, &tok, 1, x, nullptr), Error);
}

// The decoders the embedding kernel runs, called on the host directly.
TEST(EmuKernels, ElementDecodersMatchReferenceOnTheHost) {
  std::mt19937 rng(5);
  for (DType t : kEmbedTypes) {
    const int64_t d = 128, n_vocab = 3;
    size_t rb = 0;
    const std::vector<uint8_t> table = make_table(t, d, n_vocab, 0, &rb, rng);
    std::vector<float> want(static_cast<size_t>(d));
    for (int64_t r = 0; r < n_vocab; ++r) {
      dequantize_tensor_row(t, table.data(), d, r, want.data());
      const unsigned char* row = table.data() + r * rb;
      for (int64_t j = 0; j < d; ++j) {
        float got = 0;
        switch (t) {
          case DType::F32:
            got = cuda::decode_element<DType::F32>(row, j);
            break;
          case DType::F16:
            got = cuda::decode_element<DType::F16>(row, j);
            break;
          case DType::BF16:
            got = cuda::decode_element<DType::BF16>(row, j);
            break;
          case DType::Q8_0:
            got = cuda::decode_element<DType::Q8_0>(row, j);
            break;
          case DType::Q4_0:
            got = cuda::decode_element<DType::Q4_0>(row, j);
            break;
          default:
            got = cuda::decode_element<DType::Q4_1>(row, j);
        }
        ASSERT_EQ(bits(got), bits(want[j])) << dtype_name(t) << " row " << r << " element " << j;
      }
    }
  }
}

// ---- argmax ------------------------------------------------------------------------

int32_t ref_argmax(const float* x, int64_t n) {
  int32_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = static_cast<int32_t>(i);
  }
  return best < 0 ? 0 : best;
}

TEST(EmuKernels, ArgmaxMatchesReference) {
  std::mt19937 rng(6);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n_vocab : {1, 2, 31, 513, 5000, 49153}) {
    const int64_t n_rows = 6;
    std::vector<float> logits(static_cast<size_t>(n_rows * n_vocab));
    for (int64_t r = 0; r < n_rows; ++r) {
      float* row = logits.data() + r * n_vocab;
      for (int64_t j = 0; j < n_vocab; ++j) {
        switch (r) {
          case 0:  // continuous values
            row[j] = std::uniform_real_distribution<float>(-30, 30)(rng);
            break;
          case 1:  // few distinct values: many ties, the lowest index must win
            row[j] = static_cast<float>(rng() % 4);
            break;
          case 2:  // NaNs sprinkled, one NaN at the front
            row[j] = (j == 0 || rng() % 5 == 0) ? nan : static_cast<float>(rng() % 100);
            break;
          case 3:
            row[j] = -inf;
            break;
          case 4:
            row[j] = nan;
            break;
          default:  // the maximum at the very end
            row[j] = j == n_vocab - 1 ? 1e30f : -1e30f;
        }
      }
    }
    std::vector<int32_t> out(static_cast<size_t>(n_rows), -5);
    cuda::launch_argmax(logits.data(), n_rows, n_vocab, out.data(), nullptr);
    for (int64_t r = 0; r < n_rows; ++r)
      EXPECT_EQ(out[r], ref_argmax(logits.data() + r * n_vocab, n_vocab))
          << "vocab " << n_vocab << " row " << r;
    // rows 0, 1, 3, 5 against std::max_element, the documented behaviour
    for (int64_t r : {0, 1, 3, 5}) {
      const float* row = logits.data() + r * n_vocab;
      EXPECT_EQ(out[r], std::max_element(row, row + n_vocab) - row);
    }
  }
  int32_t o;
  float l[1] = {};
  EXPECT_THROW(cuda::launch_argmax(l, 1, 0, &o, nullptr), Error);
}

// ---- rope + KV store ---------------------------------------------------------------

struct RopeCase {
  int n_head, n_head_kv, head_dim, rope_dims;
  bool neox;
};

TEST(EmuKernels, RopeKvMatchesReference) {
  std::mt19937 rng(7);
  const RopeCase cases[] = {
      {4, 1, 64, 64, false}, {8, 8, 128, 128, true},   {6, 2, 64, 32, true}, {6, 3, 128, 96, false},
      {3, 3, 64, 64, true},  {16, 8, 128, 128, false}, {2, 2, 64, 2, false}};
  // The cache types: rows in fp16, or quantized (and K rotated) by the same
  // codec as the CPU's (kv_types.h), byte for byte.
  const KvType types[][2] = {{KvType::kF16, KvType::kF16},   {KvType::kQ8_0, KvType::kQ4_0},
                             {KvType::kQ4_0H, KvType::kFp8}, {KvType::kQ8_0H, KvType::kQ8_0},
                             {KvType::kQ4_0O, KvType::kF16}, {KvType::kIq4NlS, KvType::kIq4Nl},
                             {KvType::kQ4_0S, KvType::kQ8_0}};
  int n_case = 0;
  for (const auto& ty : types)
    for (const RopeCase& c : cases) {
      if (ty[0] != KvType::kF16 && (n_case++ % 2 == 1 || c.head_dim % 32 != 0)) continue;
      const KvType kt = ty[0], vt = ty[1];
      SCOPED_TRACE("heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " x " +
                   std::to_string(c.head_dim) + ", rope " + std::to_string(c.rope_dims) +
                   (c.neox ? " neox" : " normal") + ", K " + kv_type_name(kt) + " V " +
                   kv_type_name(vt));
      constexpr int kBlock = 16, kLayers = 3, kLayer = 1, kPoolBlocks = 9;
      const int kv_dim = c.n_head_kv * c.head_dim, q_dim = c.n_head * c.head_dim;
      // Two sequences with non-identity tables; rows cross 16-token block edges.
      const std::vector<int32_t> tables = {5, 2, 7, 1, 6, 8, 0};
      struct R {
        int pos, table;
      };
      const std::vector<R> rs = {{14, 0}, {15, 0}, {16, 0}, {17, 0}, {33, 0}, {0, 3},
                                 {1, 3},  {31, 3}, {32, 3}, {47, 3}, {63, 3}};
      std::vector<BatchRowMeta> rows;
      for (const R& r : rs) {
        BatchRowMeta m;
        m.pos = r.pos;
        m.table = r.table;
        m.slot = tables[r.table + r.pos / kBlock] * kBlock + r.pos % kBlock;
        m.seq = r.table == 0 ? 0 : 1;
        rows.push_back(m);
      }
      const int n_rows = static_cast<int>(rows.size());
      const int half = c.rope_dims / 2, n_pos = 64;
      std::vector<float> cs(static_cast<size_t>(n_pos * half)), sn(cs.size());
      for (int p = 0; p < n_pos; ++p)
        for (int i = 0; i < half; ++i) {
          const double th = p * std::pow(10000.0, -2.0 * i / c.rope_dims);
          cs[p * half + i] = static_cast<float>(std::cos(th));
          sn[p * half + i] = static_cast<float>(std::sin(th));
        }
      std::vector<float> q = random_floats(static_cast<size_t>(n_rows * q_dim), rng);
      std::vector<float> k = random_floats(static_cast<size_t>(n_rows * kv_dim), rng);
      const std::vector<float> v = random_floats(k.size(), rng);
      const int64_t k_row = kv_row_bytes(kt, kv_dim), v_row = kv_row_bytes(vt, kv_dim);
      const int64_t block_bytes = int64_t{kLayers} * kBlock * (k_row + v_row);
      std::vector<uint8_t> pool(static_cast<size_t>(kPoolBlocks * block_bytes), 0xab);

      // The keys' offset of the outlier-aware types (any constant will do here).
      const std::vector<float> koff = random_floats(static_cast<size_t>(kv_dim), rng);
      // The scaled types' per-channel scales (kv_calibrate.h): positive, not powers of two.
      std::vector<float> kscale(static_cast<size_t>(kv_dim));
      std::uniform_real_distribution<float> ud(-3.0f, 3.0f);
      for (float& x : kscale) x = std::exp2(ud(rng));
      // the reference: the CPU backend's rope, offset, rotation, and row codec into the slots
      std::vector<float> wq = q, wk = k;
      std::vector<uint8_t> wpool = pool;
      auto rope = [&](float* x, int pos) {
        for (int i = 0; i < half; ++i) {
          const int a = c.neox ? i : 2 * i, b = c.neox ? i + half : 2 * i + 1;
          const float x0 = x[a], x1 = x[b];
          x[a] = x0 * cs[pos * half + i] - x1 * sn[pos * half + i];
          x[b] = x0 * sn[pos * half + i] + x1 * cs[pos * half + i];
        }
      };
      for (int t = 0; t < n_rows; ++t) {
        for (int h = 0; h < c.n_head; ++h)
          rope(wq.data() + t * q_dim + h * c.head_dim, rows[t].pos);
        for (int h = 0; h < c.n_head_kv; ++h)
          rope(wk.data() + t * kv_dim + h * c.head_dim, rows[t].pos);
        if (kv_type_info(kt).offset)
          for (int i = 0; i < kv_dim; ++i) wk[t * kv_dim + i] -= koff[i];
        if (kv_type_info(kt).scaled) {
          for (int i = 0; i < kv_dim; ++i) wk[t * kv_dim + i] /= kscale[i];
          const int group = c.n_head / c.n_head_kv;
          for (int h = 0; h < c.n_head; ++h)
            for (int i = 0; i < c.head_dim; ++i)
              wq[t * q_dim + h * c.head_dim + i] *= kscale[(h / group) * c.head_dim + i];
        }
        if (kv_type_info(kt).rotated) {
          for (int h = 0; h < c.n_head; ++h) {
            float* x = wq.data() + t * q_dim + h * c.head_dim;
            hadamard_transform(x, c.head_dim);
            for (int i = 0; i < c.head_dim; ++i) x[i] *= 1.0f / static_cast<float>(c.head_dim);
          }
          for (int h = 0; h < c.n_head_kv; ++h)
            hadamard_transform(wk.data() + t * kv_dim + h * c.head_dim, c.head_dim);
        }
        const int64_t b = rows[t].slot / kBlock, tt = rows[t].slot % kBlock;
        uint8_t* kc =
            wpool.data() + b * block_bytes + kLayer * kBlock * (k_row + v_row) + tt * k_row;
        uint8_t* vc = wpool.data() + b * block_bytes + kLayer * kBlock * (k_row + v_row) +
                      kBlock * k_row + tt * v_row;
        kv_quantize_row(kt, wk.data() + t * kv_dim, kc, kv_dim);
        kv_quantize_row(vt, v.data() + t * kv_dim, vc, kv_dim);
      }

      cuda::RopeArgs a;
      a.n_head = c.n_head;
      a.n_head_kv = c.n_head_kv;
      a.head_dim = c.head_dim;
      a.rope_dims = c.rope_dims;
      a.neox = c.neox;
      a.cos = cs.data();
      a.sin = sn.data();
      cuda::KvDeviceView kv;
      kv.pool = pool.data();
      kv.block_bytes = block_bytes;
      kv.layer = kLayer;
      kv.kv_dim = kv_dim;
      kv.block_tokens = kBlock;
      kv.k_row = static_cast<int32_t>(k_row);
      kv.v_row = static_cast<int32_t>(v_row);
      kv.k_type = kv_storage_type(kt);
      kv.v_type = kv_storage_type(vt);
      kv.rotate_k = kv_type_info(kt).rotated;
      kv.k_offset = kv_type_info(kt).offset ? koff.data() : nullptr;
      kv.k_scale = kv_type_info(kt).scaled ? kscale.data() : nullptr;
      kv.block_tables = tables.data();
      cuda::launch_rope_kv(q.data(), k.data(), v.data(), rows.data(), n_rows, a, kv, nullptr);

      for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(bits(q[i]), bits(wq[i])) << "q " << i;
      for (size_t i = 0; i < k.size(); ++i) ASSERT_EQ(bits(k[i]), bits(wk[i])) << "k " << i;
      for (size_t i = 0; i < pool.size(); ++i) ASSERT_EQ(pool[i], wpool[i]) << "pool " << i;
      // the slots the kernel wrote are where kv_slot() finds them
      for (int t = 0; t < n_rows; ++t)
        ASSERT_EQ(cuda::kv_slot(kv, rows[t].table, rows[t].pos), rows[t].slot);
    }
}

TEST(EmuKernels, RopeKvRejectsBadArguments) {
  cuda::RopeArgs a;
  a.n_head = 2;
  a.n_head_kv = 1;
  a.head_dim = 64;
  a.rope_dims = 63;
  cuda::KvDeviceView kv;
  kv.kv_dim = 64;
  kv.k_row = kv.v_row = 128;
  kv.block_bytes = 2 * 16 * 128;
  float f[1];
  BatchRowMeta m;
  EXPECT_THROW(cuda::launch_rope_kv(f, f, f, &m, 1, a, kv, nullptr), Error);
  a.rope_dims = 64;
  kv.kv_dim = 128;
  EXPECT_THROW(cuda::launch_rope_kv(f, f, f, &m, 1, a, kv, nullptr), Error);
  kv.kv_dim = 64;
  EXPECT_THROW(cuda::launch_rope_kv(f, f, f, &m, 1, a, kv, nullptr), Error);  // no tables
}

}  // namespace
}  // namespace barata
