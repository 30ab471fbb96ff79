// CPU matrix multiplication against a weight of any DType, dequantizing on the
// fly. One kernel per weight type, chosen when the model loads (the registry
// below); the hot loop never switches on the type.
//
// Every output element is computed by the same per-(row, token) code whatever
// the batch width, so prefill, decode and the no-cache mode agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "barata/dtype.h"

namespace barata {

class ThreadPool;

// How a kernel wants its activations: plain fp32, or 8-bit blocks of 32 with
// an fp32 scale (what llama.cpp does for quantized weights: the integer dot
// product is where the speed is).
enum class ActFormat { kF32, kQ8 };

struct BlockQ8Act {
  float d;  // scale: x ~= d * q
  float s;  // d * sum(q), for the weight types with a per-block min (Q4_1, the K-quants)
  int8_t q[32];
  int32_t sum;  // sum(q), exact: the constant-offset types' integer correction
};
static_assert(sizeof(BlockQ8Act) == 44);

// A tile of the product: out[t * ldy + r] = dot(weight row r, act row t) for
// r in [0, n_rows) (rows row_bytes apart from w) and t in [0, n_tokens).
// Each output's arithmetic is the same whatever the tile's size, so the
// result never depends on batch width or threading.
using DotTileFn = void (*)(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t k,
                           const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* out,
                           size_t ldy);

struct MatmulKernel {
  DType type;
  const char* name;  // e.g. "q4_1.q8.avx2", "q6_k.dequant.f32"
  ActFormat act;
  DotTileFn dot_tile;
  int64_t k_multiple = 0;  // rows must be a multiple of this long (0: 32 for kQ8, any for kF32)
  // Load-time repacking (null: the kernel reads the file's rows as they are).
  // The CPU backend copies the matrix into repacked_bytes(k, n_rows) bytes with
  // repack(); the kernel then gets tiles whose first row is a multiple of
  // kRepackRows, at w + first_row * repacked_row_bytes(k).
  size_t (*repacked_row_bytes)(int64_t k) = nullptr;
  void (*repack)(const uint8_t* src, size_t src_row_bytes, int64_t k, int64_t n_rows,
                 uint8_t* dst) = nullptr;
  bool takes(int64_t k) const {
    const int64_t m = k_multiple != 0 ? k_multiple : act == ActFormat::kQ8 ? 32 : 1;
    return k % m == 0;
  }
};

// Rows per interleaved group of the repacked layouts (the matmul driver's row
// tiles are multiples of it; matrices are padded to whole groups).
inline constexpr int64_t kRepackRows = 16;
inline size_t repacked_bytes(const MatmulKernel& kern, int64_t k, int64_t n_rows) {
  const int64_t groups = (n_rows + kRepackRows - 1) / kRepackRows;
  return static_cast<size_t>(groups * kRepackRows) * kern.repacked_row_bytes(k);
}

// The kernel bound to weights of type t with rows of k on this CPU (the
// 8-bit-activation kernels need k to be a multiple of 32; other rows get the
// reference kernel).
const MatmulKernel& cpu_matmul_kernel(DType t, int64_t k);
// The same for a given instruction set (which must be available: isa.h).
enum class CpuIsa;
// With allow_repack, a kernel that wants its matrix repacked may be chosen
// (the caller then repacks: see MatmulKernel::repack); without, only kernels
// that read the file's layout.
const MatmulKernel& cpu_matmul_kernel(DType t, int64_t k, CpuIsa isa, bool allow_repack = false);
// BARATA_REPACK=0 turns load-time repacking off (for comparisons; default on).
bool cpu_repack_enabled();
// The generic kernel (dequantize a row, fp32 dot) for any type: the reference
// that the fast kernels are tested against.
const MatmulKernel& cpu_reference_kernel(DType t);

// A weight matrix: n_rows rows of k elements, ggml layout (rows contiguous).
struct WeightView {
  DType type;
  int64_t k;       // row length (input features)
  int64_t n_rows;  // output features
  const uint8_t* data;
  size_t row_bytes;
  const MatmulKernel* kernel;
  float scale = 1.0f;  // the matrix's one scale (per-tensor types), applied after the dot
};

// The view of a GGUF tensor's data (data points at the tensor, header included):
// rows, row stride, scale and the kernel for this CPU.
WeightView make_weight_view(DType type, int64_t k, int64_t n_rows, const uint8_t* tensor_data);

// Repacked copies of a model's matrices, all in one 2 MiB-aligned allocation
// offered as huge pages (a decode step streams every byte once, and 4 KiB pages
// make that a TLB miss per 4 KiB); each matrix starts on a 64-byte boundary.
// One arena, not one allocation per matrix: with huge pages, each small matrix
// would otherwise take a whole 2 MiB page.
class RepackArena {
 public:
  // Reserves room for a matrix of `bytes`; returns its offset.
  size_t reserve(size_t bytes);
  void allocate();  // after every reserve
  uint8_t* at(size_t offset) { return base_.get() + offset; }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> base_;
  size_t size_ = 0;
};
// Whether view's kernel (chosen with allow_repack) wants its matrix repacked,
// and how many bytes the copy takes.
inline bool wants_repack(const WeightView& v) {
  return v.kernel->repack != nullptr;
}
size_t repacked_bytes(const WeightView& v);
// Repacks view's matrix into dst (repacked_bytes(view), 64-byte aligned), on
// the pool, and points the view at the copy.
void repack_weight(ThreadPool& pool, WeightView& view, uint8_t* dst);

// Activations converted once for a kernel's ActFormat, reused by every weight
// that reads the same input (q, k and v; gate and up).
struct PreparedActs {
  ActFormat format = ActFormat::kF32;
  int64_t k = 0;
  int64_t n_tokens = 0;
  size_t stride = 0;  // bytes per token row
  std::vector<uint8_t> bytes;
  const uint8_t* data = nullptr;  // bytes.data() or the fp32 input itself
  int64_t from = -1;              // the backend's reuse key (the step's op that wrote the input)
};

void prepare_acts(ThreadPool& pool, ActFormat format, const float* x, int64_t n_tokens, int64_t k,
                  PreparedActs& out);

// y[t][r] = sum_j W[r][j] * x[t][j]; y has row stride ldy floats.
void matmul(ThreadPool& pool, const WeightView& w, const PreparedActs& acts, float* y, int64_t ldy);

// Quantizes one row of k (multiple of 32) floats to Q8 activation blocks.
void quantize_row_q8_act(const float* x, BlockQ8Act* out, int64_t k);

}  // namespace barata
