#pragma once
// Causal self-attention with Megatron tensor parallelism: a column-parallel qkv projection (this
// rank's query heads and key/value heads; RoPE on the query and key heads where the model has it),
// the attention core per head, a row-parallel output projection and the block's exit (all-reduce,
// or reduce-scatter under sequence parallelism).
// Selective recompute of the core keeps q, k, v and recomputes the softmax in backward.
#include <string>

#include "tedsim/runtime/layers/norm.hpp"
#include "tedsim/runtime/param_registrar.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

struct AttentionActs {
  Tensor q, k, v;     // head-major
  Tensor probs;       // the softmax, [b x heads, s, s] (released under selective recompute)
  Tensor ctx_heads;   // attention output, head-major
  Tensor ctx;         // the same in token rows [T, q_width]; qkv's output before that
  Tensor q_in, k_in;  // Qwen3's q/k norm: the queries and keys before it, head rows [T x heads, head_dim]
  NormActs q_norm, k_norm;
};

class SelfAttention {
 public:
  // Global tensors `tensor_id` (qkv) and `tensor_id + 1` (output projection); a per-head q/k
  // norm's gains (and biases) `tensor_id` + 40..43.
  void register_params(ParamRegistrar& reg, const StepContext& c, const std::string& prefix, int tensor_id, float stdv,
                       float out_std, float norm_noise = 0);
  // xn: the normed layer input [Tl, h]; y: the block's output [Tl, h].
  void forward(StepContext& c, const float* xn, AttentionActs& A, float* y);
  // g: d(loss)/dy [Tl, h]. Returns d(loss)/d(xn) [Tl, h] (in the workspace's hidden_grad).
  float* backward(StepContext& c, const float* xn, AttentionActs& A, const float* g);

 private:
  // Qwen3's norms of each query and key head (model.qk_norm head), in the qkv rows, in place; and
  // their gradients back through them.
  void qk_norm_forward(StepContext& c, float* qkv, AttentionActs& A);
  void qk_norm_backward(StepContext& c, float* grad_qkv, AttentionActs& A);
  int qkv_ = -1, out_ = -1;
  bool qk_norm_ = false;
  NormLayer q_norm_, k_norm_;
};

}  // namespace tedsim::runtime
