// Backward passes of LayerNorm and SwiGLU in fp32, same formulas as cpu/layernorm.cpp and
// cpu/activations.cpp (the references). LayerNorm: one block per row for grad_x (two row sums),
// then a column-sum kernel for grad_gamma / grad_beta so they are overwritten deterministically
// (no atomics, no zero fill).
#include "tedsim/kernels/cuda/block_reduce.cuh"
#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {

// dxhat = dy * gamma; dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
__global__ void layernorm_grad_x_kernel(int hidden, const float* x, const float* gamma, const float* mean,
                                        const float* rstd, const float* grad_y, float* grad_x) {
  __shared__ float scratch[32];
  const std::size_t row = blockIdx.x;
  const float* xr = x + row * hidden;
  const float* gy = grad_y + row * hidden;
  float* gx = grad_x + row * hidden;
  const float mu = mean[row], rs = rstd[row];
  float sum_d = 0.0f, sum_dx = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float xhat = (xr[i] - mu) * rs;
    const float d = gy[i] * gamma[i];
    sum_d += d;
    sum_dx += d * xhat;
  }
  const float md = detail::block_sum(sum_d, scratch) / hidden;
  const float mdx = detail::block_sum(sum_dx, scratch) / hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float xhat = (xr[i] - mu) * rs;
    gx[i] = rs * (gy[i] * gamma[i] - md - xhat * mdx);
  }
}

// Column sums over the rows: block (32 columns) x (kRowLanes row stripes); threadIdx.x walks the
// columns so every row read is coalesced, the stripes are added in shared memory at the end.
constexpr int kRowLanes = 32;

__global__ void layernorm_grad_params_kernel(int rows, int hidden, const float* x, const float* mean,
                                             const float* rstd, const float* grad_y, float* grad_gamma,
                                             float* grad_beta) {
  __shared__ float part_gamma[kRowLanes][33];  // +1 column: no bank conflicts on the transposed read
  __shared__ float part_beta[kRowLanes][33];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float sg = 0.0f, sb = 0.0f;
  if (col < hidden) {
    for (int r = threadIdx.y; r < rows; r += kRowLanes) {
      const std::size_t at = static_cast<std::size_t>(r) * hidden + col;
      const float gy = grad_y[at];
      sg += gy * ((x[at] - mean[r]) * rstd[r]);
      sb += gy;
    }
  }
  part_gamma[threadIdx.y][threadIdx.x] = sg;
  part_beta[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden) {
    float g = 0.0f, b = 0.0f;
    for (int s = 0; s < kRowLanes; ++s) {
      g += part_gamma[s][threadIdx.x];
      b += part_beta[s][threadIdx.x];
    }
    grad_gamma[col] = g;
    grad_beta[col] = b;
  }
}

__global__ void swiglu_backward_kernel(int ffn, std::size_t n, const float* x, const float* grad_y, float* grad_x) {
  for (std::size_t i = detail::grid_start(); i < n; i += detail::grid_stride()) {
    const std::size_t r = i / ffn, c = i % ffn;
    const std::size_t in = r * 2 * ffn + c;
    const float a = x[in], b = x[in + ffn];
    const float s = 1.0f / (1.0f + expf(-a));
    const float gy = grad_y[i];
    grad_x[in] = gy * b * s * (1.0f + a * (1.0f - s));
    grad_x[in + ffn] = gy * a * s;
  }
}

}  // namespace

void layernorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* mean,
                        const float* rstd, const float* grad_y, float* grad_x, float* grad_gamma, float* grad_beta) {
  if (hidden <= 0) return;
  if (rows > 0) {
    layernorm_grad_x_kernel<<<rows, detail::row_threads(hidden, 1024)>>>(hidden, x, gamma, mean, rstd, grad_y,
                                                                          grad_x);
    TEDSIM_CUDA_CHECK_LAUNCH();
  }
  // Launched also for rows == 0: the CPU kernel overwrites the parameter gradients with zeros then.
  const dim3 block(32, kRowLanes);
  layernorm_grad_params_kernel<<<(hidden + 31) / 32, block>>>(rows, hidden, x, mean, rstd, grad_y, grad_gamma,
                                                             grad_beta);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(int rows, int ffn, const float* x, const float* grad_y, float* grad_x) {
  if (rows <= 0 || ffn <= 0) return;
  const std::size_t n = static_cast<std::size_t>(rows) * ffn;
  swiglu_backward_kernel<<<detail::blocks_for(n, 256), 256>>>(ffn, n, x, grad_y, grad_x);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace tedsim::kernels::cuda
