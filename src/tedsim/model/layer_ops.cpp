#include "tedsim/model/layer_ops.hpp"

#include <algorithm>

#include "tedsim/core/error.hpp"
#include "tedsim/model/layer_parts.hpp"

namespace tedsim {

LayerDims layer_dims(const ModelSpec& m, const StepShape& s) {
  LayerDims d;
  d.T = s.tokens;
  d.sp = s.sp;
  d.hidden_dropout = m.hidden_dropout > 0;
  d.attention_dropout = m.attention_dropout > 0;
  d.T_local = s.sp ? (s.tokens + s.t - 1) / s.t : s.tokens;
  d.h = m.hidden;
  d.cp = s.cp;
  d.s = s.s / s.cp;
  d.b = s.b;
  d.heads_local = m.heads / s.t;
  d.attn_batch = d.b * d.heads_local * d.cp;
  // GQA's local key heads (one at least, replicated as Megatron-Core does), MLA's per-head keys
  // and values after the up projections.
  d.kv_width_local = m.is_mla() ? std::int64_t(m.heads / s.t) * (m.mla.qk_head_dim() + m.mla.v_head_dim)
                                : 2 * std::int64_t(std::max(1, m.kv_heads / s.t)) * m.head_dim();
  d.head_dim = m.head_dim();
  // The per-head layouts the unfused core reads: q, k, v; MLA's keys are query-sized (the rope key
  // copied to every head) and its values v_head_dim.
  d.qkv_out = m.is_mla() ? std::int64_t(m.heads / s.t) * (2 * m.mla.qk_head_dim() + m.mla.v_head_dim)
                         : (std::int64_t(m.q_dim()) + 2 * std::int64_t(m.kv_dim())) / s.t;
  d.ffn_local_dense = m.ffn / s.t;
  d.fc1_factor = m.activation == Activation::swiglu ? 2 : 1;
  d.shared_local = m.is_moe() ? m.shared_width() / s.t : 0;
  d.B = s.act_bytes;
  d.mla = m.is_mla();
  d.qk_head_dim = d.mla ? m.mla.qk_head_dim() : d.head_dim;
  d.v_head_dim = d.mla ? m.mla.v_head_dim : d.head_dim;
  d.q_lora = m.mla.q_lora_rank;
  d.kv_lora = m.mla.kv_lora_rank;
  d.qk_rope = m.mla.qk_rope_head_dim;
  // Every local query head, and the local key heads (MLA: one rope key shared by all heads).
  d.rotary_elems_per_token = std::int64_t(m.rotary_dim) * (d.heads_local + (d.mla ? 1 : m.kv_heads / s.t));
  // Every local query head and key head (one at least: Megatron-Core replicates key heads when
  // the tensor group is wider than their count).
  if (m.qk_norm != QkNorm::none)
    d.qk_norm_elems_per_token = std::int64_t(d.head_dim) * (d.heads_local + std::max(1, m.kv_heads / s.t));
  d.rope_unfused = m.rope_unfused();
  d.core_attention = m.core_attention;
  return d;
}

void attention_forward(BlockBuilder& x, const LayerDims& d) {
  x.set_graph_scope(kGraphAttn);
  x.set_module(kRecomputeLayernorm);
  x.kernel("layernorm_attn", KernelKind::layernorm, 2.0 * d.T_local * d.h * d.B);
  x.set_module(0);
  tp_block_entry(x, d, "sp_allgather_attn");
  if (d.mla) {
    // Megatron-Core's MLA: the down projections to the latents are replicated on every tensor
    // rank; the up projections are column-parallel over heads, the output projection row-parallel.
    const std::int64_t q_heads_out = d.heads_local * d.qk_head_dim;
    // The up projections (with their fused norms) and RoPE form Megatron-Core's mla_up_proj
    // recompute module (qkv_up_proj_and_rope_apply in multi_latent_attention.py).
    if (d.q_lora > 0) {
      x.gemm("mla_q_down", d.T, d.q_lora, d.h);
      x.set_module(kRecomputeMlaUpProj);
      x.kernel("mla_q_norm", KernelKind::layernorm, 2.0 * d.T * d.q_lora * d.B);
      x.norm_gemm("mla_q_up", d.T, q_heads_out, d.q_lora);
      x.set_module(0);
    } else {
      x.gemm("mla_q_proj", d.T, q_heads_out, d.h);
    }
    x.gemm("mla_kv_down", d.T, d.kv_lora + d.qk_rope, d.h);
    x.set_module(kRecomputeMlaUpProj);
    x.kernel("mla_kv_norm", KernelKind::layernorm, 2.0 * d.T * d.kv_lora * d.B);
    x.norm_gemm("mla_kv_up", d.T, d.heads_local * (d.qk_head_dim - d.qk_rope + d.v_head_dim), d.kv_lora);
  } else {
    x.norm_gemm("qkv_proj", d.T, d.qkv_out, d.h);
    // Qwen3's and OLMoE's norms of the queries and keys (Megatron-Core's qk_layernorm), before RoPE.
    if (d.qk_norm_elems_per_token > 0)
      x.kernel("qk_norm", KernelKind::layernorm, 2.0 * double(d.T) * double(d.qk_norm_elems_per_token) * d.B);
  }
  // RoPE on the queries and keys (Megatron-Core's fused apply_rotary_pos_emb): reads and writes
  // each rotated element once; the cos/sin table is s x rotary_dim, cached.
  if (d.rotary_elems_per_token > 0) {
    const double rotated = double(d.T) * double(d.rotary_elems_per_token) * d.B;
    if (!d.rope_unfused) {
      x.kernel("rotary", KernelKind::elementwise, 2.0 * rotated);
    } else {
      // YaRN's attention factor sends Megatron-Core to its unfused RoPE (ModelSpec::rope_unfused).
      // Forward, per rotated element (reads + writes): t * cos (2), -x2 of half (1), the rotated
      // half's cat (2), * sin (2), the add (3), the cat with the empty unrotated part (2): 12.
      // Backward (autograd): grad * cos (2), grad * sin (2), the negation's (1), the halves' cat
      // (2), the two paths' sum (3), the slice's zeros and copy (3): 13. Framework calls, for the
      // query and the key each: cos, sin and their scaling and casts (6) and the six kernels
      // forward; seven backward.
      x.kernel("rotary", KernelKind::elementwise, 12.0 * rotated);
      x.backward_of_last(13.0 * rotated, 2.0 * kUnfusedRopeBackwardCalls);
      x.host_calls_of_last(2.0 * kUnfusedRopeForwardCalls);
    }
  }
  x.set_module(kRecomputeCoreAttn);
  const AttentionShape core{d.attn_batch, d.s, d.qk_head_dim, d.v_head_dim, d.window, d.fp8_attention};
  // Context parallelism: the ring passes every rank's keys and values once around the cp ranks
  // (Transformer Engine's p2p ring, Megatron-Core's default cp_comm_type): cp - 1 chunks in and
  // out, the traffic of an all-gather of them. Each step's transfer runs under the core's step
  // on the chunk before, so the core's (cp - 1)/cp hides it. Backward sends the keys' and values'
  // gradients too (twice the bytes), under the backward core's steps (mirror_backward).
  const int ring = d.cp > 1 ? x.collective_at("cp_kv_exchange", CollectiveOp::all_gather, GroupKind::context,
                                              double(d.cp) * double(d.T) * double(d.kv_width_local) * d.B, Phase::cp_ring)
                            : -1;
  const int core_first = x.size();
  if (d.core_attention == AttentionKernel::flash) {
    // A fused kernel (Transformer Engine's flash / cuDNN attention) reads q, k, v in the
    // projection's [s, b, heads, d] layout and writes the context in it: no layout copies, and
    // its dropout is fused too.
    // With context parallelism Transformer Engine runs the core as cp ring steps, each its own calls.
    if (x.attention_core("attn_core", AttentionKernel::flash, core)) x.host_calls_of_last(kFusedAttentionCalls * double(d.cp));
    else
      throw InputError("--attention-kernel flash: the profile (" + x.profile_description() +
                       ") has no measured flash-attention rates; use --attention-kernel unfused, or a topology "
                       "with an efficiency.attention block");
  } else {
    // Layout changes around the core: the projection's [tokens, q|k|v] into per-head [heads, s, d]
    // (read and written once), and the context back to [tokens, heads x d].
    x.kernel("attn_split_heads", KernelKind::elementwise, 2.0 * double(d.T) * double(d.qkv_out) * d.B);
    // The core: from the profile's measured rates of the unfused core where it has them (QK^T,
    // softmax and PV as the framework runs them), else op by op.
    const bool measured = x.attention_core("attn_core", AttentionKernel::unfused, core);
    if (!measured) {
      x.core_gemm("attn_scores", d.s, d.s, d.qk_head_dim, d.attn_batch);
      x.kernel("attn_softmax", KernelKind::softmax, 2.0 * double(d.attn_batch) * d.s * d.s * d.B);
    }
    // Dropout on the probabilities, unfused (Megatron-LM's core attention): reads and writes them
    // and writes a one-byte mask per element.
    if (d.attention_dropout)
      x.kernel("attn_dropout", KernelKind::elementwise, (2.0 * d.B + 1.0) * double(d.attn_batch) * d.s * d.s);
    if (!measured) x.core_gemm("attn_context", d.s, d.v_head_dim, d.s, d.attn_batch);
    x.kernel("attn_merge_heads", KernelKind::elementwise, 2.0 * double(d.T) * double(d.heads_local * d.v_head_dim) * d.B);
  }
  if (ring >= 0) x.hide_behind(x.seconds_since(core_first) * double(d.cp - 1) / double(d.cp), {ring});
  x.set_module(0);
  x.gemm("attn_out_proj", d.T, d.h, d.heads_local * d.v_head_dim);
  tp_block_exit(x, d, "tp_allreduce_attn", "sp_reducescatter_attn");
  x.kernel("residual_attn", KernelKind::elementwise, residual_bytes(d));
  x.set_graph_scope(0);
}

void dense_mlp_forward(BlockBuilder& x, const LayerDims& d) {
  x.set_graph_scope(kGraphMlp);
  pre_mlp_layernorm(x, d);
  x.set_module(kRecomputeMlp);
  tp_block_entry(x, d, "sp_allgather_mlp");
  x.norm_gemm("mlp_fc1", d.T, d.fc1_factor * d.ffn_local_dense, d.h);
  x.kernel("mlp_activation", KernelKind::activation, double(d.fc1_factor + 1) * d.T * d.ffn_local_dense * d.B);
  x.gemm("mlp_fc2", d.T, d.h, d.ffn_local_dense);
  tp_block_exit(x, d, "tp_allreduce_mlp", "sp_reducescatter_mlp");
  x.set_module(0);
  x.kernel("residual_mlp", KernelKind::elementwise, residual_bytes(d));
  x.set_graph_scope(0);
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
  x.core_gemm("lm_head", s.tokens, m.vocab / s.t, m.hidden, 1);
  x.kernel("cross_entropy", KernelKind::cross_entropy, 3.0 * T * V_local * 4.0, Phase::other);
  // Max, target logit and sum of exponentials are each all-reduced over the vocabulary split.
  for (const char* name : {"tp_allreduce_loss_max", "tp_allreduce_loss_target", "tp_allreduce_loss_sum"})
    x.collective(name, CollectiveOp::all_reduce, GroupKind::tensor, T * 4.0, Phase::tp_allreduce);
}

void head_backward(BlockBuilder& x, const LayerDims& d, const ModelSpec& m, const StepShape& s) {
  const double T = double(d.T), h = double(d.h), V_local = double(m.vocab) / s.t, B = d.B;
  x.kernel("cross_entropy_bwd", KernelKind::cross_entropy, 2.0 * T * V_local * 4.0, Phase::other);
  x.core_gemm("lm_head_dgrad", s.tokens, m.hidden, m.vocab / s.t, 1);
  x.core_gemm("lm_head_wgrad", m.hidden, m.vocab / s.t, s.tokens, 1);
  tp_block_exit(x, d, "tp_allreduce_lm_head_bwd", "sp_reducescatter_lm_head_bwd");
  x.kernel("final_layernorm_bwd", KernelKind::layernorm, 4.0 * double(d.T_local) * h * B, Phase::other);
}

void mtp_projection_forward(BlockBuilder& x, const LayerDims& d, const StepShape& s) {
  // Column-parallel: under SP its [T, 2h] input is gathered first.
  if (d.sp) x.collective("sp_allgather_mtp", CollectiveOp::all_gather, GroupKind::tensor, 2.0 * d.T * d.h * d.B, Phase::tp_allgather);
  x.gemm("mtp_eh_proj", d.T, d.h / s.t, 2 * d.h);
}

void mtp_entry_forward(BlockBuilder& x, const LayerDims& d, const StepShape& s) {
  const double h = double(d.h), B = d.B, T_local = double(d.T_local);
  embedding_forward(x, d);
  x.kernel("mtp_enorm", KernelKind::layernorm, 2.0 * T_local * h * B);
  x.kernel("mtp_hnorm", KernelKind::layernorm, 2.0 * T_local * h * B);
  x.kernel("mtp_concat", KernelKind::elementwise, 4.0 * T_local * h * B);
  mtp_projection_forward(x, d, s);
  // The output's column slices gathered back to whole hidden states for the layer.
  if (s.t > 1) {
    x.collective("tp_allgather_mtp", CollectiveOp::all_gather, GroupKind::tensor, double(d.T) * h * B, Phase::tp_allgather);
    x.kernel("mtp_gather_layout", KernelKind::elementwise, 2.0 * double(d.T) * h * B);
  }
}

void mtp_entry_backward(BlockBuilder& x, const LayerDims& d, const StepShape& s, const Block& projection_backward) {
  const double h = double(d.h), B = d.B, T = double(d.T), T_local = double(d.T_local);
  // SP: the scatter to this rank's rows, backward, gathers the gradient's rows; the gather of
  // the column slices, backward, keeps this rank's slice (a strided copy).
  if (d.sp) x.collective("sp_allgather_mtp_bwd", CollectiveOp::all_gather, GroupKind::tensor, T * h * B, Phase::tp_allgather);
  if (s.t > 1) x.kernel("mtp_gather_layout", KernelKind::elementwise, 2.0 * T * h * B / s.t);
  for (int i = 0; i < projection_backward.count; ++i) x.add(projection_backward.ops[i]);
  // Without SP the column-parallel input's gradient is summed over the tensor group.
  if (!d.sp && s.t > 1)
    x.collective("tp_allreduce_mtp_bwd", CollectiveOp::all_reduce, GroupKind::tensor, 2.0 * T * h * B, Phase::tp_allreduce);
  x.kernel("mtp_concat", KernelKind::elementwise, 4.0 * T_local * h * B);
  x.kernel("mtp_hnorm", KernelKind::layernorm, 4.0 * T_local * h * B);
  x.kernel("mtp_enorm", KernelKind::layernorm, 4.0 * T_local * h * B);
  embedding_backward(x, d);
}

void embedding_backward(BlockBuilder& x, const LayerDims& d) {
  const double T = double(d.T), h = double(d.h), B = d.B;
  if (d.sp) x.collective("sp_allgather_embedding_bwd", CollectiveOp::all_gather, GroupKind::tensor, T * h * B, Phase::tp_allgather);
  x.kernel("embedding_bwd", KernelKind::elementwise, 2.0 * T * h * B, Phase::other);
}

}  // namespace tedsim
