#pragma once
// Launch limits the attention kernels share: the shared-memory opt-in for a score row held in
// dynamic shared memory, and CUDA's 65535 cap on grid.y, where they put heads.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cuda/common.cuh"

namespace tedsim::kernels::cuda::detail {

// Raises `kernel`'s dynamic shared-memory limit past the 48 KiB default when a row of `bytes`
// needs it. The default and the device's opt-in maximum bound static + dynamic bytes together, so
// the kernel's own __shared__ arrays count. A row longer than the device allows is an input the
// caller has to change (a shorter sequence).
template <class Kernel>
void allow_shared_row(Kernel kernel, std::size_t bytes, const char* what) {
  cudaFuncAttributes attributes{};
  TEDSIM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const std::size_t static_bytes = attributes.sharedSizeBytes;
  if (bytes + static_bytes <= 48 * 1024) return;
  int device = 0, optin = 0;
  TEDSIM_CUDA_CHECK(cudaGetDevice(&device));
  TEDSIM_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes + static_bytes > static_cast<std::size_t>(optin)) {
    throw InputError(std::string(what) + ": the shared-memory row needs " + std::to_string(bytes + static_bytes) +
                     " bytes, the device allows " + std::to_string(optin) + " (sequence too long)");
  }
  TEDSIM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Rows go on grid.x so the blocks running together share one head's K and V in L2; heads go on
// grid.y, which CUDA caps at 65535.
inline void check_heads(int heads, const char* what) {
  if (heads > 65535) throw InputError(std::string(what) + ": more than 65535 heads (b * heads per rank)");
}

// One block per row of every head on grid.x, which CUDA caps at 2^31 - 1.
inline void check_rows(std::size_t rows, const char* what) {
  if (rows > 2147483647u) throw InputError(std::string(what) + ": more than 2^31 - 1 rows (b * heads * seq per rank)");
}

}  // namespace tedsim::kernels::cuda::detail
