#pragma once
#include "tedsim/profile/measured_profile.hpp"

namespace tedsim::calibration {
// CUDA driver/runtime/cuBLAS/NCCL versions and this rank's device name; no-op without CUDA.
void add_cuda_provenance(Provenance& p);
}  // namespace tedsim::calibration
