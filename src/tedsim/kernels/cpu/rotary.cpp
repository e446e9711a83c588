#include "tedsim/kernels/cpu/rotary.hpp"

#include <cmath>
#include <cstddef>

namespace tedsim::kernels {
namespace {

// Rotates every head of every row by the angle of its position; `sign` -1 rotates backwards.
void rotate(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
            const float* sin, float sign, float* x) {
  const int half = rotary_dim / 2;
  for (int r = 0; r < rows; ++r) {
    const std::size_t pos = static_cast<std::size_t>(r % seq) * half;
    const float* c = cos + pos;
    const float* s = sin + pos;
    for (int hd = 0; hd < heads; ++hd) {
      float* a = x + static_cast<std::size_t>(r) * row_stride + static_cast<std::size_t>(hd) * head_dim;
      float* b = a + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float x1 = a[i], x2 = b[i], si = sign * s[i];
        a[i] = x1 * c[i] - x2 * si;
        b[i] = x2 * c[i] + x1 * si;
      }
    }
  }
}

}  // namespace

void rotary_table(int seq, int rotary_dim, double theta, float* cos, float* sin) {
  const int half = rotary_dim / 2;
  for (int p = 0; p < seq; ++p)
    for (int i = 0; i < half; ++i) {
      const double angle = double(p) * std::pow(theta, -2.0 * i / rotary_dim);
      cos[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::cos(angle));
      sin[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::sin(angle));
    }
}

void rotary_forward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                    const float* sin, float* x) {
  rotate(rows, seq, heads, head_dim, rotary_dim, row_stride, cos, sin, 1.0f, x);
}

void rotary_backward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                     const float* sin, float* grad) {
  rotate(rows, seq, heads, head_dim, rotary_dim, row_stride, cos, sin, -1.0f, grad);
}

}  // namespace tedsim::kernels
