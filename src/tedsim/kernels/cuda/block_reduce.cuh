#pragma once
// Warp and block reductions for the row-wise kernels of the training step (one block per row):
// every thread gets the result, so a row kernel can reduce and then use the value at once.
#include <cmath>

#include "tedsim/kernels/cuda/common.cuh"

namespace tedsim::kernels::cuda::detail {

struct SumOp {
  template <class T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// blockDim.x must be a multiple of 32 (at most 1024); `scratch` holds 32 values of shared memory.
// `identity` pads the lanes past the last warp. The leading barrier lets consecutive calls reuse
// the same scratch without the caller synchronizing in between.
template <class T, class Op>
__device__ T block_reduce(T v, T identity, Op op, T* scratch) {
  v = warp_reduce(v, op);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? scratch[lane] : identity;
  return warp_reduce(v, op);
}

__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce(v, 0.0f, SumOp{}, scratch); }
__device__ __forceinline__ double block_sum(double v, double* scratch) {
  return block_reduce(v, 0.0, SumOp{}, scratch);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, -INFINITY, MaxOp{}, scratch);
}

// Threads for a one-block-per-row kernel: the row width rounded up to whole warps, within
// [32, max_threads], so narrow rows do not launch idle warps.
inline int row_threads(long long width, int max_threads) {
  const long long rounded = (width + 31) / 32 * 32;
  if (rounded < 32) return 32;
  return rounded > max_threads ? max_threads : static_cast<int>(rounded);
}

// Grid-stride loop bounds for element-wise kernels over n items.
__device__ __forceinline__ std::size_t grid_start() {
  return blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

}  // namespace tedsim::kernels::cuda::detail
