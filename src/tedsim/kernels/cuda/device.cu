// Device discovery through the CUDA runtime. The runtime loads libcuda lazily, so on a machine with
// no driver cudaGetDeviceCount returns an error (35, insufficient driver) instead of failing to start.
#include <cuda_runtime_api.h>

#include <string>

#include "tedsim/kernels/device.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels {

bool built_with_cuda() { return true; }

int cuda_device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later queries start clean
    return 0;
  }
  return n;
}

std::string describe_cuda_unavailable() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: cudaGetDeviceCount failed with error ") +
           std::to_string(static_cast<int>(err)) + " (" + cudaGetErrorName(err) + ": " +
           cudaGetErrorString(err) + ")";
  }
  if (n == 0) return "no CUDA device: the driver reports 0 devices";
  return "";
}

bool cuda_fp8_gemm_supported(std::string* why) {
  if (cuda_device_count() <= 0) {
    if (why) *why = describe_cuda_unavailable();
    return false;
  }
  return cuda::fp8_gemm_supported(why);
}

}  // namespace tedsim::kernels
