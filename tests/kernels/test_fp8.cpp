// The CPU E4M3 rounding (the reference of the CUDA FP8 tests) against E4M3's definition: every
// representable value enumerated from its bits, nearest value with ties to even, saturation.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tedsim/kernels/cpu/fp8.hpp"

namespace tedsim::kernels {
namespace {

// Every finite non-negative E4M3 value, in increasing order, from its bits (OCP FP8 E4M3: bias 7;
// exponent field 15 with mantissa 7 is NaN, so 448 is the largest).
std::vector<double> e4m3_values() {
  std::vector<double> v;
  for (int bits = 0; bits < 127; ++bits) {
    const int exponent = bits >> 3, mantissa = bits & 7;
    v.push_back(exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7));
  }
  return v;
}

TEST(E4m3, RepresentableValuesStayPut) {
  for (double v : e4m3_values()) {
    EXPECT_EQ(round_to_e4m3(float(v)), float(v));
    EXPECT_EQ(round_to_e4m3(float(-v)), float(-v));
  }
  EXPECT_EQ(e4m3_values().back(), 448.0);
  EXPECT_EQ(e4m3_values()[1], std::ldexp(1.0, -9));
}

TEST(E4m3, RoundsToTheNearestAndTiesToTheEvenMantissa) {
  const std::vector<double> v = e4m3_values();
  for (std::size_t i = 0; i + 1 < v.size(); ++i) {
    const double lo = v[i], hi = v[i + 1], mid = (lo + hi) / 2;
    EXPECT_EQ(round_to_e4m3(float(lo + (hi - lo) * 0.3)), float(lo));
    EXPECT_EQ(round_to_e4m3(float(lo + (hi - lo) * 0.7)), float(hi));
    // Value i has mantissa bits i & 7 (bits enumerate in order): the even one takes the tie.
    EXPECT_EQ(round_to_e4m3(float(mid)), float((i & 1) == 0 ? lo : hi)) << "tie between " << lo << " and " << hi;
  }
  EXPECT_EQ(round_to_e4m3(1.0625f), 1.0f);   // between 1 (mantissa 000) and 1.125 (001)
  EXPECT_EQ(round_to_e4m3(1.1875f), 1.25f);  // between 1.125 (001) and 1.25 (010)
}

TEST(E4m3, SaturatesAndKeepsNan) {
  EXPECT_EQ(round_to_e4m3(460.0f), 448.0f);
  EXPECT_EQ(round_to_e4m3(1e9f), 448.0f);
  EXPECT_EQ(round_to_e4m3(-1e9f), -448.0f);
  EXPECT_EQ(round_to_e4m3(std::ldexp(1.0f, -11)), 0.0f);
  EXPECT_TRUE(std::isnan(round_to_e4m3(NAN)));
  const std::vector<float> q = quantize_e4m3({0.5f, 1000.0f, -0.3f}, 2.0f);
  EXPECT_EQ(q, (std::vector<float>{1.0f, 448.0f, -0.625f}));
}

}  // namespace
}  // namespace tedsim::kernels
