#pragma once
// Device discovery visible to CPU code. Deliberately free of CUDA headers: CPU-only targets call
// these to decide whether to touch the GPU path at all, so a binary never crashes without a GPU.
#include <string>

namespace tedsim::kernels {

// True when this build contains the CUDA kernels (tedsim_kernels_cuda was compiled).
bool built_with_cuda();

// Number of usable CUDA devices; 0 when built without CUDA or when cudaGetDeviceCount fails
// (e.g. error 35, insufficient driver, on a machine with the toolkit but no GPU/driver).
int cuda_device_count();

// A one-line human explanation of why CUDA kernels cannot run here ("" when a device is usable).
std::string describe_cuda_unavailable();

// Whether the current CUDA device multiplies FP8 on tensor cores (compute capability 8.9+); when
// not, `why` says what the device is (or that there is none).
bool cuda_fp8_gemm_supported(std::string* why);

}  // namespace tedsim::kernels
