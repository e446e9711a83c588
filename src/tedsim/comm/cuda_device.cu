// CUDA runtime calls for device discovery. Linked against cudart only (never libcuda), so a
// machine without a driver gets an error code here (35, insufficient driver) and not a crash.
#include <cuda_runtime.h>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/comm/cuda_device.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim {

int cuda_device_count(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why)
      *why = std::string("cudaGetDeviceCount returned error ") + std::to_string(int(err)) + " (" +
             cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear it, so later calls report their own errors
    return 0;
  }
  if (count == 0 && why) *why = "cudaGetDeviceCount found 0 devices";
  return count;
}

int select_cuda_device(int local_rank, const std::string& where) {
  std::string why;
  const int count = cuda_device_count(&why);
  if (count == 0) throw RunError(where + ": no CUDA device: " + why);
  const int device = local_rank % count;
  const cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess)
    throw RunError(where + ": cudaSetDevice(" + std::to_string(device) + ") failed: " +
                   cudaGetErrorString(err));
  return device;
}

}  // namespace tedsim
