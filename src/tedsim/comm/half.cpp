#include "tedsim/comm/half.hpp"

#include <cmath>
#include <cstring>

namespace tedsim {

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: value = mant * 2^-24, exact in float.
    const float v = std::ldexp(float(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31)
    bits = sign | 0x7f800000u | (mant << 13);  // infinity or NaN (payload kept)
  else
    bits = sign | ((exp + 112u) << 23) | (mant << 13);  // rebias 15 -> 127
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint16_t sign = std::uint16_t((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds past the largest half
  if (abs < 0x38800000u) {                          // below 2^-14: half subnormal or zero
    if (abs < 0x33000000u) return sign;             // below 2^-25: rounds to zero
    const std::uint32_t exp = abs >> 23;
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;  // units of 2^-24
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return std::uint16_t(sign | h);
  }
  std::uint32_t h = (abs >> 13) - (112u << 10);  // rebias 127 -> 15
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return std::uint16_t(sign | h);
}

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return std::uint16_t(x >> 16);
}

float load_as_float(const void* data, std::int64_t i, Dtype dtype) {
  if (dtype == Dtype::fp32) return static_cast<const float*>(data)[i];
  const std::uint16_t w = static_cast<const std::uint16_t*>(data)[i];
  return dtype == Dtype::fp16 ? half_to_float(w) : bf16_to_float(w);
}

void store_from_float(void* data, std::int64_t i, Dtype dtype, float value) {
  if (dtype == Dtype::fp32) {
    static_cast<float*>(data)[i] = value;
    return;
  }
  static_cast<std::uint16_t*>(data)[i] =
      dtype == Dtype::fp16 ? float_to_half(value) : float_to_bf16(value);
}

}  // namespace tedsim
