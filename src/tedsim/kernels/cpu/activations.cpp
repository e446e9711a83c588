// tanh via exp keeps the loops vectorizable: tanh(u) = 1 - 2 / (exp(2u) + 1), which is also
// stable for large |u| (exp overflow gives 1, underflow gives -1).
#include "tedsim/kernels/cpu/activations.hpp"

#include <cmath>

#include "tedsim/kernels/cpu/fast_math.hpp"

namespace tedsim::kernels {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCoeff = 0.044715f;

inline float tanh_fast(float u) { return 1.0f - 2.0f / (detail::fast_exp(2.0f * u) + 1.0f); }
inline float sigmoid(float a) { return 1.0f / (1.0f + detail::fast_exp(-a)); }
}  // namespace

void gelu_forward(std::size_t n, const float* x, float* y) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCoeff * v * v * v);
    y[i] = 0.5f * v * (1.0f + tanh_fast(u));
  }
}

void gelu_backward(std::size_t n, const float* x, const float* grad_y, float* grad_x) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kSqrt2OverPi * (v + kCoeff * v * v * v);
    const float th = tanh_fast(u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * v * v);
    grad_x[i] = grad_y[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
  }
}

void swiglu_forward(int rows, int ffn, const float* x, float* y) {
  const std::size_t f = ffn;
  for (int r = 0; r < rows; ++r) {
    const float* a = x + r * 2 * f;
    const float* b = a + f;
    float* yr = y + r * f;
#pragma omp simd
    for (std::size_t i = 0; i < f; ++i) yr[i] = a[i] * sigmoid(a[i]) * b[i];
  }
}

void swiglu_backward(int rows, int ffn, const float* x, const float* grad_y, float* grad_x) {
  const std::size_t f = ffn;
  for (int r = 0; r < rows; ++r) {
    const float* a = x + r * 2 * f;
    const float* b = a + f;
    const float* gy = grad_y + r * f;
    float* ga = grad_x + r * 2 * f;
    float* gb = ga + f;
#pragma omp simd
    for (std::size_t i = 0; i < f; ++i) {
      const float s = sigmoid(a[i]);
      ga[i] = gy[i] * b[i] * s * (1.0f + a[i] * (1.0f - s));
      gb[i] = gy[i] * a[i] * s;
    }
  }
}

}  // namespace tedsim::kernels
