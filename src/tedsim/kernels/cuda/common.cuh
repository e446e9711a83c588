#pragma once
// Shared by the .cu files: error checks that throw RunError with file:line, and fp32 <-> storage
// type conversion so one kernel template serves fp32, fp16 and bf16.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <string>

#include "tedsim/core/error.hpp"
#include "tedsim/core/units.hpp"

namespace tedsim::kernels::cuda::detail {

[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  throw RunError(std::string(file) + ":" + std::to_string(line) + ": " + what);
}

#define TEDSIM_CUDA_CHECK(expr)                                                                        \
  do {                                                                                                 \
    const cudaError_t tedsim_err_ = (expr);                                                            \
    if (tedsim_err_ != cudaSuccess)                                                                    \
      ::tedsim::kernels::cuda::detail::fail(__FILE__, __LINE__, std::string(#expr) + ": " +           \
                                                                   cudaGetErrorString(tedsim_err_));   \
  } while (0)

#define TEDSIM_CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                                 \
    const cublasStatus_t tedsim_st_ = (expr);                                                          \
    if (tedsim_st_ != CUBLAS_STATUS_SUCCESS)                                                           \
      ::tedsim::kernels::cuda::detail::fail(__FILE__, __LINE__, std::string(#expr) + ": " +           \
                                                                   cublasGetStatusString(tedsim_st_)); \
  } while (0)

// Launch errors (bad configuration) surface here; execution errors surface at synchronize().
#define TEDSIM_CUDA_CHECK_LAUNCH() TEDSIM_CUDA_CHECK(cudaGetLastError())

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Calls fn(T{}) with T the CUDA storage type of `type`.
template <class Fn>
void with_type(Dtype type, Fn&& fn) {
  switch (type) {
    case Dtype::fp32: fn(float{}); break;
    case Dtype::fp16: fn(__half{}); break;
    case Dtype::bf16: fn(__nv_bfloat16{}); break;
  }
}

inline unsigned blocks_for(std::size_t n, unsigned threads) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535u * 16u ? (b == 0 ? 1 : b) : 65535u * 16u);
}

}  // namespace tedsim::kernels::cuda::detail
