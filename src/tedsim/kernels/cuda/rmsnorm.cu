// RMSNorm forward and backward in fp32, same formulas as cpu/rmsnorm.cpp (the reference): one
// block per row for y and grad_x (a row sum each), then a column-sum kernel for grad_gamma, so it
// is overwritten deterministically (no atomics, no zero fill).
#include "tedsim/kernels/cuda/block_reduce.cuh"
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {

// y = x * rstd * gamma, rstd = 1/sqrt(mean(x^2) + eps).
__global__ void rmsnorm_kernel(int hidden, float eps, const float* x, const float* gamma, float* y, float* rstd) {
  __shared__ float scratch[32];
  const std::size_t row = blockIdx.x;
  const float* xr = x + row * hidden;
  float* yr = y + row * hidden;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += xr[i] * xr[i];
  const float s = rsqrtf(detail::block_sum(ss, scratch) / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) yr[i] = xr[i] * s * gamma[i];
  if (threadIdx.x == 0) rstd[row] = s;
}

// dx_j = rstd g_j dy_j - rstd^3 / h * x_j * sum_i(dy_i g_i x_i).
__global__ void rmsnorm_grad_x_kernel(int hidden, const float* x, const float* gamma, const float* rstd,
                                      const float* grad_y, float* grad_x) {
  __shared__ float scratch[32];
  const std::size_t row = blockIdx.x;
  const float* xr = x + row * hidden;
  const float* gy = grad_y + row * hidden;
  float* gx = grad_x + row * hidden;
  const float s = rstd[row];
  float dot = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dot += gy[i] * gamma[i] * xr[i];
  const float c = detail::block_sum(dot, scratch) * s * s * s / hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) gx[i] = s * gamma[i] * gy[i] - c * xr[i];
}

// grad_gamma_j = sum over rows of dy_j x_j rstd: block (32 columns) x (kRowLanes row stripes),
// threadIdx.x walking the columns so every row read is coalesced.
constexpr int kRowLanes = 32;

__global__ void rmsnorm_grad_gamma_kernel(int rows, int hidden, const float* x, const float* rstd, const float* grad_y,
                                          float* grad_gamma) {
  __shared__ float part[kRowLanes][33];  // +1 column: no bank conflicts on the transposed read
  const int col = blockIdx.x * 32 + threadIdx.x;
  float sg = 0.0f;
  if (col < hidden) {
    for (int r = threadIdx.y; r < rows; r += kRowLanes) {
      const std::size_t at = static_cast<std::size_t>(r) * hidden + col;
      sg += grad_y[at] * x[at] * rstd[r];
    }
  }
  part[threadIdx.y][threadIdx.x] = sg;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden) {
    float g = 0.0f;
    for (int s = 0; s < kRowLanes; ++s) g += part[s][threadIdx.x];
    grad_gamma[col] = g;
  }
}

}  // namespace

void rmsnorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, float* y, float* rstd) {
  if (rows <= 0 || hidden <= 0) return;
  rmsnorm_kernel<<<rows, detail::row_threads(hidden, 1024)>>>(hidden, eps, x, gamma, y, rstd);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* rstd,
                      const float* grad_y, float* grad_x, float* grad_gamma) {
  if (hidden <= 0) return;
  if (rows > 0) {
    rmsnorm_grad_x_kernel<<<rows, detail::row_threads(hidden, 1024)>>>(hidden, x, gamma, rstd, grad_y, grad_x);
    TEDSIM_CUDA_CHECK_LAUNCH();
  }
  // Launched also for rows == 0: the CPU kernel overwrites grad_gamma with zeros then.
  const dim3 block(32, kRowLanes);
  rmsnorm_grad_gamma_kernel<<<(hidden + 31) / 32, block>>>(rows, hidden, x, rstd, grad_y, grad_gamma);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
