#pragma once
// Launch files for a plan, so nobody types its degrees by hand: Megatron-LM / Megatron-Core's
// pretrain_gpt.py arguments, or DeepSpeed's ds_config.json with the Megatron-DeepSpeed arguments.
// Every name is one the pinned upstream parser knows (tests/data/, checked by a test); a tedsim
// knob with no upstream counterpart (CAC, DTD, the data-before-expert layout, the tiled optimizer)
// is said in a comment, never invented as a flag.
#include <string>

#include "tedsim/search/evaluator.hpp"

namespace tedsim {

// A bash array MEGATRON_ARGS=(...) with comments, for `torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}"`.
std::string megatron_launch(const ModelSpec& model, const TopologySpec& topology, const Prediction& plan);
// ds_config.json for DeepSpeed.
std::string deepspeed_config(const ModelSpec& model, const Prediction& plan);
// A bash array MEGATRON_DEEPSPEED_ARGS=(...) for Megatron-DeepSpeed's pretrain_gpt.py, pointing at
// `ds_config_path`.
std::string megatron_deepspeed_launch(const ModelSpec& model, const TopologySpec& topology, const Prediction& plan,
                                      const std::string& ds_config_path);

}  // namespace tedsim
