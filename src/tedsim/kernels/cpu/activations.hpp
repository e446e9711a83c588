#pragma once
// Element-wise activations of the FFN, CPU fp32.
#include <cstddef>

namespace tedsim::kernels {

// GeLU, tanh approximation (Megatron/GPT-2): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(std::size_t n, const float* x, float* y);
// grad_x = grad_y * dy/dx (overwrites).
void gelu_backward(std::size_t n, const float* x, const float* grad_y, float* grad_x);

// SwiGLU: x is [rows, 2F], the first F columns are the gate a, the last F the value b:
// y[r, i] = silu(a) * b with silu(a) = a * sigmoid(a). y is [rows, F].
void swiglu_forward(int rows, int ffn, const float* x, float* y);
// grad_x [rows, 2F] (overwrites): da = dy * b * sigmoid(a) * (1 + a (1 - sigmoid(a))), db = dy * silu(a).
void swiglu_backward(int rows, int ffn, const float* x, const float* grad_y, float* grad_x);

}  // namespace tedsim::kernels
