// Built instead of cuda_device.cu when tedsim was configured without CUDA: the cuda backend is
// reported as unavailable with the reason, never as a crash.
#include "tedsim/comm/communicator.hpp"
#include "tedsim/comm/cuda_device.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim {

static const char* const kNoCuda = "tedsim was built without CUDA (nvcc not found or TEDSIM_CUDA=OFF)";

int cuda_device_count(std::string* why) {
  if (why) *why = kNoCuda;
  return 0;
}

int select_cuda_device(int, const std::string& where) {
  throw RunError(where + ": no CUDA device: " + kNoCuda);
}

}  // namespace tedsim
