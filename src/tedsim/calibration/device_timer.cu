#include <cuda_runtime.h>

#include <string>

#include "tedsim/calibration/device_timer.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim::calibration {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw RunError(std::string("CUDA event ") + what + ": " + cudaGetErrorString(e));
}
}  // namespace

struct CudaEventTimer::Impl {
  cudaEvent_t begin{}, end{};
};

CudaEventTimer::CudaEventTimer() : impl_(std::make_unique<Impl>()) {
  check(cudaEventCreate(&impl_->begin), "create");
  check(cudaEventCreate(&impl_->end), "create");
}
CudaEventTimer::~CudaEventTimer() {
  cudaEventDestroy(impl_->begin);
  cudaEventDestroy(impl_->end);
}
void CudaEventTimer::start() { check(cudaEventRecord(impl_->begin, 0), "record"); }
double CudaEventTimer::stop() {
  check(cudaEventRecord(impl_->end, 0), "record");
  check(cudaEventSynchronize(impl_->end), "synchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, impl_->begin, impl_->end), "elapsed");
  return double(ms) * 1e-3;
}

}  // namespace tedsim::calibration
