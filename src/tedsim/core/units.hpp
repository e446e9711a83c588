#pragma once
// One spelling for units so a GiB is never 1e9 in one file and 2^30 in another.
#include <cstdint>
#include <string_view>

namespace tedsim {

inline constexpr double kKiB = 1024.0;
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kGB = 1e9;     // link and memory bandwidths are quoted in decimal GB/s
inline constexpr double kTera = 1e12;  // TFLOP/s
inline constexpr double kMicro = 1e-6;

// fp8 as a model's dtype means FP8 training as Transformer Engine runs it: GEMM inputs in FP8 (at the
// device's FP8 peak), activations, gradients and weights in bf16 beside FP32 master weights.
enum class Dtype : std::uint8_t { fp32, fp16, bf16, fp8 };
inline constexpr int kDtypeCount = 4;

inline constexpr int bytes_of(Dtype t) { return t == Dtype::fp32 ? 4 : t == Dtype::fp8 ? 1 : 2; }
// The precision of everything but GEMM inputs: activations, gradients, weights, messages.
inline constexpr Dtype storage_dtype(Dtype t) { return t == Dtype::fp8 ? Dtype::bf16 : t; }
const char* to_string(Dtype t);

// FP8 training's scaling recipe (Transformer Engine): one scale per tensor, computed from the
// tensor's current maximum (Hopper), or one per 32 values (MXFP8, Blackwell's block scaling).
enum class Fp8Recipe : std::uint8_t { tensor, mxfp8 };
Dtype parse_dtype(const std::string_view text);  // throws InputError

}  // namespace tedsim
