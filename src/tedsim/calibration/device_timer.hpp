#pragma once
// CUDA-event timer on the default stream (where tedsim's CUDA kernels are queued), visible to plain
// C++: no CUDA headers here. Only built with CUDA.
#include <memory>

namespace tedsim::calibration {

class CudaEventTimer {
 public:
  CudaEventTimer();
  ~CudaEventTimer();
  void start();
  double stop();  // waits for the bracketed work; seconds between start and stop
 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tedsim::calibration
