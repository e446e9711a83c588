#pragma once
// The validation config file of `tedsim validate --config FILE` (configs/validation-cpu/*.yaml):
// strict, every key required except seq, tiled_optimizer and the pipeline, recompute, sequence-
// parallel and routing keys; unknown keys rejected. Values apply unless the same option was given
// on the command line. Free of MPI, so the fuzz target reads it too.
#include <CLI/CLI.hpp>

#include "inputs.hpp"
#include "tedsim/core/yaml_reader.hpp"

namespace tedsim::cli {

// `app`: the validate command after parsing (what was given on the command line wins).
void apply_validation_config(const YamlMap& config, InputOptions& in, ConfigOptions& knobs, const CLI::App& app);

}  // namespace tedsim::cli
