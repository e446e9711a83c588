#include "tedsim/model/layer_ops.hpp"

#include <algorithm>

namespace tedsim {

void BlockBuilder::gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                        Phase phase) {
  GemmShape shape{m, n, k, batch, dtype_};
  Op op;
  op.name = name;
  op.phase = phase;
  op.flops = shape.flops();
  op.gemm = shape;
  op.module = module_;
  op.seconds = profile_.gemm_seconds(shape);
  block_.add(op);
}

void BlockBuilder::kernel(const char* name, KernelKind kind, double bytes, Phase phase) {
  Op op;
  op.name = name;
  op.phase = phase;
  op.bytes = bytes;
  op.kernel = kind;
  op.gemm.dtype = dtype_;
  op.module = module_;
  op.seconds = profile_.kernel_seconds(kind, bytes, dtype_);
  block_.add(op);
}

void BlockBuilder::collective(const char* name, CollectiveOp which, GroupKind group, double bytes, Phase phase) {
  const SpanSet& set = spans_.of(group);
  if (set.count == 0 || set.spans[0].ranks <= 1 || bytes <= 0) return;
  Op op;
  op.name = name;
  op.phase = phase;
  op.bytes = bytes;
  op.is_collective = true;
  op.collective = which;
  op.group = group;
  op.module = module_;
  op.seconds = set.seconds(profile_, which, bytes);
  block_.add(op);
}

LayerDims layer_dims(const ModelSpec& m, const StepShape& s) {
  LayerDims d;
  d.T = s.tokens;
  d.sp = s.sp;
  d.T_local = s.sp ? (s.tokens + s.t - 1) / s.t : s.tokens;
  d.h = m.hidden;
  d.s = s.s;
  d.b = s.b;
  d.heads_local = m.heads / s.t;
  d.head_dim = m.head_dim();
  d.qkv_out = (std::int64_t(m.hidden) + 2 * std::int64_t(m.kv_dim())) / s.t;
  d.ffn_local_dense = m.ffn / s.t;
  d.fc1_factor = m.activation == Activation::swiglu ? 2 : 1;
  d.B = s.act_bytes;
  return d;
}

namespace {

// The entry and exit of a tensor-parallel block: the identity / all-reduce pair of Megatron's
// column- and row-parallel linears, or sequence parallelism's all-gather / reduce-scatter.
void tp_block_entry(BlockBuilder& x, const LayerDims& d, const char* sp_name) {
  if (d.sp) x.collective(sp_name, CollectiveOp::all_gather, GroupKind::tensor, double(d.T) * d.h * d.B, Phase::tp_allgather);
}
void tp_block_exit(BlockBuilder& x, const LayerDims& d, const char* allreduce_name, const char* sp_name) {
  if (d.sp)
    x.collective(sp_name, CollectiveOp::reduce_scatter, GroupKind::tensor, double(d.T) * d.h * d.B, Phase::tp_allreduce);
  else
    x.collective(allreduce_name, CollectiveOp::all_reduce, GroupKind::tensor, double(d.T) * d.h * d.B, Phase::tp_allreduce);
}

}  // namespace

void attention_forward(BlockBuilder& x, const LayerDims& d) {
  x.set_module(kRecomputeLayernorm);
  x.kernel("layernorm_attn", KernelKind::layernorm, 2.0 * d.T_local * d.h * d.B);
  x.set_module(0);
  tp_block_entry(x, d, "sp_allgather_attn");
  x.gemm("qkv_proj", d.T, d.qkv_out, d.h);
  x.set_module(kRecomputeCoreAttn);
  x.gemm("attn_scores", d.s, d.s, d.head_dim, d.b * d.heads_local);
  x.kernel("attn_softmax", KernelKind::softmax, 2.0 * double(d.b * d.heads_local) * d.s * d.s * d.B);
  x.gemm("attn_context", d.s, d.head_dim, d.s, d.b * d.heads_local);
  x.set_module(0);
  x.gemm("attn_out_proj", d.T, d.h, d.heads_local * d.head_dim);
  tp_block_exit(x, d, "tp_allreduce_attn", "sp_reducescatter_attn");
  x.kernel("residual_attn", KernelKind::elementwise, 3.0 * d.T_local * d.h * d.B);
  x.set_module(kRecomputeLayernorm);
  x.kernel("layernorm_mlp", KernelKind::layernorm, 2.0 * d.T_local * d.h * d.B);
  x.set_module(0);
}

void dense_mlp_forward(BlockBuilder& x, const LayerDims& d) {
  x.set_module(kRecomputeMlp);
  tp_block_entry(x, d, "sp_allgather_mlp");
  x.gemm("mlp_fc1", d.T, d.fc1_factor * d.ffn_local_dense, d.h);
  x.kernel("mlp_activation", KernelKind::activation, double(d.fc1_factor + 1) * d.T * d.ffn_local_dense * d.B);
  x.gemm("mlp_fc2", d.T, d.h, d.ffn_local_dense);
  tp_block_exit(x, d, "tp_allreduce_mlp", "sp_reducescatter_mlp");
  x.set_module(0);
  x.kernel("residual_mlp", KernelKind::elementwise, 3.0 * d.T_local * d.h * d.B);
}

void moe_forward(BlockBuilder& x, const LayerDims& d, const StepShape& s, const ModelSpec& m, const ParallelConfig& c) {
  const double E = m.moe.experts, h = double(d.h), B = d.B;
  // The router's tokens: this rank's s/t with sequence parallelism, else all T (every tensor rank
  // runs the gate on the same tokens, as DeepSpeed does).
  const std::int64_t router_tokens = d.sp ? d.T_local : d.T;
  const double slots = E * double(s.capacity);
  const double kept = std::min(double(m.moe.top_k) * double(router_tokens), slots);
  const bool dtd_split = c.dtd && s.t > 1 && !d.sp;
  x.set_module(kRecomputeMoe);
  x.gemm("gate", router_tokens, m.moe.experts, d.h);
  x.kernel("gating", KernelKind::gating, double(router_tokens) * E * 4.0 + double(router_tokens) * m.moe.top_k * 12.0);
  x.kernel("dispatch", KernelKind::dispatch, (kept + slots) * h * B);
  const double a2a_bytes = E * double(s.capacity_a2a) * h * B;
  x.collective("ep_alltoall_dispatch", CollectiveOp::all_to_all, GroupKind::expert, a2a_bytes, Phase::ep_alltoall);
  // The tokens every tensor rank's experts see: all t ranks' after the gather.
  const double gathered_slots = d.sp ? double(s.t) * slots : slots;
  if (c.expert_tp && (dtd_split || d.sp))
    x.collective(d.sp ? "sp_allgather_expert" : "dtd_allgather_dispatch", CollectiveOp::all_gather, GroupKind::tensor,
                 gathered_slots * h * B, Phase::tp_allgather);
  const std::int64_t rows = s.expert_rows;
  const std::int64_t fc1_out = d.fc1_factor * s.ffn_local;
  x.gemm("expert_fc1", rows, fc1_out, d.h, s.local_experts);
  x.set_module(kRecomputeMoe | kRecomputeMoeAct);
  x.kernel("expert_activation", KernelKind::activation,
           double(d.fc1_factor + 1) * double(rows) * s.local_experts * s.ffn_local * B);
  x.set_module(kRecomputeMoe);
  x.gemm("expert_fc2", rows, d.h, s.ffn_local, s.local_experts);
  if (c.expert_tp) {
    const double out_bytes = double(rows) * s.local_experts * h * B;
    if (d.sp)
      x.collective("sp_reducescatter_expert", CollectiveOp::reduce_scatter, GroupKind::tensor, out_bytes, Phase::tp_allreduce);
    else
      x.collective("tp_allreduce_expert", CollectiveOp::all_reduce, GroupKind::tensor, out_bytes, Phase::tp_allreduce);
  }
  x.collective("ep_alltoall_combine", CollectiveOp::all_to_all, GroupKind::expert, a2a_bytes, Phase::ep_alltoall);
  if (dtd_split)
    x.collective("dtd_allgather_combine", CollectiveOp::all_gather, GroupKind::tensor, slots * h * B, Phase::tp_allgather);
  x.kernel("combine", KernelKind::combine, (kept + double(router_tokens)) * h * B);
  x.set_module(0);
  x.kernel("residual_moe", KernelKind::elementwise, 3.0 * d.T_local * d.h * B);
}

// Megatron's vocabulary-parallel embedding: each tensor rank looks up its vocabulary slice and the
// partial rows are all-reduced (reduce-scattered into sequence shards with SP).
void embedding_forward(BlockBuilder& x, const LayerDims& d) {
  const double T = double(d.T), h = double(d.h), B = d.B;
  x.kernel("embedding_lookup", KernelKind::elementwise, 2.0 * T * h * B, Phase::other);
  if (d.sp)
    x.collective("sp_reducescatter_embedding", CollectiveOp::reduce_scatter, GroupKind::tensor, T * h * B, Phase::tp_allreduce);
  else
    x.collective("tp_allreduce_embedding", CollectiveOp::all_reduce, GroupKind::tensor, T * h * B, Phase::tp_allreduce);
}

void head_forward(BlockBuilder& x, const LayerDims& d, const ModelSpec& m, const StepShape& s) {
  const double T = double(d.T), h = double(d.h), V_local = double(m.vocab) / s.t, B = d.B;
  x.kernel("final_layernorm", KernelKind::layernorm, 2.0 * double(d.T_local) * h * B, Phase::other);
  tp_block_entry(x, d, "sp_allgather_lm_head");
  x.gemm("lm_head", s.tokens, m.vocab / s.t, m.hidden);
  x.kernel("cross_entropy", KernelKind::softmax, 3.0 * T * V_local * 4.0, Phase::other);
  // Max, target logit and sum of exponentials are each all-reduced over the vocabulary split.
  for (const char* name : {"tp_allreduce_loss_max", "tp_allreduce_loss_target", "tp_allreduce_loss_sum"})
    x.collective(name, CollectiveOp::all_reduce, GroupKind::tensor, T * 4.0, Phase::tp_allreduce);
}

void head_backward(BlockBuilder& x, const LayerDims& d, const ModelSpec& m, const StepShape& s) {
  const double T = double(d.T), h = double(d.h), V_local = double(m.vocab) / s.t, B = d.B;
  x.kernel("cross_entropy_bwd", KernelKind::softmax, 2.0 * T * V_local * 4.0, Phase::other);
  x.gemm("lm_head_dgrad", s.tokens, m.hidden, m.vocab / s.t);
  x.gemm("lm_head_wgrad", m.hidden, m.vocab / s.t, s.tokens);
  tp_block_exit(x, d, "tp_allreduce_lm_head_bwd", "sp_reducescatter_lm_head_bwd");
  x.kernel("final_layernorm_bwd", KernelKind::layernorm, 4.0 * double(d.T_local) * h * B, Phase::other);
}

void embedding_backward(BlockBuilder& x, const LayerDims& d) {
  const double T = double(d.T), h = double(d.h), B = d.B;
  if (d.sp) x.collective("sp_allgather_embedding_bwd", CollectiveOp::all_gather, GroupKind::tensor, T * h * B, Phase::tp_allgather);
  x.kernel("embedding_bwd", KernelKind::elementwise, 2.0 * T * h * B, Phase::other);
}

}  // namespace tedsim
