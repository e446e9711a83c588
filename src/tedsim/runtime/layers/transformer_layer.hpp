#pragma once
// One pre-norm decoder layer (Megatron-Core's TransformerLayer): x1 = x + attention(norm1(x)),
// out = x1 + mlp(norm2(x1)), with a dense MLP or an MoE block by the model's layer pattern.
#include <memory>
#include <string>

#include "tedsim/runtime/layers/attention.hpp"
#include "tedsim/runtime/layers/mla_attention.hpp"
#include "tedsim/runtime/layers/mlp.hpp"
#include "tedsim/runtime/layers/norm.hpp"
#include "tedsim/runtime/moe/moe_layer.hpp"

namespace tedsim::runtime {

// What a layer keeps of one micro-batch from its forward to its backward.
struct LayerActs {
  Tensor xn1, x1, xn2;  // the first norm's output, the residual after attention, the second norm's output
  NormActs norm1, norm2;
  AttentionActs attention;
  MlaActs mla;  // MLA models' attention instead
  MlpActs mlp;
  MoeActs moe;
};

struct InitScales {
  float stdv = 0.02f;      // weights
  float out_std = 0.02f;   // the projections into the residual stream (std / sqrt(2 L))
  float gate_std = 0.02f;  // the router
  float norm_noise = 0;    // > 0: randomized norm gains and biases
};

class TransformerLayer {
 public:
  TransformerLayer(const StepContext& c, int index) : TransformerLayer(c, index, index, "layer" + std::to_string(index)) {}
  // A layer of model layer `shape_of`'s kind (dense or MoE) whose parameters `index` and `name`
  // identify: a multi-token-prediction module's (mtp.hpp), index L + 1 + its depth.
  TransformerLayer(const StepContext& c, int index, int shape_of, std::string name);
  // Its parameters as global tensors 100 (index + 1) + 0..20 (MLA's attention: + 50..58), in ZeRO-3 unit index + 1.
  void register_params(ParamRegistrar& reg, const StepContext& c, int expert_rank, const InitScales& init);
  void forward(StepContext& c, const float* x, LayerActs& A, float* out);
  // g: d(loss)/d(out) on entry, d(loss)/dx on exit.
  void backward(StepContext& c, const float* x, LayerActs& A, float* g);

 private:
  int index_;
  std::string name_;
  NormLayer norm1_, norm2_;
  SelfAttention attention_;
  MlaAttention mla_;  // MLA models (StepDims::mla) run this instead of attention_
  TensorParallelMlp mlp_;
  std::unique_ptr<MoeLayer> moe_;  // an MoE layer's block instead of the MLP
};

}  // namespace tedsim::runtime
