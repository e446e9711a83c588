// One fused pass over the four fp32 arrays: the optimizer step is memory bound (16 bytes read and
// 12 written per parameter), so the point is to touch each array exactly once.
#include "tedsim/kernels/cpu/adam.hpp"

#include <cmath>
#include <string>

#include "tedsim/core/error.hpp"

namespace tedsim::kernels {

void adam_step(std::size_t n, const AdamConfig& cfg, int step, float* params, const float* grads, float* exp_avg,
               float* exp_avg_sq) {
  if (step < 1) throw InputError("adam_step: step is 1-based, got " + std::to_string(step));
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(cfg.beta1), step));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(cfg.beta2), step));
  const float step_size = cfg.lr / bc1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
  const float b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, wd = cfg.weight_decay, lr = cfg.lr;
  const bool adamw = cfg.adamw;
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) {
    float g = grads[i];
    const float p = params[i];
    if (!adamw) g += wd * p;
    const float m = b1 * exp_avg[i] + (1.0f - b1) * g;
    const float v = b2 * exp_avg_sq[i] + (1.0f - b2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    // m_hat / (sqrt(v_hat) + eps) = (m / bc1) / (sqrt(v) / sqrt(bc2) + eps)
    const float denom = std::sqrt(v) * inv_sqrt_bc2 + eps;
    float update = step_size * m / denom;
    if (adamw) update += lr * wd * p;
    params[i] = p - update;
  }
}

}  // namespace tedsim::kernels
