// Raw device memory for the training step (allocation, copies, zero fill) and the two
// element-wise updates the step applies to whole buffers (gradient accumulation, scaling).
#include <string>

#include "tedsim/kernels/cuda/block_reduce.cuh"
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

void* device_malloc(std::size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err != cudaSuccess) {
    // An out-of-memory result is not sticky, but cudaGetLastError would still return it and make
    // the next TEDSIM_CUDA_CHECK_LAUNCH blame an innocent kernel.
    cudaGetLastError();
    detail::fail(__FILE__, __LINE__,
                 "cudaMalloc of " + std::to_string(bytes) + " bytes: " + cudaGetErrorString(err));
  }
  return ptr;
}

void device_free(void* ptr) noexcept {
  if (ptr && cudaFree(ptr) != cudaSuccess) cudaGetLastError();  // noexcept: drop the error, keep later checks clean
}

void copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  TEDSIM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch, std::size_t row_bytes,
             std::size_t rows) {
  if (row_bytes == 0 || rows == 0) return;
  TEDSIM_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice));
}

void fill_zero(void* ptr, std::size_t bytes) {
  if (bytes == 0) return;
  TEDSIM_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes));
}

namespace {
__global__ void add_into_kernel(std::size_t n, const float* a, float* y) {
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) y[i] += a[i];
}

__global__ void scale_kernel(std::size_t n, float alpha, float* y) {
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) y[i] *= alpha;
}
}  // namespace

void add_into(std::size_t n, const float* a, float* y) {
  if (n == 0) return;
  add_into_kernel<<<detail::blocks_for(n, 256), 256>>>(n, a, y);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void scale(std::size_t n, float alpha, float* y) {
  if (n == 0) return;
  scale_kernel<<<detail::blocks_for(n, 256), 256>>>(n, alpha, y);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
