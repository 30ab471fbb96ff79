// The weight types barata's CUDA kernels read in their stored form (embed,
// GEMV, dequant to fp16 share the set); every other type is converted to F16
// when the CUDA backend loads it (docs/cuda.md).
#pragma once

#include "barata/dtype.h"

namespace barata::cuda {

inline bool device_reads_type(DType type) {
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
      return true;
    default:
      return false;
  }
}

}  // namespace barata::cuda
