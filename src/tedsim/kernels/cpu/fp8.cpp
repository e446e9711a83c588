#include "tedsim/kernels/cpu/fp8.hpp"

#include <cmath>

namespace tedsim::kernels {

float round_to_e4m3(float x) {
  if (std::isnan(x)) return x;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return std::copysign(kE4m3Max, x);
  // Spacing of representable values at |x|: 2^(e - 3) for normals (e = floor(log2 |x|) >= -6),
  // 2^-9 for subnormals. nearbyint rounds ties to even in the default rounding mode, and a
  // multiple of the spacing that is even is one whose last mantissa bit is 0.
  int e = 0;
  std::frexp(a, &e);  // a = f 2^e, f in [0.5, 1): floor(log2 a) = e - 1
  const int exponent = e - 1 < -6 ? -6 : e - 1;
  const float step = std::ldexp(1.0f, exponent - 3);
  float r = std::nearbyint(a / step) * step;
  if (r > kE4m3Max) r = kE4m3Max;
  return std::copysign(r, x);
}

std::vector<float> quantize_e4m3(const std::vector<float>& x, float scale) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = round_to_e4m3(x[i] * scale);
  return out;
}

}  // namespace tedsim::kernels
