#pragma once
// Vectorizable exp for softmax: std::exp does not vectorize without -ffast-math, and the gating
// and attention softmaxes are bound by it. Range reduction x = n*ln2 + r, |r| <= ln2/2, then a
// degree-6 polynomial: relative error ~2e-7 for the x <= 0 inputs a max-subtracted softmax sees.
#include <cstdint>
#include <cstring>

namespace tedsim::kernels::detail {

inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // two-part ln2 keeps r exact
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace tedsim::kernels::detail
