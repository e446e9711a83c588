#pragma once
// fp16 and bf16 carried as 16-bit words on the CPU. MPI has no half types, so the MPI backend sums
// them through these conversions (each partial sum rounded back to 16 bits, as NCCL does), and the
// collective checker uses them to build inputs and expected results.
#include <cstdint>

#include "tedsim/core/units.hpp"

namespace tedsim {

float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);  // round to nearest even; overflow gives infinity
float bf16_to_float(std::uint16_t b);
std::uint16_t float_to_bf16(float f);  // round to nearest even; NaN stays NaN

// Element `i` of a buffer of `dtype` as a float, and the reverse (fp32 stored as float).
float load_as_float(const void* data, std::int64_t i, Dtype dtype);
void store_from_float(void* data, std::int64_t i, Dtype dtype, float value);

}  // namespace tedsim
