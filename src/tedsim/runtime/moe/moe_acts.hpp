#pragma once
// What an MoE layer keeps of one micro-batch from its forward to its backward.
#include <cstdint>
#include <memory>
#include <vector>

#include "tedsim/runtime/layers/mlp.hpp"
#include "tedsim/runtime/step_ops.hpp"

namespace tedsim::runtime {

struct MoeActs {
  Tensor logits;                     // the router's [Tr, E]
  std::unique_ptr<Routing> routing;  // made by the ops on first use, reused
  // The routed copies of the tokens at this rank's experts, expert-major ([rows of expert 0], ...),
  // and each local expert's row count.
  Tensor expert_in;
  std::vector<int> expert_rows;
  Tensor expert_fc1_out, expert_act_out;  // the experts' fc1 output and activation, same row order
  // The dispatch buffer [E][C][h] the routing fills, reused as the combine's input.
  Tensor dispatch_buf;
  int sources = 1;  // capacity mode: the ranks whose rows reach each local expert (e, or t x e)
  // Dropless: the busiest expert's count (the dispatch buffer's capacity), each expert's kept rows
  // [E], and the rows received for each local expert from each source rank [S][El].
  int dropless_capacity = 0;
  std::vector<std::int32_t> kept, received;
  MlpActs shared;  // the shared experts
};

}  // namespace tedsim::runtime
