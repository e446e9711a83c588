#include "tedsim/spec/attention_kernel.hpp"

#include "tedsim/core/error.hpp"

namespace tedsim {

AttentionKernel parse_attention_kernel(const std::string& text, const std::string& what) {
  if (text == "unfused") return AttentionKernel::unfused;
  if (text == "flash") return AttentionKernel::flash;
  throw InputError(what + ": expected unfused or flash, got '" + text + "'");
}

}  // namespace tedsim
