#pragma once
// What one micro-batch keeps on a stage from its forward to its backward.
#include <cstdint>
#include <vector>

#include "tedsim/runtime/layers/transformer_layer.hpp"

namespace tedsim::runtime {

struct MicroBatch {
  std::vector<std::int32_t> tokens, targets;  // host: the ops upload what they need
  std::vector<Tensor> inputs;                 // layer inputs (the checkpoints), L + 1 entries
  std::vector<LayerActs> acts;                // per layer without full recompute; one, reused, with it
  std::vector<std::vector<Tensor>> stash;     // CAC: per layer, the collective outputs of the first forward
  Tensor grad;                                // the gradient flowing backward through the stage [Tl, h]
  double aux = 0;                             // its MoE layers' aux loss on this stage

  MicroBatch(int layers, bool full_recompute)
      : inputs(layers + 1), acts(full_recompute ? 1 : layers), stash(layers) {}
  LayerActs& acts_of(int layer) { return acts.size() == 1 ? acts[0] : acts[layer]; }
};

}  // namespace tedsim::runtime
