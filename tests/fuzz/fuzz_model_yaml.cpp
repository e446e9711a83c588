// Model YAML (models/*.yaml): the loader, then what simulate does with a small enough model.
#include "fuzz_common.hpp"
#include "tedsim/model/model_summary.hpp"
#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/search/evaluator.hpp"
#include "tedsim/spec/data_files.hpp"
#include "tedsim/spec/model_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tedsim;
  static const TopologySpec topology = load_topology(resolve_data_file("topologies", "dgx-h100"));
  static const AnalyticProfile profile(topology);
  fuzz::expect_only_input_errors([&] {
    const ModelSpec m = model_from_yaml_text(fuzz::text_of(data, size), "fuzz.yaml");
    summarize_model(m, m.seq_len);
    // A one-rank prediction for models the cost model can price in microseconds.
    if (m.layers <= 64 && m.hidden <= 16384 && m.seq_len <= 8192 && m.moe.experts <= 256 && m.vocab <= 1 << 18) {
      ParallelConfig c;
      c.gpus = 1;
      c.global_batch = 1;
      if (config_is_valid(c, m)) Evaluator(m, topology, profile).evaluate(c);
    }
  });
  return 0;
}
