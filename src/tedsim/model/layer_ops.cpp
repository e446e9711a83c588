#include "tedsim/model/layer_ops.hpp"

#include <algorithm>

#include "tedsim/core/error.hpp"
#include "tedsim/model/flex_dispatch.hpp"

namespace tedsim {

double fp8_quantize_seconds(const Profile& profile, const Fp8Quantize& q, double elements, double tensors, bool after_norm) {
  if (!q.priced() || elements <= 0 || tensors <= 0) return 0.0;
  double one = profile.kernel_seconds(KernelKind::elementwise, q.cast_bytes * elements, Dtype::bf16);
  if (!after_norm && q.amax_bytes > 0) one += profile.kernel_seconds(KernelKind::elementwise, q.amax_bytes * elements, Dtype::bf16);
  one += q.scalar_launches * profile.kernel_seconds(KernelKind::elementwise, 4.0, Dtype::fp32);
  return tensors * one;
}

void BlockBuilder::gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                        Phase phase) {
  add_gemm(name, m, n, k, batch, phase, Input::other);
}

void BlockBuilder::norm_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k) {
  add_gemm(name, m, n, k, 1, Phase::compute, Input::norm);
}

void BlockBuilder::core_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch) {
  add_gemm(name, m, n, k, batch, Phase::compute, Input::unquantized);
}

void BlockBuilder::add_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch,
                            Phase phase, Input input) {
  // FP8 training multiplies in FP8 only inside Transformer Engine's linears. The GEMMs outside them
  // stay in bf16: the output layer (Megatron-Core's tensor_parallel.ColumnParallelLinear, a torch
  // matmul), the router's gate (a torch linear) and an unfused attention core.
  const Dtype dtype = input == Input::unquantized ? storage_dtype(dtype_) : dtype_;
  GemmShape shape{m, n, k, batch, dtype};
  Op op;
  op.name = name;
  op.phase = phase;
  op.flops = shape.flops();
  op.gemm = shape;
  op.module = module_;
  op.graph_scope = graph_scope_;
  op.seconds = profile_.gemm_seconds(shape);
  const Fp8Quantize q = profile_.fp8_quantize();
  if (dtype_ == Dtype::fp8 && input != Input::unquantized && q.priced()) {
    op.dgrad_quantize = true;
    if (input != Input::quantized) {
      const bool after_norm = input == Input::norm;
      op.quantize_bytes = q.bytes(after_norm) * double(m) * double(k) * double(batch);
      op.seconds += fp8_quantize_seconds(profile_, q, double(m) * double(k), double(batch), after_norm);
      op.host_calls += double(batch);  // the quantizer's call (per expert in a grouped GEMM: below)
    }
  }
  block_.add(op);
}

void BlockBuilder::fused_grouped_mlp(std::int64_t rows, std::int64_t fc1_out, std::int64_t h, std::int64_t ffn,
                                     std::int64_t experts) {
  // The permuted tokens are quantized as one grouped tensor (one quantizer call, not one per expert).
  add_gemm("expert_fc1", rows, fc1_out, h, experts, Phase::compute, Input::other);
  Op& fc1 = block_.ops[block_.count - 1];
  fc1.dgrad_quantize = false;
  fc1.host_calls = kGroupedLinearCallsPerCall + 1.0;
  add_gemm("expert_fc2", rows, h, ffn, experts, Phase::compute, Input::quantized);
  block_.ops[block_.count - 1].host_calls = kGroupedLinearCallsPerCall;
}

void BlockBuilder::grouped_gemm(const char* name, std::int64_t rows, std::int64_t n, std::int64_t k, std::int64_t experts) {
  add_gemm(name, rows, n, k, experts, Phase::compute, Input::other);
  // add_gemm counted one GEMM call and each expert's quantization: the other experts' GEMMs and the
  // grouped call's own come on top.
  block_.ops[block_.count - 1].host_calls += double(experts) * kGroupedLinearCallsPerExpert - 1.0 + kGroupedLinearCallsPerCall;
}

void BlockBuilder::host_calls_at(int index, double calls) { block_.ops[index].host_calls = calls; }

void BlockBuilder::backward_of_last(double bytes, double host_calls) {
  Op& op = block_.ops[block_.count - 1];
  op.backward_bytes = bytes;
  op.backward_host_calls = host_calls;
}

void BlockBuilder::host_calls_of_last(double calls, bool sync, bool forward_only) {
  Op& op = block_.ops[block_.count - 1];
  op.host_calls = calls;
  op.host_sync = sync;
  op.host_resume_calls = sync ? kResumeAfterSyncCalls : 0.0;
  op.forward_only = forward_only;
}

void BlockBuilder::kernel(const char* name, KernelKind kind, double bytes, Phase phase) {
  Op op;
  op.name = name;
  op.phase = phase;
  op.bytes = bytes;
  op.kernel = kind;
  op.gemm.dtype = storage_dtype(dtype_);
  op.module = module_;
  op.graph_scope = graph_scope_;
  op.seconds = profile_.kernel_seconds(kind, bytes, storage_dtype(dtype_));
  block_.add(op);
}

bool BlockBuilder::attention_core(const char* name, AttentionKernel kernel, const AttentionShape& shape) {
  const double seconds = profile_.attention_seconds(kernel, false, shape);
  if (seconds < 0) return false;
  Op op;
  op.name = name;
  op.flops = shape.forward_flops();
  // The fused core runs in bf16 under FP8 training too unless --fp8-attention asks for cuDNN's FP8
  // kernel (Megatron-Core's --fp8-dot-product-attention, off by default; Megatron-Bridge 26.06 sets
  // it for some Blackwell MoE recipes).
  op.gemm = GemmShape{shape.seq, shape.v_head_dim, shape.head_dim, shape.batch_heads, storage_dtype(dtype_)};
  op.is_attention = true;
  op.attention_kernel = kernel;
  op.attention_window = shape.window;
  op.attention_fp8 = shape.fp8;
  op.module = module_;
  op.graph_scope = graph_scope_;
  op.seconds = seconds;
  block_.add(op);
  return true;
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
  op.graph_scope = graph_scope_;
  op.seconds = set.seconds(profile_, which, bytes);
  block_.add(op);
}

int BlockBuilder::collective_at(const char* name, CollectiveOp which, GroupKind group, double bytes, Phase phase) {
  const int before = block_.count;
  collective(name, which, group, bytes, phase);
  return block_.count > before ? before : -1;
}

int BlockBuilder::expert_all_to_all_at(const char* name, MoeDispatcher dispatcher, const MoeSpec& moe,
                                       double pair_bytes) {
  // Dropless routing's alltoall dispatcher exchanges uneven counts (MPI_Alltoallv, NCCL grouped
  // send/recv): calibration times that call with the busiest rank's split; the flex dispatcher's
  // kernels are priced below from the even all-to-all's links.
  const CollectiveOp op = moe.dropless() && dispatcher == MoeDispatcher::alltoall ? CollectiveOp::all_to_all_v
                                                                                 : CollectiveOp::all_to_all;
  const int at = collective_at(name, op, GroupKind::expert, pair_bytes, Phase::ep_alltoall);
  if (at >= 0 && dispatcher == MoeDispatcher::flex) {
    Op& op = block_.ops[at];
    const double flex = flex_all_to_all_seconds(profile_, spans_.of(GroupKind::expert), moe, pair_bytes);
    block_.seconds += flex - op.seconds;
    block_.phase_seconds[int(op.phase)] += flex - op.seconds;
    op.seconds = flex;
  }
  return at;
}

double BlockBuilder::seconds_since(int first_op) const {
  double sum = 0;
  for (int i = first_op; i < block_.count; ++i) sum += block_.ops[i].seconds;
  return sum;
}

void BlockBuilder::hide_behind(double seconds, std::initializer_list<int> ops) {
  // Side-stream work that runs during these ops (collectives): it shortens them, down to zero, in
  // order; the compute it does stays on the block as it was added.
  for (int index : ops) {
    if (seconds <= 0) break;
    if (index < 0 || index >= block_.count || !block_.ops[index].is_collective) continue;
    Op& op = block_.ops[index];
    const double hidden = std::min(seconds, op.seconds);
    op.seconds -= hidden;
    block_.seconds -= hidden;
    block_.phase_seconds[int(op.phase)] -= hidden;
    seconds -= hidden;
  }
}

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

// The residual add reads the block's output and the residual and writes the sum; with hidden
// dropout, Megatron's fused bias-dropout-add also writes a one-byte mask per element.
double residual_bytes(const LayerDims& d) {
  return (3.0 * d.B + (d.hidden_dropout ? 1.0 : 0.0)) * double(d.T_local) * double(d.h);
}

}  // namespace

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

namespace {

// The norm before the MLP or MoE half of a layer (captured with the router or the MLP).
void pre_mlp_layernorm(BlockBuilder& x, const LayerDims& d) {
  x.set_module(kRecomputeLayernorm);
  x.kernel("layernorm_mlp", KernelKind::layernorm, 2.0 * d.T_local * d.h * d.B);
  x.set_module(0);
}

}  // namespace

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
  x.kernel("cross_entropy", KernelKind::softmax, 3.0 * T * V_local * 4.0, Phase::other);
  // Max, target logit and sum of exponentials are each all-reduced over the vocabulary split.
  for (const char* name : {"tp_allreduce_loss_max", "tp_allreduce_loss_target", "tp_allreduce_loss_sum"})
    x.collective(name, CollectiveOp::all_reduce, GroupKind::tensor, T * 4.0, Phase::tp_allreduce);
}

void head_backward(BlockBuilder& x, const LayerDims& d, const ModelSpec& m, const StepShape& s) {
  const double T = double(d.T), h = double(d.h), V_local = double(m.vocab) / s.t, B = d.B;
  x.kernel("cross_entropy_bwd", KernelKind::softmax, 2.0 * T * V_local * 4.0, Phase::other);
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
