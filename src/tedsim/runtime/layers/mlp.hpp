#pragma once
// A tensor-parallel MLP (Megatron's column-parallel fc1, the activation, row-parallel fc2 and the
// block's exit): the dense layers' MLP, and the shared experts of an MoE layer (all of them side
// by side as one wider MLP, as Megatron-Core's SharedExpertMLP runs them).
#include <string>

#include "tedsim/runtime/param_registrar.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

struct MlpActs {
  Tensor fc1_out, act_out;
};

// The names the step's trace gives the block's collectives.
struct MlpCollectiveNames {
  const char *gather, *allreduce, *scatter, *gather_bwd, *scatter_bwd;
};

class TensorParallelMlp {
 public:
  enum class Kind { dense, shared_experts };
  // Global tensors `tensor_id` (fc1: [h, width], two halves with SwiGLU) and `tensor_id + 1` (fc2).
  void register_params(ParamRegistrar& reg, const StepContext& c, Kind kind, const std::string& prefix, int tensor_id,
                       float stdv, float out_std);
  // in: the normed input [Tl, h]; out: the block's output [Tl, h].
  void forward(StepContext& c, const float* in, MlpActs& A, float* out);
  // gx = d(loss)/d(in) for g = d(loss)/d(out); `act_grad` and `fc1_grad` are scratch.
  void backward(StepContext& c, const float* in, const MlpActs& A, const float* g, float* gx, Tensor& act_grad,
                Tensor& fc1_grad);

 private:
  int fc1_ = -1, fc2_ = -1;
  int width_local_ = 0, fc1_local_ = 0;
  MlpCollectiveNames names_{};
};

}  // namespace tedsim::runtime
