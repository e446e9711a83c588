// round_to_bf16, the reference the CUDA step's GEMM operand copies are checked against: exact on
// values bf16 holds, nearest otherwise, ties to the even mantissa, infinities and NaN kept.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "tedsim/kernels/cpu/bf16.hpp"

namespace tedsim::kernels {
namespace {

float from_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

TEST(Bf16, RepresentableValuesStayPut) {
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 0.0078125f, 3.0e38f, std::ldexp(1.0f, -133)}) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    const float held = from_bits(bits & 0xffff0000u);  // the value's own bf16 truncation
    EXPECT_EQ(round_to_bf16(held), held) << v;
  }
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_to_bf16(-1.5f), -1.5f);
}

TEST(Bf16, RoundsToTheNearestAndTiesToTheEvenMantissa) {
  // Around 1: bf16 steps by 2^-7. 1 + 2^-8 is the tie between 1 (even) and 1 + 2^-7 (odd).
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(3.0f, -8)), 1.0f + std::ldexp(1.0f, -6));  // tie, odd below
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -9)), 1.0f);
  EXPECT_EQ(round_to_bf16(-(1.0f + std::ldexp(3.0f, -9))), -(1.0f + std::ldexp(1.0f, -7)));
  // Every result is a bf16 (low 16 bits clear) within half a step of the input.
  for (float x = -7.3f; x < 7.3f; x += 0.00931f) {
    const float r = round_to_bf16(x);
    std::uint32_t bits;
    std::memcpy(&bits, &r, sizeof bits);
    EXPECT_EQ(bits & 0xffffu, 0u) << x;
    const float step = std::ldexp(1.0f, std::ilogb(x == 0.0f ? 1.0f : x) - 7);
    EXPECT_LE(std::abs(r - x), step / 2) << x;
  }
}

TEST(Bf16, OverflowsToInfinityAndKeepsNan) {
  const float max = std::numeric_limits<float>::max();
  EXPECT_TRUE(std::isinf(round_to_bf16(max)));  // above bf16's largest finite value by more than half a step
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_bf16(-std::numeric_limits<float>::infinity()), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(round_to_bf16(from_bits(0x7f800001u))));  // a NaN whose payload is all low bits
}

}  // namespace
}  // namespace tedsim::kernels
