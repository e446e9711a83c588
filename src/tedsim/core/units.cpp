#include "tedsim/core/units.hpp"

#include <string>

#include "tedsim/core/error.hpp"

namespace tedsim {

const char* to_string(Dtype t) {
  switch (t) {
    case Dtype::fp32: return "fp32";
    case Dtype::fp16: return "fp16";
    case Dtype::bf16: return "bf16";
    case Dtype::fp8: return "fp8";
  }
  return "?";
}

Dtype parse_dtype(std::string_view text) {
  if (text == "fp32") return Dtype::fp32;
  if (text == "fp16") return Dtype::fp16;
  if (text == "bf16") return Dtype::bf16;
  if (text == "fp8") return Dtype::fp8;
  throw InputError("unknown dtype '" + std::string(text) + "' (expected fp32, fp16, bf16 or fp8)");
}

}  // namespace tedsim
