#pragma once
// bfloat16 on the CPU: the reference rounding the CUDA step's GEMM operands are checked against.
// bf16 is fp32's top 16 bits (8 exponent bits, 7 mantissa bits), so a value rounds by adding half
// of the dropped 16 bits, with ties to even, and clearing them; NaN stays a (quiet) NaN.
#include <cstdint>
#include <cstring>

namespace tedsim::kernels {

inline float round_to_bf16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    bits |= 0x00400000u;  // NaN: keep it a NaN after the low bits go
  } else {
    bits += 0x7fffu + ((bits >> 16) & 1u);  // nearest, ties to even; overflow carries into infinity
  }
  bits &= 0xffff0000u;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace tedsim::kernels
