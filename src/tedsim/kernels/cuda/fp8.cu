// FP8 E4M3 on the device: what the GPU offers and the quantization of fp32 values (cpu/fp8.hpp is
// the reference rounding: nearest, ties to even, saturating at 448).
#include <cuda_fp8.h>

#include <string>

#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {
__global__ void quantize_e4m3_kernel(const float* x, std::size_t n, float scale, unsigned char* out) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __nv_cvt_float_to_fp8(x[i] * scale, __NV_SATFINITE, __NV_E4M3);
}
}  // namespace

bool fp8_gemm_supported(std::string* why) {
  int device = 0;
  cudaDeviceProp prop{};
  TEDSIM_CUDA_CHECK(cudaGetDevice(&device));
  TEDSIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  // FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x, 12.x).
  const bool ok = prop.major > 8 || (prop.major == 8 && prop.minor >= 9);
  if (!ok && why)
    *why = std::string(prop.name) + " is compute capability " + std::to_string(prop.major) + "." +
           std::to_string(prop.minor) + "; FP8 tensor cores need 8.9 or later (Ada, Hopper, Blackwell)";
  return ok;
}

void quantize_e4m3(const float* x, std::size_t n, float scale, void* out) {
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
  quantize_e4m3_kernel<<<blocks, 256>>>(x, n, scale, static_cast<unsigned char*>(out));
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
