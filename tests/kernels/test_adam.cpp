// Adam against steps computed by hand (numbers written out below) and a fp64 loop over steps.
#include <gtest/gtest.h>

#include <cmath>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/adam.hpp"

namespace tedsim::kernels {
namespace {

TEST(Adam, FirstStepByHand) {
  // Step 1: m = 0.1 g, v = 0.001 g^2, m_hat = g, v_hat = g^2 -> p -= lr * g / (|g| + eps) = lr*sign(g).
  AdamConfig cfg;
  cfg.lr = 0.01f;
  float p[2] = {1.0f, -2.0f};
  const float g[2] = {0.5f, -4.0f};
  float m[2] = {0, 0}, v[2] = {0, 0};
  adam_step(2, cfg, 1, p, g, m, v);
  EXPECT_NEAR(p[0], 1.0f - 0.01f, 1e-6);
  EXPECT_NEAR(p[1], -2.0f + 0.01f, 1e-6);
  EXPECT_NEAR(m[0], 0.05f, 1e-7);
  EXPECT_NEAR(v[1], 0.016f, 1e-6);  // 1 - 0.999f is 0.00099999 in fp32
}

TEST(Adam, DecoupledAndL2WeightDecay) {
  AdamConfig cfg;
  cfg.lr = 0.1f;
  cfg.weight_decay = 0.5f;
  // AdamW: p = 2 - 0.1 * (1 + 0.5 * 2) = 1.8 for g = 3 at step 1.
  float p = 2.0f, m = 0, v = 0;
  const float g = 3.0f;
  adam_step(1, cfg, 1, &p, &g, &m, &v);
  EXPECT_NEAR(p, 1.8f, 1e-6);
  // L2: g' = 3 + 0.5 * 2 = 4, first step moves by lr * sign = 0.1 -> 1.9; m = 0.4.
  cfg.adamw = false;
  p = 2.0f;
  m = v = 0;
  adam_step(1, cfg, 1, &p, &g, &m, &v);
  EXPECT_NEAR(p, 1.9f, 1e-6);
  EXPECT_NEAR(m, 0.4f, 1e-6);
}

TEST(Adam, SeveralStepsMatchFp64Loop) {
  AdamConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.01f;
  const int n = 37;
  std::vector<float> p(n), m(n, 0), v(n, 0), g(n);
  std::vector<double> pd(n), md(n, 0), vd(n, 0);
  for (int i = 0; i < n; ++i) pd[i] = p[i] = 0.1f * (i - 18);
  for (int step = 1; step <= 5; ++step) {
    for (int i = 0; i < n; ++i) g[i] = std::sin(0.3f * i + step);
    adam_step(n, cfg, step, p.data(), g.data(), m.data(), v.data());
    const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.999, step);
    for (int i = 0; i < n; ++i) {
      md[i] = 0.9 * md[i] + 0.1 * g[i];
      vd[i] = 0.999 * vd[i] + 0.001 * static_cast<double>(g[i]) * g[i];
      pd[i] -= 1e-2 * ((md[i] / bc1) / (std::sqrt(vd[i] / bc2) + 1e-8) + 0.01 * pd[i]);
    }
  }
  for (int i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 2e-6) << i;
}

TEST(Adam, RejectsStepZero) {
  float p = 0, g = 0, m = 0, v = 0;
  EXPECT_THROW(adam_step(1, AdamConfig{}, 0, &p, &g, &m, &v), InputError);
}

}  // namespace
}  // namespace tedsim::kernels
