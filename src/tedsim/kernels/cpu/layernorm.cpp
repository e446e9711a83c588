// Two passes per row (mean, then variance about the mean) for accuracy; the inner loops are
// simd reductions over h contiguous floats.
#include "tedsim/kernels/cpu/layernorm.hpp"

#include <algorithm>
#include <cmath>

namespace tedsim::kernels {

void layernorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, const float* beta,
                       float* y, float* mean, float* rstd) {
  const std::size_t h = hidden;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    float* yr = y + r * h;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (std::size_t i = 0; i < h; ++i) s += xr[i];
    const float mu = s / hidden;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (std::size_t i = 0; i < h; ++i) v += (xr[i] - mu) * (xr[i] - mu);
    const float rs = 1.0f / std::sqrt(v / hidden + eps);
#pragma omp simd
    for (std::size_t i = 0; i < h; ++i) yr[i] = (xr[i] - mu) * rs * gamma[i] + beta[i];
    mean[r] = mu;
    rstd[r] = rs;
  }
}

void layernorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* mean,
                        const float* rstd, const float* grad_y, float* grad_x, float* grad_gamma,
                        float* grad_beta) {
  const std::size_t h = hidden;
  std::fill(grad_gamma, grad_gamma + h, 0.0f);
  std::fill(grad_beta, grad_beta + h, 0.0f);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    const float* gy = grad_y + r * h;
    float* gx = grad_x + r * h;
    const float mu = mean[r], rs = rstd[r];
    // dxhat = dy * gamma; dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    float sum_d = 0.0f, sum_dx = 0.0f;
#pragma omp simd reduction(+ : sum_d, sum_dx)
    for (std::size_t i = 0; i < h; ++i) {
      const float xhat = (xr[i] - mu) * rs;
      const float d = gy[i] * gamma[i];
      sum_d += d;
      sum_dx += d * xhat;
      grad_gamma[i] += gy[i] * xhat;
      grad_beta[i] += gy[i];
    }
    const float md = sum_d / hidden, mdx = sum_dx / hidden;
#pragma omp simd
    for (std::size_t i = 0; i < h; ++i) {
      const float xhat = (xr[i] - mu) * rs;
      gx[i] = rs * (gy[i] * gamma[i] - md - xhat * mdx);
    }
  }
}

}  // namespace tedsim::kernels
