// Rotary position embeddings in fp32, the same rotation as cpu/rotary.cpp (the reference): one
// thread per (row, head, pair), in place, the cos/sin table of cpu::rotary_table in device memory.
#include <algorithm>

#include "tedsim/kernels/cuda/common.cuh"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::cuda {

namespace {

__global__ void rotary_kernel(std::size_t pairs, int seq, int heads, int head_dim, int half, int row_stride,
                              const float* cos, const float* sin, float sign, float* x) {
  for (std::size_t p = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; p < pairs;
       p += std::size_t(gridDim.x) * blockDim.x) {
    const int i = int(p % half);
    const std::size_t head_row = p / half;
    const int head = int(head_row % heads);
    const std::size_t row = head_row / heads;
    const std::size_t at = std::size_t(row % seq) * half + i;
    float* a = x + row * row_stride + std::size_t(head) * head_dim + i;
    const float x1 = a[0], x2 = a[half], c = cos[at], s = sign * sin[at];
    a[0] = x1 * c - x2 * s;
    a[half] = x2 * c + x1 * s;
  }
}

void rotate(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
            const float* sin, float sign, float* x) {
  const int half = rotary_dim / 2;
  const std::size_t pairs = std::size_t(rows) * heads * half;
  if (pairs == 0) return;
  const int threads = 256;
  const std::size_t blocks = std::min<std::size_t>((pairs + threads - 1) / threads, 65535);
  rotary_kernel<<<unsigned(blocks), threads>>>(pairs, seq, heads, head_dim, half, row_stride, cos, sin, sign, x);
  TEDSIM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rotary_forward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                    const float* sin, float* x) {
  rotate(rows, seq, heads, head_dim, rotary_dim, row_stride, cos, sin, 1.0f, x);
}

void rotary_backward(int rows, int seq, int heads, int head_dim, int rotary_dim, int row_stride, const float* cos,
                     const float* sin, float* grad) {
  rotate(rows, seq, heads, head_dim, rotary_dim, row_stride, cos, sin, -1.0f, grad);
}

}  // namespace tedsim::kernels::cuda
