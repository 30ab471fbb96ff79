#include "device.cuh"

#include <cuda_runtime.h>

namespace barata::cuda {

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    // Clear the error so a later, unrelated runtime call does not report it.
    cudaGetLastError();
    if (!why) return false;
    *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    // What the runtime reports when libcuda.so is missing altogether.
    if (err == cudaErrorInsufficientDriver) *why += " (no NVIDIA driver loaded, or an older one)";
    return false;
  }
  if (count == 0) {
    if (why) *why = "the CUDA driver sees no device";
    return false;
  }
  return true;
}

}  // namespace barata::cuda
