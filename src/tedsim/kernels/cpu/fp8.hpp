#pragma once
// FP8 E4M3 (OCP 8-bit floating point, the format Transformer Engine's forward GEMMs take) on the
// CPU: the reference rounding that the CUDA quantization and FP8 GEMM tests compare against, and
// that calibration uses to check an FP8 GEMM's result. 4 exponent bits (bias 7), 3 mantissa bits,
// no infinities; the largest finite value is 448, the smallest subnormal 2^-9.
#include <cstddef>
#include <vector>

namespace tedsim::kernels {

inline constexpr float kE4m3Max = 448.0f;

// x rounded to the nearest E4M3 value, ties to even, saturating at +-448 (cuda_fp8.h's
// __NV_SATFINITE); NaN stays NaN.
float round_to_e4m3(float x);

// Every element of x times scale, rounded as above (a quantized tensor's values, dequantized).
std::vector<float> quantize_e4m3(const std::vector<float>& x, float scale);

}  // namespace tedsim::kernels
