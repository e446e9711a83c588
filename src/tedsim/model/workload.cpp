#include "tedsim/model/workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace tedsim {

const char* to_string(Phase p) {
  switch (p) {
    case Phase::compute: return "compute";
    case Phase::tp_allreduce: return "tp_allreduce";
    case Phase::tp_allgather: return "tp_allgather";
    case Phase::ep_alltoall: return "ep_alltoall";
    case Phase::dp_grad_sync: return "dp_grad_sync";
    case Phase::optimizer: return "optimizer";
    case Phase::other: return "other";
    case Phase::count: break;
  }
  return "?";
}

void Block::add(const Op& op) {
  if (count == kMaxOps) throw std::logic_error("tedsim: a block holds more ops than Block::kMaxOps");
  ops[count++] = op;
  seconds += op.seconds;
  flops += op.flops;
  phase_seconds[int(op.phase)] += op.seconds;
}

int Block::count_collectives(CollectiveOp op, GroupKind group) const {
  int n = 0;
  for (int i = 0; i < count; ++i)
    if (ops[i].is_collective && ops[i].collective == op && ops[i].group == group) ++n;
  return n;
}

double Block::collective_bytes(CollectiveOp op, GroupKind group) const {
  double sum = 0;
  for (int i = 0; i < count; ++i)
    if (ops[i].is_collective && ops[i].collective == op && ops[i].group == group) sum += ops[i].bytes;
  return sum;
}

StepShape resolve_shape(const ModelSpec& m, const ParallelConfig& c) {
  StepShape s;
  s.t = c.tp;
  s.e = c.ep;
  s.d = c.dp();
  s.de = c.dp_expert();
  s.b = c.micro_batch;
  s.s = c.seq_len > 0 ? c.seq_len : m.seq_len;
  s.ga = c.grad_accum();
  s.tokens = std::int64_t(s.b) * s.s;
  s.dtype = m.dtype;
  s.act_bytes = bytes_of(m.dtype);
  if (m.is_moe()) {
    const double E = m.moe.experts;
    s.capacity = std::max<std::int64_t>(
        std::int64_t(std::ceil(m.moe.top_k * m.moe.capacity_factor * double(s.tokens) / E)), m.moe.min_capacity);
    s.capacity_a2a = (c.dtd && s.t > 1) ? (s.capacity + s.t - 1) / s.t : s.capacity;
    s.local_experts = m.moe.experts / s.e;
    // With expert TP every tensor rank runs all tokens of its experts on a 1/t slice of F (after
    // DTD's gather); without it experts are whole and each tensor rank runs its C' tokens.
    s.expert_rows = std::int64_t(s.e) * (c.expert_tp ? s.capacity : s.capacity_a2a);
    s.ffn_local = c.expert_tp ? m.ffn / s.t : m.ffn;
  }
  return s;
}

namespace {

// Appends ops with their profile times; collectives on groups of one rank vanish.
class BlockBuilder {
 public:
  BlockBuilder(Block& block, const Profile& profile, const GroupSpans& spans, Dtype dtype)
      : block_(block), profile_(profile), spans_(spans), dtype_(dtype) {}

  void gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch = 1,
            Phase phase = Phase::compute) {
    GemmShape shape{m, n, k, batch, dtype_};
    Op op;
    op.name = name;
    op.phase = phase;
    op.flops = shape.flops();
    op.gemm = shape;
    op.seconds = profile_.gemm_seconds(shape);
    block_.add(op);
  }
  void kernel(const char* name, KernelKind kind, double bytes, Phase phase = Phase::compute) {
    Op op;
    op.name = name;
    op.phase = phase;
    op.bytes = bytes;
    op.kernel = kind;
    op.gemm.dtype = dtype_;
    op.seconds = profile_.kernel_seconds(kind, bytes, dtype_);
    block_.add(op);
  }
  void collective(const char* name, CollectiveOp which, GroupKind group, double bytes, Phase phase) {
    const SpanSet& set = spans_.of(group);
    if (set.count == 0 || set.spans[0].ranks <= 1 || bytes <= 0) return;
    Op op;
    op.name = name;
    op.phase = phase;
    op.bytes = bytes;
    op.is_collective = true;
    op.collective = which;
    op.group = group;
    op.seconds = set.seconds(profile_, which, bytes);
    block_.add(op);
  }

 private:
  Block& block_;
  const Profile& profile_;
  const GroupSpans& spans_;
  Dtype dtype_;
};

struct LayerDims {
  std::int64_t T, h, s, b, heads_local, head_dim, qkv_out, ffn_local_dense, fc1_factor;
  double B;  // activation bytes
};

void attention_forward(BlockBuilder& x, const LayerDims& d) {
  x.kernel("layernorm_attn", KernelKind::layernorm, 2.0 * d.T * d.h * d.B);
  x.gemm("qkv_proj", d.T, d.qkv_out, d.h);
  x.gemm("attn_scores", d.s, d.s, d.head_dim, d.b * d.heads_local);
  x.kernel("attn_softmax", KernelKind::softmax, 2.0 * double(d.b * d.heads_local) * d.s * d.s * d.B);
  x.gemm("attn_context", d.s, d.head_dim, d.s, d.b * d.heads_local);
  x.gemm("attn_out_proj", d.T, d.h, d.heads_local * d.head_dim);
  x.collective("tp_allreduce_attn", CollectiveOp::all_reduce, GroupKind::tensor, double(d.T) * d.h * d.B,
               Phase::tp_allreduce);
  x.kernel("residual_attn", KernelKind::elementwise, 3.0 * d.T * d.h * d.B);
  x.kernel("layernorm_mlp", KernelKind::layernorm, 2.0 * d.T * d.h * d.B);
}

void dense_mlp_forward(BlockBuilder& x, const LayerDims& d) {
  x.gemm("mlp_fc1", d.T, d.fc1_factor * d.ffn_local_dense, d.h);
  x.kernel("mlp_activation", KernelKind::activation, double(d.fc1_factor + 1) * d.T * d.ffn_local_dense * d.B);
  x.gemm("mlp_fc2", d.T, d.h, d.ffn_local_dense);
  x.collective("tp_allreduce_mlp", CollectiveOp::all_reduce, GroupKind::tensor, double(d.T) * d.h * d.B,
               Phase::tp_allreduce);
  x.kernel("residual_mlp", KernelKind::elementwise, 3.0 * d.T * d.h * d.B);
}

void moe_forward(BlockBuilder& x, const LayerDims& d, const StepShape& s, const ModelSpec& m,
                 const ParallelConfig& c) {
  const double E = m.moe.experts, h = double(d.h), B = d.B;
  const double slots = E * double(s.capacity);
  const double kept = std::min(double(m.moe.top_k) * double(d.T), slots);
  const bool split_tokens = c.dtd && s.t > 1;
  // Gate: every tensor rank runs it on all T tokens (fp32 logits, as DeepSpeed does).
  x.gemm("gate", d.T, m.moe.experts, d.h);
  x.kernel("gating", KernelKind::gating, double(d.T) * E * 4.0 + double(d.T) * m.moe.top_k * 12.0);
  x.kernel("dispatch", KernelKind::dispatch, (kept + slots) * h * B);
  const double a2a_bytes = E * double(s.capacity_a2a) * h * B;
  x.collective("ep_alltoall_dispatch", CollectiveOp::all_to_all, GroupKind::expert, a2a_bytes, Phase::ep_alltoall);
  if (split_tokens && c.expert_tp)
    x.collective("dtd_allgather_dispatch", CollectiveOp::all_gather, GroupKind::tensor, slots * h * B,
                 Phase::tp_allgather);
  const std::int64_t rows = s.expert_rows;
  const std::int64_t fc1_out = d.fc1_factor * s.ffn_local;
  x.gemm("expert_fc1", rows, fc1_out, d.h, s.local_experts);
  x.kernel("expert_activation", KernelKind::activation,
           double(d.fc1_factor + 1) * double(rows) * s.local_experts * s.ffn_local * B);
  x.gemm("expert_fc2", rows, d.h, s.ffn_local, s.local_experts);
  if (c.expert_tp)
    x.collective("tp_allreduce_expert", CollectiveOp::all_reduce, GroupKind::tensor,
                 double(rows) * s.local_experts * h * B, Phase::tp_allreduce);
  x.collective("ep_alltoall_combine", CollectiveOp::all_to_all, GroupKind::expert, a2a_bytes, Phase::ep_alltoall);
  if (split_tokens)
    x.collective("dtd_allgather_combine", CollectiveOp::all_gather, GroupKind::tensor, slots * h * B,
                 Phase::tp_allgather);
  x.kernel("combine", KernelKind::combine, (kept + double(d.T)) * h * B);
  x.kernel("residual_moe", KernelKind::elementwise, 3.0 * d.T * d.h * B);
}

// Backward mirrors the forward in reverse: a GEMM becomes its data-gradient and weight-gradient
// GEMMs (2x FLOPs); a memory-bound kernel reads the saved input and the incoming gradient and
// writes a gradient (2x bytes); every collective has a mirror of the same size (all-reduce <->
// all-reduce of Megatron's f/g pair, all-to-all <-> all-to-all, DTD drop <-> gather).
void mirror_backward(const Block& forward, Block& backward, const Profile& profile) {
  for (int i = forward.count - 1; i >= 0; --i) {
    const Op& f = forward.ops[i];
    if (f.is_collective) {
      backward.add(f);
    } else if (f.flops > 0) {
      // Y[m,n] = X[m,k] W[k,n]: dX[m,k] = dY[m,n] W^T (shape m,k,n); dW[k,n] = X^T dY (shape k,n,m).
      const GemmShape& g = f.gemm;
      Op dgrad = f, wgrad = f;
      dgrad.gemm = GemmShape{g.m, g.k, g.n, g.batch, g.dtype};
      wgrad.gemm = GemmShape{g.k, g.n, g.m, g.batch, g.dtype};
      dgrad.seconds = profile.gemm_seconds(dgrad.gemm);
      wgrad.seconds = profile.gemm_seconds(wgrad.gemm);
      backward.add(dgrad);
      backward.add(wgrad);
    } else {
      Op grad = f;
      grad.bytes = 2.0 * f.bytes;
      grad.seconds = profile.kernel_seconds(f.kernel, grad.bytes, f.gemm.dtype);
      backward.add(grad);
    }
  }
}

void recompute_from(const Block& forward, Block& recompute, bool cac) {
  for (int i = 0; i < forward.count; ++i)
    if (!(cac && forward.ops[i].is_collective)) recompute.add(forward.ops[i]);
}

void finish_layer(LayerBlocks& layer, const Profile& profile, const ParallelConfig& c) {
  if (c.checkpoint) recompute_from(layer.forward, layer.recompute, c.cac);
  mirror_backward(layer.forward, layer.backward, profile);
}

}  // namespace

double Workload::nonexpert_sync_seconds(double elems) const {
  const double bytes = elems * grad_bytes;
  const SpanSet& g = spans.data;
  return zero == 0 ? g.seconds(*profile, CollectiveOp::all_reduce, bytes)
                   : g.seconds(*profile, CollectiveOp::reduce_scatter, bytes);
}

double Workload::expert_sync_seconds(double elems) const {
  const double bytes = elems * grad_bytes;
  const SpanSet& g = spans.expert_data;
  return zero == 0 ? g.seconds(*profile, CollectiveOp::all_reduce, bytes)
                   : g.seconds(*profile, CollectiveOp::reduce_scatter, bytes);
}

Workload build_workload(const ModelSpec& m, const ParallelConfig& c, const Profile& profile,
                        const GroupSpans& spans) {
  Workload w;
  w.profile = &profile;
  w.spans = spans;
  w.zero = c.zero;
  w.shape = resolve_shape(m, c);
  w.grad_bytes = bytes_of(m.dtype);
  const StepShape& s = w.shape;

  LayerDims d;
  d.T = s.tokens;
  d.h = m.hidden;
  d.s = s.s;
  d.b = s.b;
  d.heads_local = m.heads / s.t;
  d.head_dim = m.head_dim();
  d.qkv_out = (std::int64_t(m.hidden) + 2 * std::int64_t(m.kv_dim())) / s.t;
  d.ffn_local_dense = m.ffn / s.t;
  d.fc1_factor = m.activation == Activation::swiglu ? 2 : 1;
  d.B = s.act_bytes;

  {
    BlockBuilder x(w.dense.forward, profile, spans, s.dtype);
    attention_forward(x, d);
    dense_mlp_forward(x, d);
    finish_layer(w.dense, profile, c);
  }
  if (m.is_moe()) {
    BlockBuilder x(w.moe.forward, profile, spans, s.dtype);
    attention_forward(x, d);
    moe_forward(x, d, s, m, c);
    finish_layer(w.moe, profile, c);
  }

  // Parameters per rank. Non-expert parameters are split over the tensor group (vocabulary-parallel
  // embedding, Megatron attention and MLP); experts over tensor (when expert TP) and expert groups.
  const double t = s.t;
  const double expert_split = c.expert_tp ? t * s.e : double(s.e);
  const double attn_rank = (m.attention_params() + 4.0 * m.hidden) / t;
  w.dense.nonexpert_grad_elems = attn_rank + m.mlp_params() / t;
  if (m.is_moe()) {
    w.moe.nonexpert_grad_elems = attn_rank + double(m.hidden) * m.moe.experts / t;
    w.moe.expert_grad_elems = double(m.moe.experts) * m.mlp_params() / expert_split;
  }
  w.embedding_grad_elems = (double(m.vocab) * m.hidden * (m.tie_embeddings ? 1.0 : 2.0) + 2.0 * m.hidden) / t;
  w.nonexpert_params_rank = m.nonexpert_params() / t;
  w.expert_params_rank = m.expert_params() / expert_split;

  // Embedding, final norm, LM head and vocabulary-parallel cross-entropy.
  {
    const double T = double(s.tokens), h = m.hidden, V_local = double(m.vocab) / t, B = s.act_bytes;
    BlockBuilder f(w.head_forward, profile, spans, s.dtype);
    f.kernel("embedding_lookup", KernelKind::elementwise, 2.0 * T * h * B, Phase::other);
    f.collective("tp_allreduce_embedding", CollectiveOp::all_reduce, GroupKind::tensor, T * h * B, Phase::tp_allreduce);
    f.kernel("final_layernorm", KernelKind::layernorm, 2.0 * T * h * B, Phase::other);
    f.gemm("lm_head", s.tokens, m.vocab / s.t, m.hidden);
    f.kernel("cross_entropy", KernelKind::softmax, 3.0 * T * V_local * 4.0, Phase::other);
    // Max, target logit and sum of exponentials are each all-reduced over the vocabulary split.
    for (const char* name : {"tp_allreduce_loss_max", "tp_allreduce_loss_target", "tp_allreduce_loss_sum"})
      f.collective(name, CollectiveOp::all_reduce, GroupKind::tensor, T * 4.0, Phase::tp_allreduce);
    BlockBuilder g(w.head_backward, profile, spans, s.dtype);
    g.kernel("cross_entropy_bwd", KernelKind::softmax, 2.0 * T * V_local * 4.0, Phase::other);
    g.gemm("lm_head_dgrad", s.tokens, m.hidden, m.vocab / s.t);
    g.gemm("lm_head_wgrad", m.hidden, m.vocab / s.t, s.tokens);
    g.collective("tp_allreduce_lm_head_bwd", CollectiveOp::all_reduce, GroupKind::tensor, T * h * B, Phase::tp_allreduce);
    g.kernel("final_layernorm_bwd", KernelKind::layernorm, 4.0 * T * h * B, Phase::other);
    g.kernel("embedding_bwd", KernelKind::elementwise, 2.0 * T * h * B, Phase::other);
  }

  const double dense_layers = m.dense_layers(), moe_layers = m.moe_layers();
  auto pass_flops = [&](const LayerBlocks& l, bool with_recompute) {
    return l.forward.flops + l.backward.flops + (with_recompute ? l.recompute.flops : 0.0);
  };
  const double head = w.head_forward.flops + w.head_backward.flops;
  w.flops_per_microbatch = dense_layers * pass_flops(w.dense, true) + moe_layers * pass_flops(w.moe, true) + head;
  // Model FLOPs count the model's work once. Every tensor rank runs the gate on all T tokens, and
  // without expert TP and DTD also the same expert GEMMs on the same tokens (whole F, all C rows):
  // hardware FLOPs (above), but one tensor group's work, of which this rank's share is 1/t.
  const bool experts_replicated = m.is_moe() && s.t > 1 && !c.expert_tp && !c.dtd;
  auto replicated_flops = [&](const Block& b) {
    double f = 0;
    for (int i = 0; i < b.count; ++i) {
      const char* name = b.ops[i].name;
      const bool expert_gemm = std::strcmp(name, "expert_fc1") == 0 || std::strcmp(name, "expert_fc2") == 0;
      if (std::strcmp(name, "gate") == 0 || (experts_replicated && expert_gemm)) f += b.ops[i].flops;
    }
    return f;
  };
  const double moe_duplicates =
      (replicated_flops(w.moe.forward) + replicated_flops(w.moe.backward)) * (1.0 - 1.0 / double(s.t));
  w.model_flops_per_microbatch = dense_layers * pass_flops(w.dense, false) +
                                 moe_layers * (pass_flops(w.moe, false) - moe_duplicates) + head;

  // Optimizer over owned shards. Adam moves ~32 bytes per parameter: fp32 master weight, m, v read
  // and written (24), the gradient upcast (4 + 2) and the updated half-precision weight (2).
  const double ne_owned = w.nonexpert_params_rank / (c.zero >= 1 ? s.d : 1);
  const double ex_owned = w.expert_params_rank / (c.zero >= 1 ? s.de : 1);
  const double adam_bytes_per_param = s.act_bytes == 4 ? 28.0 : 32.0;
  w.optimizer_seconds = profile.kernel_seconds(KernelKind::adam, ne_owned * adam_bytes_per_param, Dtype::fp32);
  if (ex_owned > 0) {
    if (c.tiled_optimizer) {
      // The tiled step pays one more pass per tile: the extra launches are its whole cost.
      const double tiles = std::max(1.0, std::ceil(ex_owned / kOptimizerTileElems));
      const double tile_elems = ex_owned / tiles;
      w.optimizer_seconds += tiles * profile.kernel_seconds(KernelKind::adam, tile_elems * adam_bytes_per_param, Dtype::fp32);
    } else {
      w.optimizer_seconds += profile.kernel_seconds(KernelKind::adam, ex_owned * adam_bytes_per_param, Dtype::fp32);
    }
  }
  if (c.zero >= 1) {
    const double B = bytes_of(m.dtype);
    w.param_allgather_seconds =
        spans.data.seconds(profile, CollectiveOp::all_gather, w.nonexpert_params_rank * B) +
        (w.expert_params_rank > 0 ? spans.expert_data.seconds(profile, CollectiveOp::all_gather, w.expert_params_rank * B) : 0.0);
  }
  return w;
}

}  // namespace tedsim
