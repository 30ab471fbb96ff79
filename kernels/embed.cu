#include "embed.cuh"

#include <string>

#include "common.cuh"
#include "device_types.cuh"
#include "elem_decode.cuh"
#include "qdecode.cuh"

namespace barata::cuda {
namespace {

constexpr int kThreads = 256;

// One CTA per row of x (blockIdx.x), threads over its d elements: consecutive
// threads read consecutive elements of the table row, so a warp's loads fall
// in one or two blocks of the packed row, and its stores are one coalesced
// run. Rows are short (d of a few thousand) and read once: nothing to stage.
template <DType T>
__global__ void __launch_bounds__(kThreads)
    embed_kernel(const unsigned char* __restrict__ table, size_t row_bytes, float scale, int64_t d,
                 const int32_t* __restrict__ tokens, float* __restrict__ x) {
  const int64_t r = blockIdx.x;
  const unsigned char* row = table + static_cast<size_t>(__ldg(tokens + r)) * row_bytes;
  float* out = x + r * d;
  for (int64_t j = threadIdx.x; j < d; j += kThreads)
    out[j] = __fmul_rn(decode_element<T>(row, j), scale);
}

// The other types: a thread per 4 consecutive elements, decoded by qdecode.cuh
// (code books in shared memory).
template <DType T>
__global__ void __launch_bounds__(kThreads)
    embed_q_kernel(const unsigned char* __restrict__ table, size_t row_bytes, float scale,
                   int64_t d, const int32_t* __restrict__ tokens, float* __restrict__ x) {
  using F = qdec::QFmt<T>;
  __shared__ float lut[16];
  if constexpr (F::kLut) {
    if (threadIdx.x < 16) lut[threadIdx.x] = F::lut_entry(static_cast<int>(threadIdx.x));
    __syncthreads();
  }
  const int64_t r = blockIdx.x;
  const unsigned char* row = table + static_cast<size_t>(__ldg(tokens + r)) * row_bytes;
  float* out = x + r * d;
  for (int64_t e = 4 * static_cast<int64_t>(threadIdx.x); e < d; e += 4 * kThreads) {
    float v[4];
    F::decode4(row, d, e, lut, v);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (e + j < d) out[e + j] = __fmul_rn(v[j], scale);
  }
}

template <DType T>
void launch_q(const void* table, size_t row_bytes, float scale, int64_t d, const int32_t* tokens,
              int64_t n_rows, float* x, cudaStream_t stream) {
  BARATA_LAUNCH(embed_q_kernel<T>, static_cast<unsigned>(n_rows), kThreads, 0, stream,
                static_cast<const unsigned char*>(table), row_bytes, scale, d, tokens, x);
  BARATA_CUDA_CHECK_LAUNCH();
}

template <DType T>
void launch(const void* table, size_t row_bytes, float scale, int64_t d, const int32_t* tokens,
            int64_t n_rows, float* x, cudaStream_t stream) {
  BARATA_LAUNCH(embed_kernel<T>, static_cast<unsigned>(n_rows), kThreads, 0, stream,
                static_cast<const unsigned char*>(table), row_bytes, scale, d, tokens, x);
  BARATA_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool embed_supported(DType type) {
  switch (type) {
#define BARATA_EMBED_CASE(T) case DType::T:
    BARATA_QFMT_TYPES(BARATA_EMBED_CASE)
#undef BARATA_EMBED_CASE
    return true;
  }
  return false;
}

void launch_embed(DType type, const void* table, size_t row_bytes, float scale, int64_t d,
                  const int32_t* tokens, int64_t n_rows, float* x, cudaStream_t stream) {
  const DTypeTraits& tr = dtype_traits(type);
  if (!embed_supported(type))
    throw Error(std::string("cuda embed: no kernel for ") + tr.name + " tables");
  if (d <= 0 || d % tr.block_size != 0)
    throw Error("cuda embed: row length " + std::to_string(d) + " is not a whole number of " +
                tr.name + " blocks");
  if (barata::row_bytes(type, d) > row_bytes)
    throw Error("cuda embed: " + std::to_string(row_bytes) + " bytes per row cannot hold " +
                std::to_string(d) + " " + tr.name + " values");
  if (n_rows < 0 || n_rows > 0x7fffffff)
    throw Error("cuda embed: bad row count " + std::to_string(n_rows));
  if (n_rows == 0) return;
  if (!device_reads_type(type)) {
    switch (type) {
#define BARATA_EMBED_CASE(T) \
  case DType::T:             \
    return launch_q<DType::T>(table, row_bytes, scale, d, tokens, n_rows, x, stream);
      BARATA_QFMT_TYPES(BARATA_EMBED_CASE)
#undef BARATA_EMBED_CASE
    }
  }
  switch (type) {
    case DType::F32:
      return launch<DType::F32>(table, row_bytes, scale, d, tokens, n_rows, x, stream);
    case DType::F16:
      return launch<DType::F16>(table, row_bytes, scale, d, tokens, n_rows, x, stream);
    case DType::BF16:
      return launch<DType::BF16>(table, row_bytes, scale, d, tokens, n_rows, x, stream);
    case DType::Q8_0:
      return launch<DType::Q8_0>(table, row_bytes, scale, d, tokens, n_rows, x, stream);
    case DType::Q4_0:
      return launch<DType::Q4_0>(table, row_bytes, scale, d, tokens, n_rows, x, stream);
    default:
      return launch<DType::Q4_1>(table, row_bytes, scale, d, tokens, n_rows, x, stream);
  }
}

}  // namespace barata::cuda
