// Validation config YAML (configs/validation-cpu/*.yaml, `validate --config`): the strict reader,
// then, for the shipped small models and CPU topologies only (an input must not make the target
// read files it names), the configuration it resolves to and that configuration's checks.
#include <CLI/CLI.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "inputs.hpp"
#include "tedsim/spec/parallel_config.hpp"
#include "validation_config.hpp"

namespace {

// The shipped model and topology, loaded once per distinct set of input options: loading is not
// what this target fuzzes, and re-reading the files would cost most of each execution.
const tedsim::cli::Inputs& inputs_for(const tedsim::cli::InputOptions& in) {
  static std::map<std::string, tedsim::cli::Inputs> cache;
  const std::string key = in.model + "|" + in.topology + "|" + std::to_string(in.experts.value_or(-1)) + "|" +
                          std::to_string(in.capacity_factor.value_or(-1)) + "|" + std::to_string(in.imbalance.value_or(-1)) +
                          "|" + in.dtype + "|" + std::to_string(in.gpus) + "|" + std::to_string(in.global_batch) + "|" +
                          std::to_string(in.seq_len);
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() > 256) cache.clear();
    it = cache.emplace(key, tedsim::cli::load_inputs(in)).first;
  }
  return it->second;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tedsim;
  static const std::set<std::string> models{"tiny-moe", "cpu-moe", "cpu-moe-fine", "tiny-dense"};
  static const std::set<std::string> topologies{"local-cpu"};
  // One app for the whole run, its options reset between inputs (building it costs more than
  // reading a config).
  static cli::InputOptions in;
  static cli::ConfigOptions knobs;
  static CLI::App& app = [] () -> CLI::App& {
    static CLI::App a("validate");
    cli::add_input_options(a, in);
    cli::add_config_options(a, knobs);
    return a;
  }();
  fuzz::expect_only_input_errors([&] {
    in = cli::InputOptions{};
    in.model = "tiny-moe";
    in.topology = "local-cpu";
    in.global_batch = 8;
    knobs = cli::ConfigOptions{};
    app.clear();
    std::vector<std::string> no_arguments;
    app.parse(no_arguments);
    const YamlMap config = YamlMap::from_string(fuzz::text_of(data, size), "fuzz-validation.yaml");
    cli::apply_validation_config(config, in, knobs, app);
    if (!models.count(in.model) || !topologies.count(in.topology) || !in.profile.empty()) return;
    if (in.gpus <= 0 || in.gpus > 64 || in.global_batch <= 0 || in.global_batch > 4096 || in.seq_len > 4096) return;
    const cli::Inputs& loaded = inputs_for(in);
    const ParallelConfig c = cli::resolve_config(knobs, in, loaded.model);
    (void)config_is_valid(c, loaded.model);
  });
  return 0;
}
