// Megatron-Core pipeline layout strings (--pipeline-layout): the parser and the stage map.
#include "fuzz_common.hpp"
#include "tedsim/spec/pipeline_layout.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tedsim;
  if (size < 3) return 0;
  // The first bytes pick the layers, degrees and multi-token-prediction modules; the rest is the
  // layout string.
  const int layers = 1 + data[0] % 96, pp = 1 + data[1] % 8, vpp = 1 + data[2] % 4, mtp = (data[2] >> 2) % 3;
  const std::string layout = fuzz::text_of(data + 3, size - 3);
  fuzz::expect_only_input_errors([&] {
    if (pipeline_layout_violation(layout, layers, pp, vpp, mtp).empty()) {
      const StageMap map = build_stage_map(layers, pp, vpp, layout, mtp);
      if (!map.chunks.back().head || map.chunks.back().mtp_layers != mtp) __builtin_trap();  // they sit with the loss
    }
  });
  return 0;
}
