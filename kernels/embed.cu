#include "embed.cuh"

#include <string>

#include "common.cuh"
#include "device_types.cuh"
#include "elem_decode.cuh"

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

template <DType T>
void launch(const void* table, size_t row_bytes, float scale, int64_t d, const int32_t* tokens,
            int64_t n_rows, float* x, cudaStream_t stream) {
  BARATA_LAUNCH(embed_kernel<T>, static_cast<unsigned>(n_rows), kThreads, 0, stream,
                static_cast<const unsigned char*>(table), row_bytes, scale, d, tokens, x);
  BARATA_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool embed_supported(DType type) {
  return device_reads_type(type);
}

void launch_embed(DType type, const void* table, size_t row_bytes, float scale, int64_t d,
                  const int32_t* tokens, int64_t n_rows, float* x, cudaStream_t stream) {
  const DTypeTraits& tr = dtype_traits(type);
  if (!embed_supported(type))
    throw Error(std::string("cuda embed: no kernel for ") + tr.name + " tables");
  if (d <= 0 || d % tr.block_size != 0)
    throw Error("cuda embed: row length " + std::to_string(d) + " is not a whole number of " +
                tr.name + " blocks");
  if (static_cast<size_t>(d / tr.block_size) * tr.bytes_per_block > row_bytes)
    throw Error("cuda embed: " + std::to_string(row_bytes) + " bytes per row cannot hold " +
                std::to_string(d) + " " + tr.name + " values");
  if (n_rows < 0 || n_rows > 0x7fffffff)
    throw Error("cuda embed: bad row count " + std::to_string(n_rows));
  if (n_rows == 0) return;
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
