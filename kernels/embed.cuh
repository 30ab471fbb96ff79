// Embedding lookup on the device, from the table in its stored type.
#pragma once

#include <cstdint>

#include "barata/dtype.h"
#include "cuda_types.cuh"

namespace barata::cuda {

// Types launch_embed reads directly (every type kernels/qdecode.cuh decodes).
bool embed_supported(DType type);

// x[i][j] = scale * dequant(table row tokens[i])[j] for i < n_rows, j < d.
// table: row r at table + r * row_bytes (block types: whole blocks, no header).
// tokens: device array, each already checked to be inside the vocabulary.
void launch_embed(DType type, const void* table, size_t row_bytes, float scale, int64_t d,
                  const int32_t* tokens, int64_t n_rows, float* x, cudaStream_t stream);

}  // namespace barata::cuda
