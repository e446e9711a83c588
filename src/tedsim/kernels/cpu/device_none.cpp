// Device discovery for builds without CUDA: there is never a device, and we say why.
#include "tedsim/kernels/device.hpp"

namespace tedsim::kernels {

bool built_with_cuda() { return false; }
int cuda_device_count() { return 0; }
std::string describe_cuda_unavailable() {
  return "no CUDA device: tedsim was built without CUDA (reconfigure with nvcc on PATH and -DTEDSIM_CUDA=ON)";
}

bool cuda_fp8_gemm_supported(std::string* why) {
  if (why) *why = describe_cuda_unavailable();
  return false;
}

}  // namespace tedsim::kernels
