// Dispatch/combine loops: rows are copied or accumulated whole (h contiguous floats), so each
// kernel is a sequence of row-sized memcpy/axpy operations the compiler vectorizes.
#include "tedsim/kernels/cpu/dispatch.hpp"

#include <algorithm>
#include <cstring>

namespace tedsim::kernels {

namespace {
std::size_t slot_offset(const GatingOutput& g, int e, int pos, int hidden) {
  return (static_cast<std::size_t>(e) * g.capacity + pos) * hidden;
}
}  // namespace

void dispatch(const GatingOutput& gate, const float* x, int hidden, float* buf) {
  const std::size_t h = hidden;
  // Zero only the slots past each expert's kept count: slots [0, kept) are all written below.
  for (int e = 0; e < gate.experts; ++e) {
    const int filled = std::min(gate.kept[e], gate.capacity);
    float* tail = buf + slot_offset(gate, e, filled, hidden);
    std::memset(tail, 0, static_cast<std::size_t>(gate.capacity - filled) * h * sizeof(float));
  }
  const std::size_t n = static_cast<std::size_t>(gate.tokens) * gate.k;
  for (std::size_t i = 0; i < n; ++i) {
    const int pos = gate.position[i];
    if (pos < 0) continue;
    const std::size_t t = i / gate.k;
    std::memcpy(buf + slot_offset(gate, gate.expert[i], pos, hidden), x + t * h, h * sizeof(float));
  }
}

void combine(const GatingOutput& gate, const float* buf, int hidden, float* out) {
  const std::size_t h = hidden;
  const int k = gate.k;
  for (int t = 0; t < gate.tokens; ++t) {
    float* o = out + t * h;
    std::fill(o, o + h, 0.0f);
    for (int j = 0; j < k; ++j) {
      const std::size_t i = static_cast<std::size_t>(t) * k + j;
      const int pos = gate.position[i];
      if (pos < 0) continue;
      const float w = gate.weight[i];
      const float* src = buf + slot_offset(gate, gate.expert[i], pos, hidden);
#pragma omp simd
      for (std::size_t c = 0; c < h; ++c) o[c] += w * src[c];
    }
  }
}

void dispatch_backward(const GatingOutput& gate, const float* grad_buf, int hidden, float* grad_x) {
  const std::size_t h = hidden;
  const int k = gate.k;
  for (int t = 0; t < gate.tokens; ++t) {
    float* gx = grad_x + t * h;
    std::fill(gx, gx + h, 0.0f);
    for (int j = 0; j < k; ++j) {
      const std::size_t i = static_cast<std::size_t>(t) * k + j;
      const int pos = gate.position[i];
      if (pos < 0) continue;
      const float* src = grad_buf + slot_offset(gate, gate.expert[i], pos, hidden);
#pragma omp simd
      for (std::size_t c = 0; c < h; ++c) gx[c] += src[c];
    }
  }
}

void combine_backward(const GatingOutput& gate, const float* buf, const float* grad_out, int hidden,
                      float* grad_buf, float* grad_weight) {
  const std::size_t h = hidden;
  for (int e = 0; e < gate.experts; ++e) {
    const int filled = std::min(gate.kept[e], gate.capacity);
    float* tail = grad_buf + slot_offset(gate, e, filled, hidden);
    std::memset(tail, 0, static_cast<std::size_t>(gate.capacity - filled) * h * sizeof(float));
  }
  const std::size_t n = static_cast<std::size_t>(gate.tokens) * gate.k;
  for (std::size_t i = 0; i < n; ++i) {
    const int pos = gate.position[i];
    if (pos < 0) {
      grad_weight[i] = 0.0f;
      continue;
    }
    const std::size_t t = i / gate.k;
    const float* go = grad_out + t * h;
    const std::size_t off = slot_offset(gate, gate.expert[i], pos, hidden);
    const float* b = buf + off;
    float* gb = grad_buf + off;
    const float w = gate.weight[i];
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (std::size_t c = 0; c < h; ++c) {
      gb[c] = w * go[c];
      dot += go[c] * b[c];
    }
    grad_weight[i] = dot;
  }
}

}  // namespace tedsim::kernels
