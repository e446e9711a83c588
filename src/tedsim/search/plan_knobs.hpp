#pragma once
// The on/off choices a plan makes, for explaining why the best plan wins: for each choice it turned
// on, the search also keeps the best plan with that choice off.
#include <array>

#include "tedsim/spec/parallel_config.hpp"

namespace tedsim {

enum class Knob : int {
  pipeline,           // P > 1
  interleaving,       // V > 1
  sequence_parallel,
  dtd,                // with t > 1 and no SP: where it changes something
  cac,
  full_recompute,
  selective_recompute,
  sharded_optimizer,  // ZeRO >= 1
  zero3,
  expert_tp,          // with t > 1
  tiled_optimizer,
  data_before_expert,
  a2a_overlap,        // Megatron-Core's expert all-to-all overlap
  context_parallel,   // cp > 1
  folding,            // Megatron-Core's MoE parallel folding (RankLayout::folded)
  count
};
inline constexpr int kKnobCount = int(Knob::count);

const char* knob_name(Knob k);  // "pipeline stages", "DTD", ...
// Whether `c` turns `k` on. DTD at t = 1 or under SP, and expert TP at t = 1, change nothing: off;
// so are the knobs of experts (DTD, expert TP, the tiled expert optimizer) on a dense model.
bool knob_on(const ParallelConfig& c, Knob k, bool moe_model);

}  // namespace tedsim
