#pragma once
// Moves routed tokens to the ranks that hold their experts and back (Megatron-Core's
// MoETokenDispatcher). Two kinds: the capacity dispatcher of the TED paper (fixed [E][C][h]
// buffers, all-to-all, duplicate token dropping; capacity_dispatcher.cpp) and the dropless one
// (every token reaches its k experts over all-to-all-v; dropless_dispatcher.cpp). Both leave the
// local experts' rows expert-major in MoeActs::expert_in, and own the expert-TP reduction of the
// experts' output.
#include <memory>

#include "tedsim/runtime/moe/moe_acts.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // Forward: the routed copies of the normed tokens `xn` into A.expert_in, with A.expert_rows.
  virtual void dispatch(StepContext& c, const float* xn, MoeActs& A) = 0;
  // Forward: the experts' output rows back to their tokens, weighted by the routing and summed into out.
  virtual void combine(StepContext& c, MoeActs& A, float* expert_out, float* out) = 0;
  // Backward of combine: the output gradient g [Tr, h] to the experts' rows (returned, in the
  // workspace's wide1), and the routing weights' gradient into the workspace's routing_weight_grad.
  virtual float* combine_backward(StepContext& c, MoeActs& A, const float* g) = 0;
  // Backward of dispatch: the experts' input gradients back to the tokens, written into gxn.
  virtual void dispatch_backward(StepContext& c, MoeActs& A, float* expert_in_grad, float* gxn) = 0;
};

std::unique_ptr<TokenDispatcher> make_capacity_dispatcher();
std::unique_ptr<TokenDispatcher> make_dropless_dispatcher();

}  // namespace tedsim::runtime
