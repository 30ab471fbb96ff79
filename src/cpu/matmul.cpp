// Registry of CPU matmul kernels and the drivers that run them over threads.
#include "cpu/matmul.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <string_view>

#include "barata/error.h"
#include "dot.h"
#include "isa.h"
#include "thread_pool.h"

namespace barata {
namespace {

// Generic path: dequantize the weight row once (reference, exact), then one
// fp32 dot per token. Correct for every type; the fast kernels beat it.
void dot_tile_dequant(DequantizeRowFn deq, const uint8_t* w, size_t row_bytes, int64_t n_rows,
                      int64_t k, const uint8_t* acts, size_t act_stride, int64_t n_tokens,
                      float* out, size_t ldy) {
  const auto dot_f32 = cpu_vector_ops(cpu_isa()).dot_f32;
  thread_local std::vector<float> row;
  if (static_cast<int64_t>(row.size()) < k) row.resize(static_cast<size_t>(k));
  for (int64_t r = 0; r < n_rows; ++r) {
    deq(w + r * row_bytes, row.data(), k);
    for (int64_t t = 0; t < n_tokens; ++t)
      out[t * ldy + r] =
          dot_f32(row.data(), reinterpret_cast<const float*>(acts + t * act_stride), k);
  }
}

template <DType T>
void dot_tile_generic(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                      const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                      size_t ldy) {
  dot_tile_dequant(dtype_traits(T).dequantize_row, w, row_bytes, n_rows, k, acts, act_stride,
                   n_tokens, out, ldy);
}

#define BARATA_GENERIC(T, name)                                 \
  MatmulKernel {                                                \
    DType::T, name, ActFormat::kF32, dot_tile_generic<DType::T> \
  }

const std::array kReference = {
    BARATA_GENERIC(F32, "f32.dequant.f32"),
    BARATA_GENERIC(F16, "f16.dequant.f32"),
    BARATA_GENERIC(BF16, "bf16.dequant.f32"),
    BARATA_GENERIC(Q4_0, "q4_0.dequant.f32"),
    BARATA_GENERIC(Q4_1, "q4_1.dequant.f32"),
    BARATA_GENERIC(Q5_0, "q5_0.dequant.f32"),
    BARATA_GENERIC(Q5_1, "q5_1.dequant.f32"),
    BARATA_GENERIC(Q8_0, "q8_0.dequant.f32"),
    BARATA_GENERIC(Q4_K, "q4_k.dequant.f32"),
    BARATA_GENERIC(Q5_K, "q5_k.dequant.f32"),
    BARATA_GENERIC(Q6_K, "q6_k.dequant.f32"),
    BARATA_GENERIC(IQ4_NL, "iq4_nl.dequant.f32"),
    BARATA_GENERIC(I8_TENSOR, "i8_tensor.dequant.f32"),
    BARATA_GENERIC(I8_ROW, "i8_row.dequant.f32"),
    BARATA_GENERIC(I4_TENSOR, "i4_tensor.dequant.f32"),
    BARATA_GENERIC(I4_ROW, "i4_row.dequant.f32"),
    BARATA_GENERIC(I4_G128, "i4_g128.dequant.f32"),
    BARATA_GENERIC(NF4_B64, "nf4_b64.dequant.f32"),
};

}  // namespace

const MatmulKernel& cpu_reference_kernel(DType t) {
  for (const auto& k : kReference)
    if (k.type == t) return k;
  fail("no CPU matmul kernel for type {}", dtype_name(t));
}

bool cpu_repack_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("BARATA_REPACK");
    return e == nullptr || std::string_view(e) != "0";
  }();
  return on;
}

const MatmulKernel& cpu_matmul_kernel(DType t, int64_t k, CpuIsa isa, bool allow_repack) {
  if (!cpu_isa_available(isa)) fail("internal: CPU kernels of {} asked for", cpu_isa_name(isa));
  // This ISA's kernel, else the next lower ISA's, else the reference.
  for (int i = static_cast<int>(isa); i >= 0; --i) {
    const CpuKernelSet& set = cpu_kernel_set(static_cast<CpuIsa>(i));
    for (size_t j = 0; j < set.n_matmul; ++j)
      if (set.matmul[j].type == t && set.matmul[j].takes(k) &&
          (allow_repack || set.matmul[j].repack == nullptr))
        return set.matmul[j];
  }
  return cpu_reference_kernel(t);
}

const MatmulKernel& cpu_matmul_kernel(DType t, int64_t k) {
  return cpu_matmul_kernel(t, k, cpu_isa());
}

WeightView make_weight_view(DType type, int64_t k, int64_t n_rows, const uint8_t* tensor_data) {
  return WeightView{type,
                    k,
                    n_rows,
                    tensor_rows(type, tensor_data),
                    row_bytes(type, k),
                    &cpu_matmul_kernel(type, k),
                    tensor_scale(type, tensor_data)};
}

void RepackArena::Free::operator()(uint8_t* p) const {
  std::free(p);
}

size_t RepackArena::reserve(size_t bytes) {
  const size_t at = size_;
  size_ += (bytes + 63) / 64 * 64;
  return at;
}

void RepackArena::allocate() {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t alloc = std::max<size_t>(kHuge, (size_ + kHuge - 1) / kHuge * kHuge);
  base_.reset(static_cast<uint8_t*>(std::aligned_alloc(kHuge, alloc)));
  if (!base_) fail("cannot allocate {} bytes for the repacked weights", alloc);
#if defined(MADV_HUGEPAGE)
  madvise(base_.get(), alloc, MADV_HUGEPAGE);
#endif
}

size_t repacked_bytes(const WeightView& v) {
  return repacked_bytes(*v.kernel, v.k, v.n_rows);
}

void repack_weight(ThreadPool& pool, WeightView& v, uint8_t* dst) {
  const MatmulKernel& kern = *v.kernel;
  if (kern.repack == nullptr) fail("internal: kernel {} does not repack", kern.name);
  const size_t rb = kern.repacked_row_bytes(v.k);
  const int64_t groups = (v.n_rows + kRepackRows - 1) / kRepackRows;
  pool.parallel_for(groups, [&](int64_t g0, int64_t g1, int) {
    const int64_t r0 = g0 * kRepackRows, r1 = std::min(v.n_rows, g1 * kRepackRows);
    kern.repack(v.data + r0 * v.row_bytes, v.row_bytes, v.k, r1 - r0, dst + r0 * rb);
  });
  v.data = dst;
  v.row_bytes = rb;
}

void quantize_row_q8_act(const float* x, BlockQ8Act* out, int64_t k) {
  for (int64_t b = 0; b < k / 32; ++b, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      // fmin/fmax: a NaN or Inf activation (a broken file's weights) gives +-127, not UB.
      const int q =
          static_cast<int>(std::nearbyint(std::fmax(-127.0f, std::fmin(127.0f, x[j] * id))));
      out[b].q[j] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
    out[b].sum = sum;
  }
}

void prepare_acts(ThreadPool& pool, ActFormat format, const float* x, int64_t n_tokens, int64_t k,
                  PreparedActs& out) {
  out.format = format;
  out.k = k;
  out.n_tokens = n_tokens;
  if (format == ActFormat::kF32) {
    out.stride = static_cast<size_t>(k) * sizeof(float);
    out.data = reinterpret_cast<const uint8_t*>(x);
    return;
  }
  if (k % 32 != 0) fail("internal: Q8 activations need a row length multiple of 32, got {}", k);
  out.stride = static_cast<size_t>(k / 32) * sizeof(BlockQ8Act);
  out.bytes.resize(out.stride * static_cast<size_t>(n_tokens));
  uint8_t* base = out.bytes.data();
  const size_t stride = out.stride;
  auto quantize = quantize_row_q8_act;  // the ISA's copy where it has one: the same bits
  for (int i = static_cast<int>(cpu_isa()); i >= 0; --i)
    if (auto* f = cpu_kernel_set(static_cast<CpuIsa>(i)).quantize_row_q8) {
      quantize = f;
      break;
    }
  pool.parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t)
      quantize(x + t * k, reinterpret_cast<BlockQ8Act*>(base + t * stride), k);
  });
  out.data = out.bytes.data();
}

void matmul(ThreadPool& pool, const WeightView& w, const PreparedActs& acts, float* y,
            int64_t ldy) {
  if (acts.k != w.k || acts.format != w.kernel->act)
    fail("internal: matmul of {} x {} weight with {}-wide activations", w.n_rows, w.k, acts.k);
  // Tokens in tiles so that a tile's activations stay in L2 while every row
  // of the chunk streams past them once.
  constexpr int64_t kTokenTile = 32;
  // Rows in tiles of kRowTile so the weight tile stays in L1 across the tokens.
  constexpr int64_t kRowTile = 16;
  const DotTileFn dot = w.kernel->dot_tile;
  const int64_t n_tokens = acts.n_tokens;
  pool.parallel_for(
      w.n_rows,
      [&](int64_t r0, int64_t r1, int) {
        for (int64_t rt = r0; rt < r1; rt += kRowTile) {
          const int64_t nr = std::min(kRowTile, r1 - rt);
          for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
            const int64_t nt = std::min(kTokenTile, n_tokens - t0);
            dot(w.data + rt * w.row_bytes, w.row_bytes, nr, w.k, acts.data + t0 * acts.stride,
                acts.stride, nt, y + t0 * ldy + rt, static_cast<size_t>(ldy));
            if (w.scale != 1.0f)
              for (int64_t t = t0; t < t0 + nt; ++t)
                for (int64_t r = rt; r < rt + nr; ++r) y[t * ldy + r] *= w.scale;
          }
        }
      },
      16);
}

}  // namespace barata
