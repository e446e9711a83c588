#pragma once
// An MoE block (Megatron-Core's MoELayer): the router, the token dispatcher of the model's routing
// (capacity or dropless), the local routed experts, and the shared experts beside them, whose
// output is added to the routed experts'.
#include <memory>
#include <string>

#include "tedsim/runtime/layers/mlp.hpp"
#include "tedsim/runtime/moe/experts.hpp"
#include "tedsim/runtime/moe/router.hpp"
#include "tedsim/runtime/moe/token_dispatcher.hpp"

namespace tedsim::runtime {

class MoeLayer {
 public:
  explicit MoeLayer(const StepContext& c);
  // Global tensors tensor_id (gate), + 1, + 2 (experts), + 3, + 4 (shared experts).
  void register_params(ParamRegistrar& reg, const StepContext& c, int expert_rank, const std::string& prefix,
                       int tensor_id, float stdv, float out_std, float gate_std);
  // xn: the normed input [Tl, h]; out: the block's output [Tl, h].
  void forward(StepContext& c, const float* xn, MoeActs& A, float* out);
  // gxn = d(loss)/d(xn) for g = d(loss)/d(out).
  void backward(StepContext& c, const float* xn, MoeActs& A, const float* g, float* gxn);

 private:
  Router router_;
  std::unique_ptr<TokenDispatcher> dispatcher_;
  GroupedExperts experts_;
  bool has_shared_ = false;
  TensorParallelMlp shared_;
};

}  // namespace tedsim::runtime
