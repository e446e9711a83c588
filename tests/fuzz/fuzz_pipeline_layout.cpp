// Megatron-Core pipeline layout strings (--pipeline-layout): the parser and the stage map.
#include "fuzz_common.hpp"
#include "tedsim/spec/pipeline_layout.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tedsim;
  if (size < 3) return 0;
  // The first bytes pick the layers and degrees; the rest is the layout string.
  const int layers = 1 + data[0] % 96, pp = 1 + data[1] % 8, vpp = 1 + data[2] % 4;
  const std::string layout = fuzz::text_of(data + 3, size - 3);
  fuzz::expect_only_input_errors([&] {
    if (pipeline_layout_violation(layout, layers, pp, vpp).empty()) build_stage_map(layers, pp, vpp, layout);
  });
  return 0;
}
