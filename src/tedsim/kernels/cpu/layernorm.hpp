#pragma once
// LayerNorm over the last dimension, CPU fp32: y = (x - mean) * rstd * gamma + beta,
// rstd = 1/sqrt(var + eps) with the biased variance (as torch.nn.LayerNorm).
namespace tedsim::kernels {

// x, y: [rows, h]; mean, rstd: [rows] saved for the backward pass.
void layernorm_forward(int rows, int hidden, float eps, const float* x, const float* gamma, const float* beta,
                       float* y, float* mean, float* rstd);

// dx overwritten; dgamma, dbeta overwritten with the sums over rows (caller accumulates across
// micro-batches).
void layernorm_backward(int rows, int hidden, const float* x, const float* gamma, const float* mean,
                        const float* rstd, const float* grad_y, float* grad_x, float* grad_gamma,
                        float* grad_beta);

}  // namespace tedsim::kernels
