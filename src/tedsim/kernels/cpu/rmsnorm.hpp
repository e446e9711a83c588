#pragma once
// RMSNorm over the last dimension, CPU fp32 (Zhang & Sennrich 2019, as Llama, Qwen, DeepSeek and
// Mixtral use it): y = x * rstd * gamma, rstd = 1/sqrt(mean(x^2) + eps); no mean, no bias.
namespace tedsim::kernels {

// x, y: [rows, h]; rstd: [rows] saved for the backward pass.
void rmsnorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, float* y, float* rstd);

// dx overwritten; dgamma overwritten with the sum over rows (the caller accumulates).
// dx_j = rstd g_j dy_j - rstd^3 / h * x_j * sum_i(dy_i g_i x_i).
void rmsnorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* rstd,
                      const float* grad_y, float* grad_x, float* grad_gamma);

}  // namespace tedsim::kernels
