// Hugging Face config.json import: the reader, then model show's summary.
#include "fuzz_common.hpp"
#include "tedsim/model/model_summary.hpp"
#include "tedsim/spec/hf_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tedsim;
  fuzz::expect_only_input_errors([&] {
    const HfImport imported = import_hf_config_text(fuzz::text_of(data, size), "config.json");
    summarize_model(imported.model, imported.model.seq_len);
    imported.model.layer_pattern();
  });
  return 0;
}
