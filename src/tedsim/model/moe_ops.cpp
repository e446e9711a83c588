// The MoE block of a layer: router, dispatch, the local experts (grouped or fused), shared experts
// beside them, combine (layer_ops.hpp's moe_forward).
#include <algorithm>

#include "tedsim/model/layer_ops.hpp"
#include "tedsim/model/layer_parts.hpp"

namespace tedsim {

namespace {

// The shared experts: a dense MLP of all shared experts' width on the layer's tokens, split over
// the tensor group like the dense MLP (its own SP gather / reduce-scatter or TP all-reduce).
void shared_experts_forward(BlockBuilder& x, const LayerDims& d, const ModelSpec& m) {
  x.set_module(kRecomputeSharedExperts | kRecomputeMoe);
  if (d.sp) x.collective("sp_allgather_shared", CollectiveOp::all_gather, GroupKind::tensor, double(d.T) * d.h * d.B, Phase::tp_allgather);
  x.gemm("shared_fc1", d.T, d.fc1_factor * d.shared_local, d.h);
  x.kernel("shared_activation", KernelKind::activation, double(d.fc1_factor + 1) * d.T * d.shared_local * d.B);
  x.gemm("shared_fc2", d.T, d.h, d.shared_local);
  if (m.moe.shared_gate) {
    // Qwen2-MoE: sigmoid(x w) with w [h, 1] scales the shared output.
    x.gemm("shared_gate", d.T, 1, d.h);
    x.kernel("shared_gate_scale", KernelKind::elementwise, 3.0 * d.T * d.h * d.B);
  }
  if (d.sp)
    x.collective("sp_reducescatter_shared", CollectiveOp::reduce_scatter, GroupKind::tensor, double(d.T) * d.h * d.B, Phase::tp_allreduce);
  else
    x.collective("tp_allreduce_shared", CollectiveOp::all_reduce, GroupKind::tensor, double(d.T) * d.h * d.B, Phase::tp_allreduce);
  x.set_module(kRecomputeMoe);
}

// The experts' second bias, as Megatron-Core's TEGroupedMLP adds it (experts.py:250-268 at 2edffadb):
// the grouped linear returns fc2's bias apart, and a Python loop over the local experts adds
// bias x probability to each expert's rows, in fp32 (a bf16 bias times fp32 probabilities), then
// concatenates and casts back. Bytes per element of the output, B its width: forward, the product
// written (4), the sum read and written (B + 4 + 4), the concatenation (4 + 4), the cast (4 + B);
// backward, the cast's and the sum's casts (4 + B each) and the bias's and the probabilities'
// gradients, each a product and a reduction (12 each). Calls: two kernels per expert and two
// after; backward five per expert and one. (fc1's bias is fused into the activation.)
void expert_fc2_bias(BlockBuilder& x, const LayerDims& d, double rows, std::int64_t experts) {
  const double elements = rows * double(d.h), E = double(experts);
  x.kernel("expert_fc2_bias", KernelKind::elementwise, elements * (24.0 + 2.0 * d.B));
  x.host_calls_of_last(2.0 * E + 2.0);
  x.backward_of_last(elements * (32.0 + 2.0 * d.B), 5.0 * E + 1.0);
}

// Router arithmetic per token, in bytes moved: the logits' scores (softmax or sigmoid) over all
// experts, the top-k selection, and the k weights; group-limited routing adds a pass over the
// scores to rank the groups.
double gating_bytes(const ModelSpec& m, std::int64_t tokens) {
  const double E = m.moe.experts, k = m.moe.top_k;
  const double passes = 1.0 + (m.moe.group_limited() ? 1.0 : 0.0);
  return double(tokens) * (E * 4.0 * passes + k * 12.0);
}

}  // namespace

void moe_forward(BlockBuilder& x, const LayerDims& d, const StepShape& s, const ModelSpec& m, const ParallelConfig& c) {
  const double E = m.moe.experts, h = double(d.h), B = d.B;
  // The router's tokens: this rank's s/t with sequence parallelism, else all T (every tensor rank
  // runs the gate on the same tokens, as DeepSpeed does).
  const std::int64_t router_tokens = d.sp ? d.T_local : d.T;
  const double slots = E * double(s.capacity);
  const double kept = std::min(double(m.moe.top_k) * double(router_tokens), slots);
  const bool dtd_split = c.dtd && s.t > 1 && !d.sp;
  x.set_graph_scope(kGraphMoeRouter);
  pre_mlp_layernorm(x, d);
  x.set_module(kRecomputeMoe);
  x.core_gemm("gate", router_tokens, m.moe.experts, d.h, 1);
  x.kernel("gating", KernelKind::gating, gating_bytes(m, router_tokens));
  x.host_calls_of_last(m.moe.router == Router::sigmoid ? kSigmoidRouterCalls : kSoftmaxRouterCalls);
  // The dispatcher's metadata (tokens per expert and rank, split sizes) from the routing map, read
  // back to the host, which waits for it (host_launch.hpp).
  const bool flex = c.moe_dispatcher == MoeDispatcher::flex;
  x.set_graph_scope(kGraphMoePreprocess);
  x.kernel("moe_preprocess", KernelKind::gating, double(router_tokens) * E);
  x.host_calls_of_last(flex ? kFlexPreprocessCalls : kAlltoallPreprocessCalls, /*sync=*/true, /*forward_only=*/true);
  x.set_graph_scope(0);
  const int shared_first = x.size();
  if (d.shared_local > 0) shared_experts_forward(x, d, m);
  const double shared_seconds = x.seconds_since(shared_first);
  x.kernel("dispatch", KernelKind::dispatch, (kept + slots) * h * B);
  if (!flex) x.host_calls_of_last(kAlltoallPermuteCalls);
  const double a2a_bytes = E * double(s.capacity_a2a) * h * B;
  // DTD: each tensor rank sends its 1/t slice of every expert's capacity (copied out of the
  // dispatch buffer), and the combine's gather is copied back into place.
  if (dtd_split) x.kernel("dtd_slice", KernelKind::elementwise, 2.0 * a2a_bytes);
  // FP8 training still dispatches bf16 tokens: Megatron-Core's dispatchers (alltoall, and the flex
  // one over DeepEP or HybridEP) have no FP8 path, and HybridEP asserts it off (Megatron-LM
  // 2edffadb, megatron/core/transformer/moe/fused_a2a.py); the experts' grouped linear quantizes
  // the tokens after the permutation. DeepEP's own FP8 dispatch is not what these runs use.
  const int dispatch_a2a = x.expert_all_to_all_at("ep_alltoall_dispatch", c.moe_dispatcher, m.moe, a2a_bytes);
  if (dispatch_a2a >= 0 && !flex) x.host_calls_at(dispatch_a2a, kAlltoallDispatchCalls);
  // The tokens every tensor rank's experts see: all t ranks' after the gather.
  const double gathered_slots = d.sp ? double(s.t) * slots : slots;
  if (c.expert_tp && (dtd_split || d.sp))
    x.collective(d.sp ? "sp_allgather_expert" : "dtd_allgather_dispatch", CollectiveOp::all_gather, GroupKind::tensor,
                 gathered_slots * h * B, Phase::tp_allgather);
  // The local experts run as one grouped GEMM (batch = local experts) of the busiest rank's rows.
  const std::int64_t rows = s.expert_rows;
  // Received tokens arrive source-rank-major (every expert rank's, and with DTD or SP every tensor
  // rank's after the gather); several local experts need them expert-major (Megatron-Core's
  // sort_chunks_by_idxs after the dispatch, and back before the combine).
  const int sources = s.e * (c.expert_tp && (dtd_split || d.sp) ? s.t : 1);  // ranks whose tokens arrive
  const bool regroup = sources > 1 && s.local_experts > 1;
  const double received_bytes = double(rows) * s.local_experts * h * B;
  if (regroup) {
    x.kernel("expert_major_layout", KernelKind::elementwise, 2.0 * received_bytes);
    x.host_calls_of_last(kChunkSortCalls);
  }
  const std::int64_t fc1_out = d.fc1_factor * s.ffn_local;
  if (c.fused_grouped_mlp) {
    x.fused_grouped_mlp(rows, fc1_out, d.h, s.ffn_local, s.local_experts);
  } else {
    x.grouped_gemm("expert_fc1", rows, fc1_out, d.h, s.local_experts);
    x.set_module(kRecomputeMoe | kRecomputeMoeAct);
    if (m.activation_clamp > 0 && d.fc1_factor == 2) {
      // gpt-oss's clamp, outside Megatron-Core's fused bias-GLU: each half of fc1's output
      // clamped (read and written), then concatenated (read and written again): 4 passes of it.
      // Backward: each clamp's gradient reads the gradient and its saved input and writes (3
      // halves), and the halves' gradients are concatenated (2): 5. Calls: two clamps, the cat and
      // the linear offset's tensor forward; two clamp gradients (mask and select each) and the cat.
      const double fc1_bytes = double(rows) * s.local_experts * double(fc1_out) * B;
      x.kernel("expert_act_clamp", KernelKind::elementwise, 4.0 * fc1_bytes);
      x.backward_of_last(5.0 * fc1_bytes, kClampBackwardCalls);
      x.host_calls_of_last(kClampForwardCalls);
    }
    x.kernel("expert_activation", KernelKind::activation,
             double(d.fc1_factor + 1) * double(rows) * s.local_experts * s.ffn_local * B);
    x.set_module(kRecomputeMoe);
    x.grouped_gemm("expert_fc2", rows, d.h, s.ffn_local, s.local_experts);
  }
  // The fused grouped MLP adds the biases inside its own kernels (Transformer Engine's grouped ops),
  // not in Megatron-Core's per-expert loop.
  if (m.linear_bias && !c.moe_weights_at_combine && !c.fused_grouped_mlp)
    expert_fc2_bias(x, d, double(rows) * s.local_experts, s.local_experts);
  if (c.expert_tp) {
    const double out_bytes = double(rows) * s.local_experts * h * B;
    if (d.sp)
      x.collective("sp_reducescatter_expert", CollectiveOp::reduce_scatter, GroupKind::tensor, out_bytes, Phase::tp_allreduce);
    else
      x.collective("tp_allreduce_expert", CollectiveOp::all_reduce, GroupKind::tensor, out_bytes, Phase::tp_allreduce);
  }
  if (regroup) {
    x.kernel("expert_major_unlayout", KernelKind::elementwise, 2.0 * received_bytes);
    x.host_calls_of_last(kChunkUnsortCalls);
  }
  const int combine_a2a = x.expert_all_to_all_at("ep_alltoall_combine", c.moe_dispatcher, m.moe, a2a_bytes);
  if (c.shared_expert_overlap && shared_seconds > 0) x.hide_behind(shared_seconds, {dispatch_a2a, combine_a2a});
  if (dtd_split) {
    x.collective("dtd_allgather_combine", CollectiveOp::all_gather, GroupKind::tensor, slots * h * B, Phase::tp_allgather);
    x.kernel("dtd_unslice", KernelKind::elementwise, 2.0 * slots * h * B);
  }
  x.kernel("combine", KernelKind::combine, (kept + double(router_tokens)) * h * B);
  x.set_module(0);
  x.kernel("residual_moe", KernelKind::elementwise, residual_bytes(d));
}

}  // namespace tedsim
