#pragma once
// The MoE router (Megatron-Core's TopKRouter; DeepSpeed's top-k gating for the TED paper's models):
// a replicated [h, E] gate, the routing of this rank's tokens (kernels/cpu/router.hpp, gating.hpp),
// the load-balancing aux loss (the tensor group's under sequence parallelism, as Megatron-Core's
// router computes it), and the routing signature that detects flips between configurations.
#include <string>

#include "tedsim/runtime/moe/moe_acts.hpp"
#include "tedsim/runtime/param_registrar.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

class Router {
 public:
  void register_params(ParamRegistrar& reg, const StepContext& c, const std::string& prefix, int tensor_id, float stdv);
  void forward(StepContext& c, const float* xn, MoeActs& A);
  // From the routing weights' gradient (the workspace's routing_weight_grad): the gate's gradient,
  // and the input's added into gxn.
  void backward(StepContext& c, const float* xn, MoeActs& A, float* gxn);

 private:
  void group_aux(StepContext& c, Routing& r);
  int gate_ = -1;
};

}  // namespace tedsim::runtime
