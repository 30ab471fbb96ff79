// Quantized rows to fp16 on the device: the path that feeds cuBLAS half GEMMs.
#pragma once

#include <cstdint>

#include "barata/dtype.h"
#include "cuda_types.cuh"

namespace barata::cuda {

// Dequantizes n elements of type `type` (n / block_size packed blocks at
// d_src, any alignment) into n fp16 values at d_dst_f16, which must be 16-byte
// aligned (cudaMalloc memory is). Asynchronous on `stream`. Each value is
// computed in fp32 exactly as the CPU reference does, then rounded once to
// nearest even, so results equal fp32_to_fp16(reference) bit for bit.
// Supports F32, F16, BF16 (any n, any source alignment), Q8_0, Q4_0 and Q4_1
// (dequant_f16_supported); throws barata::Error for any other type, for n not
// a whole number of blocks, or for a misaligned destination. An F16 source is
// copied as it is (NaN payloads too; fp32_to_fp16 would set the quiet bit).
bool dequant_f16_supported(DType type);

void cuda_dequantize_to_f16(DType type, const void* d_src, void* d_dst_f16, int64_t n,
                            cudaStream_t stream);

}  // namespace barata::cuda
