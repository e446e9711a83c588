#pragma once
// Adam/AdamW step on fp32 master weights, CPU. Matches DeepSpeed FusedAdam:
//   adamw (default): p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)   (decoupled)
//   !adamw (L2):     g += weight_decay * p before the moments, then p -= lr * m_hat / (sqrt(v_hat) + eps)
// with m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, m_hat = m / (1 - b1^step), v_hat = v / (1 - b2^step).
#include <cstddef>

namespace tedsim::kernels {

struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw = true;
};

// step is 1-based (the first update uses step = 1). Updates params, exp_avg, exp_avg_sq in place.
void adam_step(std::size_t n, const AdamConfig& cfg, int step, float* params, const float* grads, float* exp_avg,
               float* exp_avg_sq);

}  // namespace tedsim::kernels
