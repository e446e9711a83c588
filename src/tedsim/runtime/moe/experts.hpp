#pragma once
// The routed experts on this rank (Megatron-Core's GroupedMLP): each local expert an MLP of the
// expert width (its share with expert tensor parallelism) over however many rows reached it,
// stored one expert after another. The expert-TP reduction is the dispatcher's (it combines).
#include <string>

#include "tedsim/runtime/moe/moe_acts.hpp"
#include "tedsim/runtime/param_registrar.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

class GroupedExperts {
 public:
  // Global tensors `tensor_id` (fc1 [E, h, width]) and `tensor_id + 1` (fc2 [E, width, h]):
  // this rank's experts, and with expert TP its share of their width.
  void register_params(ParamRegistrar& reg, const StepContext& c, int expert_rank, const std::string& prefix,
                       int tensor_id, float stdv, float out_std);
  // On A.expert_in (A.expert_rows per expert): the outputs, same row order (the workspace's wide1).
  float* forward(StepContext& c, MoeActs& A);
  // From the outputs' gradient: the inputs' gradient (the workspace's wide2); weight gradients accumulate.
  float* backward(StepContext& c, const MoeActs& A, const float* gout);

 private:
  int fc1_ = -1, fc2_ = -1;
};

}  // namespace tedsim::runtime
