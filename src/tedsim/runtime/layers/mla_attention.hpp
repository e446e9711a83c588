#pragma once
// Multi-head latent attention (DeepSeek-V2/V3, Megatron-Core's MLASelfAttention) with Megatron
// tensor parallelism. Queries: x -> q latent (q_lora) -> norm -> per-head queries, or x -> queries
// directly (q_lora 0). Keys and values: x -> [kv latent | rope key] -> the latent's norm -> per-head
// no-position keys and values; the rope key is one per token, shared by every head. RoPE turns each
// query head's rope part and the rope key. The down projections and latent norms are replicated
// on every tensor rank, the up projections split over heads (column-parallel), the output
// projection row-parallel. A replicated weight's gradient on one tensor rank covers its own heads
// only; the step sums them over the group (ParamInfo::tp_partial_grad), where Megatron-Core
// all-reduces the latents' gradients inside the layer: the same sum, and the input's gradient
// leaves through the block's usual all-reduce, as the cost model prices it.
#include <string>

#include "tedsim/runtime/layers/norm.hpp"
#include "tedsim/runtime/param_registrar.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

struct MlaActs {
  Tensor cq, cqn;     // q latent and its norm [T, q_lora] (q_lora > 0)
  NormActs q_norm, kv_norm;
  Tensor ckv;         // [T, kv_lora + qk_rope]: the kv latent, then the rope key (turned in place)
  Tensor c, cn;       // the kv latent alone and its norm [T, kv_lora]
  Tensor q;           // queries [T, heads x (qk_nope + qk_rope)], rope parts turned
  Tensor kv;          // [T, heads x (qk_nope + v_head)]: each head's no-position key, then its value
  Tensor qh, kh, vh;  // head-major [b x heads, s, qk | qk | v]
  Tensor probs;       // the softmax (released under selective recompute)
  Tensor ctx_heads;   // [b x heads, s, v_head]
  Tensor ctx;         // [T, heads x v_head]
};

class MlaAttention {
 public:
  // Global tensors `tensor_id` .. `tensor_id` + 8.
  void register_params(ParamRegistrar& reg, const StepContext& c, const std::string& prefix, int tensor_id, float stdv,
                       float out_std, float norm_noise);
  // xn: the normed layer input [Tl, h]; y: the block's output [Tl, h].
  void forward(StepContext& c, const float* xn, MlaActs& A, float* y);
  // g: d(loss)/dy [Tl, h]. Returns d(loss)/d(xn) [Tl, h] (in the workspace's hidden_grad).
  float* backward(StepContext& c, const float* xn, MlaActs& A, const float* g);

 private:
  // Head-major q, k, v out of the token rows, and the token-row gradients back from head-major ones.
  void split_heads(StepContext& c, MlaActs& A);
  void merge_head_grads(StepContext& c, const float* gqh, const float* gkh, const float* gvh, float* gq, float* gkv,
                        float* gkpe, float* scratch);
  int q_down_ = -1, q_up_ = -1, q_proj_ = -1, kv_down_ = -1, kv_up_ = -1, out_ = -1;
  NormLayer q_norm_, kv_norm_;
};

}  // namespace tedsim::runtime
