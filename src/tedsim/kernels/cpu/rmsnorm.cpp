#include "tedsim/kernels/cpu/rmsnorm.hpp"

#include <cmath>
#include <cstddef>

namespace tedsim::kernels {

void rmsnorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, float* y, float* rstd) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * hidden;
    float* yr = y + static_cast<std::size_t>(r) * hidden;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < hidden; ++i) ss += double(xr[i]) * xr[i];
    const float s = static_cast<float>(1.0 / std::sqrt(ss / hidden + eps));
    rstd[r] = s;
#pragma omp simd
    for (int i = 0; i < hidden; ++i) yr[i] = xr[i] * s * gamma[i];
  }
}

void rmsnorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* rstd,
                      const float* grad_y, float* grad_x, float* grad_gamma) {
  for (int i = 0; i < hidden; ++i) grad_gamma[i] = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * hidden;
    const float* gy = grad_y + static_cast<std::size_t>(r) * hidden;
    float* gx = grad_x + static_cast<std::size_t>(r) * hidden;
    const float s = rstd[r];
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < hidden; ++i) dot += double(gy[i]) * gamma[i] * xr[i];
    const float c = static_cast<float>(dot) * s * s * s / static_cast<float>(hidden);
#pragma omp simd
    for (int i = 0; i < hidden; ++i) {
      gx[i] = s * gamma[i] * gy[i] - c * xr[i];
      grad_gamma[i] += gy[i] * xr[i] * s;
    }
  }
}

}  // namespace tedsim::kernels
