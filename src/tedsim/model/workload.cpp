#include "tedsim/model/workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "tedsim/model/host_launch.hpp"
#include "tedsim/model/layer_ops.hpp"

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
    case Phase::pp_bubble: return "pp_bubble";
    case Phase::pp_p2p: return "pp_p2p";
    case Phase::host_launch: return "host_launch";
    case Phase::cp_ring: return "cp_ring";
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

double busiest_rank_load(int experts, int ep, double imbalance) {
  if (experts <= 1 || ep <= 1) return 1.0;  // one rank holds every expert: all the tokens, no more
  const double E = experts, local = E / double(ep);
  const double others = (E - imbalance) / (E - 1.0);  // each other expert's share of the rest
  return (imbalance + (local - 1.0) * others) / local;
}

double imbalance_for_rank_load(int experts, int ep, double rank_load) {
  if (experts <= 1 || ep <= 1) return 1.0;
  const double E = experts, local = E / double(ep);
  // busiest_rank_load solved for the imbalance: linear in it.
  const double imbalance = (rank_load * local * (E - 1.0) - (local - 1.0) * E) / (E - local);
  return std::clamp(imbalance, 1.0, E);
}

StepShape resolve_shape(const ModelSpec& m, const ParallelConfig& c) {
  StepShape s;
  s.t = c.tp;
  s.e = c.ep;
  s.p = c.pp;
  s.v = c.vpp;
  s.d = c.dp_with_cp();
  s.cp = c.cp;
  s.de = c.dp_expert();
  s.b = c.micro_batch;
  s.s = c.seq_len > 0 ? c.seq_len : m.seq_len;
  s.ga = c.grad_accum();
  s.sp = c.sequence_parallel && c.tp > 1;
  s.tokens = std::int64_t(s.b) * s.s / s.cp;
  s.dtype = m.dtype;
  s.act_bytes = bytes_of(storage_dtype(m.dtype));
  if (m.is_moe()) {
    const double E = m.moe.experts;
    s.local_experts = m.moe.experts / s.e;
    // With sequence parallelism the router sees this rank's s/t tokens and capacity follows them.
    const std::int64_t router_tokens = s.sp ? (s.tokens + s.t - 1) / s.t : s.tokens;
    if (m.moe.dropless()) {
      // Dropless: each expert gets k T / E tokens from each source rank on average; the busiest
      // expert `imbalance` times that. The rank holding it (busiest_rank_load) sets everyone's
      // pace: C is its per expert average, so the all-to-all, the grouped GEMM and the buffers
      // are the busiest rank's.
      // Measured routing (MoeSpec::measured_shares) gives the busiest rank's load directly.
      s.load_factor = m.moe.measured_shares.empty() ? busiest_rank_load(m.moe.experts, s.e, m.moe.imbalance)
                                                    : m.moe.measured_shares.busiest_rank_load(s.e);
      s.capacity = std::max<std::int64_t>(1, std::int64_t(std::ceil(m.moe.top_k * double(router_tokens) / E * s.load_factor)));
    } else {
      s.capacity = std::max<std::int64_t>(
          std::int64_t(std::ceil(m.moe.top_k * m.moe.capacity_factor * double(router_tokens) / E)), m.moe.min_capacity);
    }
    s.capacity_a2a = (c.dtd && s.t > 1 && !s.sp) ? (s.capacity + s.t - 1) / s.t : s.capacity;
    // With expert TP every tensor rank runs all tokens of its experts on a 1/t slice of F (after
    // DTD's or SP's gather: with SP, all t ranks' C each); without it experts are whole and each
    // tensor rank runs the C' tokens it received.
    const std::int64_t rows_per_source = c.expert_tp ? (s.sp ? s.t * s.capacity : s.capacity) : s.capacity_a2a;
    s.expert_rows = std::int64_t(s.e) * rows_per_source;
    s.ffn_local = c.expert_tp ? m.expert_ffn() / s.t : m.expert_ffn();
  }
  return s;
}

namespace {

// Sequence parallelism's backward swaps each all-gather with a reduce-scatter of the same bytes.
const char* sp_backward_name(const char* forward) {
  static const char* const pairs[][2] = {{"sp_allgather_attn", "sp_reducescatter_attn_bwd"},
                                         {"sp_reducescatter_attn", "sp_allgather_attn_bwd"},
                                         {"sp_allgather_mlp", "sp_reducescatter_mlp_bwd"},
                                         {"sp_reducescatter_mlp", "sp_allgather_mlp_bwd"},
                                         {"sp_allgather_expert", "sp_reducescatter_expert_bwd"},
                                         {"sp_reducescatter_expert", "sp_allgather_expert_bwd"},
                                         {"sp_allgather_shared", "sp_reducescatter_shared_bwd"},
                                         {"sp_reducescatter_shared", "sp_allgather_shared_bwd"},
                                         {"sp_allgather_mtp", "sp_reducescatter_mtp_bwd"}};
  for (const auto& p : pairs)
    if (std::strcmp(forward, p[0]) == 0) return p[1];
  return forward;
}

// Backward mirrors the forward in reverse: a GEMM becomes its data-gradient and weight-gradient
// GEMMs (2x FLOPs); a memory-bound kernel reads the saved input and the incoming gradient and
// writes a gradient (2x bytes); every collective has a mirror of the same size (all-reduce <->
// all-reduce of Megatron's f/g pair, all-to-all <-> all-to-all, DTD drop <-> gather, SP
// all-gather <-> reduce-scatter).
void mirror_backward(const Block& forward, Block& backward, const Profile& profile, const GroupSpans& spans) {
  for (int i = forward.count - 1; i >= 0; --i) {
    const Op& f = forward.ops[i];
    if (f.forward_only) continue;
    if (f.is_collective) {
      Op b = f;
      b.host_sync = false;  // backward reuses the forward's sizes: nothing to read back
      // Context parallelism's ring sends the keys' and values' gradients beside them (twice the
      // bytes), under the backward core's steps but its first.
      if (f.group == GroupKind::context && backward.count > 0 && backward.ops[backward.count - 1].is_attention) {
        const SpanSet& ring = spans.of(GroupKind::context);
        const double cp = double(ring.widest().ranks);
        b.bytes = 2.0 * f.bytes;
        b.seconds = std::max(0.0, ring.seconds(profile, f.collective, b.bytes) -
                                      backward.ops[backward.count - 1].seconds * (cp - 1.0) / cp);
      }
      const bool sp = std::strncmp(f.name, "sp_", 3) == 0;
      if (sp && (f.collective == CollectiveOp::all_gather || f.collective == CollectiveOp::reduce_scatter)) {
        b.name = sp_backward_name(f.name);
        b.collective = f.collective == CollectiveOp::all_gather ? CollectiveOp::reduce_scatter : CollectiveOp::all_gather;
        b.phase = b.collective == CollectiveOp::all_gather ? Phase::tp_allgather : Phase::tp_allreduce;
        b.seconds = spans.of(b.group).seconds(profile, b.collective, b.bytes);
      }
      backward.add(b);
    } else if (f.is_attention) {
      // The fused or measured core's backward: its own rates (a flash backward recomputes the
      // scores inside), twice the forward's FLOPs as the GEMM count gives them.
      Op grad = f;
      grad.flops = 2.0 * f.flops;
      grad.seconds = profile.attention_seconds(f.attention_kernel, true, f.attention_shape());
      backward.add(grad);
    } else if (f.flops > 0) {
      // Y[m,n] = X[m,k] W[k,n]: dX[m,k] = dY[m,n] W^T (shape m,k,n); dW[k,n] = X^T dY (shape k,n,m).
      const GemmShape& g = f.gemm;
      Op dgrad = f, wgrad = f;
      dgrad.host_sync = wgrad.host_sync = false;
      dgrad.gemm = GemmShape{g.m, g.k, g.n, g.batch, g.dtype, g.grouped};
      wgrad.gemm = GemmShape{g.k, g.n, g.m, g.batch, g.dtype, g.grouped};
      dgrad.seconds = profile.gemm_seconds(tiled_shape(dgrad.gemm, f.output_tile));
      wgrad.seconds = profile.gemm_seconds(tiled_shape(wgrad.gemm, f.output_tile));
      dgrad.quantize_bytes = wgrad.quantize_bytes = 0;
      // FP8: the output gradient is quantized once, before the data-gradient GEMM; the weight
      // gradient takes the input's column-wise copy, quantized in forward.
      if (f.dgrad_quantize) {
        const Fp8Quantize q = profile.fp8_quantize();
        dgrad.quantize_bytes = q.bytes(false) * double(g.m) * double(g.n) * double(g.batch);
        dgrad.seconds += fp8_quantize_seconds(profile, q, double(g.m) * double(g.n), double(g.batch), false);
      }
      backward.add(dgrad);
      // Sequence parallelism keeps the GEMM's input sharded: the weight gradient needs it gathered
      // again, which Megatron-Core overlaps with the data-gradient GEMM; what that does not cover
      // is exposed.
      const Op* before = i > 0 ? &forward.ops[i - 1] : nullptr;
      if (before && before->is_collective && before->collective == CollectiveOp::all_gather &&
          std::strncmp(before->name, "sp_allgather", 12) == 0 && before->seconds > dgrad.seconds) {
        Op regather = *before;
        regather.name = "sp_regather_for_wgrad";
        regather.seconds = before->seconds - dgrad.seconds;
        backward.add(regather);
      }
      backward.add(wgrad);
    } else {
      Op grad = f;
      grad.host_sync = false;
      grad.bytes = f.backward_bytes >= 0 ? f.backward_bytes : 2.0 * f.bytes;
      if (f.backward_host_calls >= 0) grad.host_calls = f.backward_host_calls;
      grad.seconds = profile.kernel_seconds(f.kernel, grad.bytes, f.gemm.dtype);
      backward.add(grad);
    }
  }
}

// Full recompute replays the whole forward (CAC: without its collectives, whose outputs were
// stashed, but for context parallelism's ring, whose gathered keys and values CAC does not keep);
// selective recompute replays the chosen modules' ops, their collectives included.
void recompute_from(const Block& forward, Block& recompute, const ParallelConfig& c) {
  for (int i = 0; i < forward.count; ++i) {
    const Op& op = forward.ops[i];
    const bool stashed = c.cac && op.is_collective && op.group != GroupKind::context;
    const bool chosen = c.full_recompute() ? !stashed
                                           : c.recompute == Recompute::selective && (op.module & c.recompute_modules) != 0;
    if (chosen) recompute.add(op);
  }
}

// ZeRO-3: the layer's parameters are all-gathered before its forward and again before its
// backward, prefetched while the previous layer computes; what the compute does not cover stays
// exposed on the compute stream. Without prefetch (a step that gathers each layer's parameters
// just before it uses them, as tedsim's CPU step does) the gathers are wholly exposed, and the
// layer's gradients are reduce-scattered at the end of its backward, blocking, every micro-batch.
void add_zero3_collectives(LayerBlocks& layer, const Workload& w, const GroupSpans& spans, const Profile& profile,
                       bool prefetch) {
  const double B = w.param_bytes;
  const double gather = spans.data.seconds(profile, CollectiveOp::all_gather, layer.nonexpert_grad_elems * B) +
                        (layer.expert_grad_elems > 0
                             ? spans.expert_data.seconds(profile, CollectiveOp::all_gather, layer.expert_grad_elems * B)
                             : 0.0);
  if (gather <= 0) return;
  for (Block* block : {&layer.forward, &layer.backward}) {
    const double compute = block->seconds + (block == &layer.backward ? layer.recompute.seconds : 0.0);
    const double exposed = prefetch ? std::max(0.0, gather - compute) : gather;
    (block == &layer.backward ? layer.zero3_hidden_backward_s : layer.zero3_hidden_forward_s) += gather - exposed;
    if (exposed > 0) {
      Op op;
      op.name = "zero3_param_allgather";
      op.phase = Phase::dp_grad_sync;
      op.seconds = exposed;
      op.is_collective = true;
      op.collective = CollectiveOp::all_gather;
      op.group = GroupKind::data;
      block->add(op);
    }
  }
  if (prefetch) return;
  Op op;
  op.name = "zero3_grad_reducescatter";
  op.phase = Phase::dp_grad_sync;
  op.seconds = w.nonexpert_sync_seconds(layer.nonexpert_grad_elems) +
               (layer.expert_grad_elems > 0 ? w.expert_sync_seconds(layer.expert_grad_elems) : 0.0);
  op.is_collective = true;
  op.collective = CollectiveOp::reduce_scatter;
  op.group = GroupKind::data;
  layer.backward.add(op);
  layer.grads_synced_in_backward = true;
}

void finish_layer(LayerBlocks& layer, const Workload& w, const Profile& profile, const GroupSpans& spans,
                  const ParallelConfig& c) {
  if (c.recompute != Recompute::none) recompute_from(layer.forward, layer.recompute, c);
  mirror_backward(layer.forward, layer.backward, profile, spans);
  if (c.zero >= 3) add_zero3_collectives(layer, w, spans, profile, c.zero3_prefetch);
  add_host_launch_wait(layer.forward, profile.host_op_seconds(), c.cuda_graph_scopes);
  add_host_launch_wait(layer.recompute, layer.backward, profile.host_op_seconds(), c.cuda_graph_scopes);
}

double adam_seconds(const Profile& profile, double params, double bytes_per_param) {
  return profile.kernel_seconds(KernelKind::adam, params * bytes_per_param, Dtype::fp32);
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

// Adam moves ~32 bytes per parameter: fp32 master weight, m, v read and written (24), the gradient
// upcast (4 + 2) and the updated half-precision weight (2); bf16 moments take 8 of it off.
double Workload::optimizer_seconds(double nonexpert, double expert) const {
  const double ne_owned = nonexpert / (zero >= 1 ? shape.d : 1);
  const double ex_owned = expert / (zero >= 1 ? shape.de : 1);
  const double per_param = (shape.act_bytes == 4 ? 28.0 : 32.0) - 4.0 * (4 - moment_bytes);
  double seconds = adam_seconds(*profile, ne_owned, per_param);
  if (ex_owned > 0) {
    if (tiled_optimizer) {
      // The tiled step pays one more pass per tile: the extra launches are its whole cost.
      const double tiles = std::max(1.0, std::ceil(ex_owned / kOptimizerTileElems));
      seconds += tiles * adam_seconds(*profile, ex_owned / tiles, per_param);
    } else {
      seconds += adam_seconds(*profile, ex_owned, per_param);
    }
  }
  return seconds;
}

// ZeRO-1/2 all-gather the updated parameters; ZeRO-3 gathers them per layer when they are used.
double Workload::param_allgather_seconds(double nonexpert, double expert) const {
  if (zero < 1 || zero >= 3) return 0.0;
  return spans.data.seconds(*profile, CollectiveOp::all_gather, nonexpert * param_bytes) +
         (expert > 0 ? spans.expert_data.seconds(*profile, CollectiveOp::all_gather, expert * param_bytes) : 0.0);
}

void Block::clear() {
  count = 0;
  seconds = 0;
  flops = 0;
  phase_seconds = PhaseTimes{};
}

void LayerBlocks::clear() {
  forward.clear();
  recompute.clear();
  backward.clear();
  nonexpert_grad_elems = expert_grad_elems = zero3_hidden_forward_s = zero3_hidden_backward_s = 0;
  grads_synced_in_backward = false;
}

Workload build_workload(const ModelSpec& m, const ParallelConfig& c, const Profile& profile, const GroupSpans& spans) {
  Workload w;
  build_workload_into(w, m, c, profile, spans);
  return w;
}

void build_workload_into(Workload& w, const ModelSpec& m, const ParallelConfig& c, const Profile& profile,
                         const GroupSpans& spans) {
  // Every field is set below or cleared here: `w` may hold another configuration's workload.
  for (LayerBlocks* l : {&w.dense, &w.moe, &w.dense_window, &w.moe_window}) l->clear();
  for (Block* b : {&w.embedding_forward, &w.embedding_backward, &w.head_forward, &w.head_backward, &w.mtp_forward,
                   &w.mtp_backward})
    b->clear();
  w.mtp_grad_elems = 0;
  w.p2p_bytes = w.p2p_seconds = w.tied_embedding_sync_seconds = 0;
  w.profile = &profile;
  w.spans = spans;
  w.zero = c.zero;
  w.tiled_optimizer = c.tiled_optimizer;
  w.moment_bytes = bytes_of(c.adam_moments);
  w.shape = resolve_shape(m, c);
  w.grad_bytes = bytes_of(storage_dtype(m.dtype));
  w.param_bytes = bytes_of(storage_dtype(m.dtype));
  const StepShape& s = w.shape;
  LayerDims d = layer_dims(m, s);
  d.fp8_attention = c.fp8_attention;

  // Parameters per rank. Non-expert parameters are split over the tensor group (vocabulary-parallel
  // embedding, Megatron attention and MLP); experts over tensor (when expert TP) and expert groups.
  const double t = s.t;
  const double expert_split = c.expert_tp ? t * s.e : double(s.e);
  const double attn_rank = (m.attention_params() + 2.0 * m.norm_params()) / t;
  w.dense.nonexpert_grad_elems = attn_rank + m.mlp_params() / t;
  if (m.is_moe()) {
    w.moe.nonexpert_grad_elems = attn_rank + (m.router_params() + m.shared_expert_params()) / t;
    w.moe.expert_grad_elems = double(m.moe.experts) * m.mlp_params(m.expert_ffn()) / expert_split;
  }
  const double embedding_rank = double(m.vocab) * m.hidden / t;
  w.embedding_grad_elems = embedding_rank;
  // The last stage holds the final norm and the LM head: its own weights when untied; when tied,
  // a one-stage run shares the embedding, a pipeline keeps a copy on its last stage (Megatron).
  // Multi-token prediction looks the next tokens up there too: an untied pipeline keeps a copy of
  // the embedding on its last stage for them.
  const bool embedding_copy = s.p > 1 && (m.tie_embeddings || m.mtp_layers > 0);
  w.head_grad_elems = m.norm_params() / t + ((!m.tie_embeddings || s.p > 1) ? embedding_rank : 0.0) +
                      (embedding_copy && !m.tie_embeddings ? embedding_rank : 0.0);
  w.nonexpert_params_rank = m.nonexpert_params() / t;
  w.expert_params_rank = m.expert_params() / expert_split;

  // A dense and an MoE layer kind, each priced with these dims (the attention's window among them).
  const auto build_layers = [&](LayerBlocks& dense, LayerBlocks& moe, const LayerDims& dims) {
    {
      BlockBuilder x(dense.forward, profile, spans, s.dtype);
      attention_forward(x, dims);
      dense_mlp_forward(x, dims);
      finish_layer(dense, w, profile, spans, c);
    }
    if (m.is_moe()) {
      BlockBuilder x(moe.forward, profile, spans, s.dtype);
      attention_forward(x, dims);
      moe_forward(x, dims, s, m, c);
      finish_layer(moe, w, profile, spans, c);
    }
  };
  build_layers(w.dense, w.moe, d);
  w.windowed = m.sliding_window > 0 && m.sliding_window < s.s;
  if (w.windowed) {
    LayerDims dw = d;
    dw.window = m.sliding_window;
    w.dense_window.nonexpert_grad_elems = w.dense.nonexpert_grad_elems;
    w.moe_window.nonexpert_grad_elems = w.moe.nonexpert_grad_elems;
    w.moe_window.expert_grad_elems = w.moe.expert_grad_elems;
    build_layers(w.dense_window, w.moe_window, dw);
  }
  {
    BlockBuilder ef(w.embedding_forward, profile, spans, s.dtype);
    embedding_forward(ef, d);
    BlockBuilder hf(w.head_forward, profile, spans, s.dtype);
    head_forward(hf, d, m, s);
    BlockBuilder hb(w.head_backward, profile, spans, s.dtype);
    head_backward(hb, d, m, s);
    BlockBuilder eb(w.embedding_backward, profile, spans, s.dtype);
    embedding_backward(eb, d);
    for (Block* b : {&w.embedding_forward, &w.head_forward, &w.head_backward, &w.embedding_backward})
      add_host_launch_wait(*b, profile.host_op_seconds(), c.cuda_graph_scopes);
  }
  if (m.mtp_layers > 0) {
    BlockBuilder mf(w.mtp_forward, profile, spans, s.dtype);
    mtp_entry_forward(mf, d, s);
    // Backward: eh_proj's own pair of gradients (mirrored from its input gather and GEMM alone),
    // between the collectives and kernels of the entry's other parts (layer_ops.hpp).
    Block projection;
    BlockBuilder pf(projection, profile, spans, s.dtype);
    mtp_projection_forward(pf, d, s);
    Block projection_backward;
    mirror_backward(projection, projection_backward, profile, spans);
    BlockBuilder mb(w.mtp_backward, profile, spans, s.dtype);
    mtp_entry_backward(mb, d, s, projection_backward);
    for (Block* b : {&w.mtp_forward, &w.mtp_backward}) add_host_launch_wait(*b, profile.host_op_seconds(), c.cuda_graph_scopes);
    // eh_proj (split over the tensor group) and the module's three norms; the embedding and the
    // output layer are the model's own.
    w.mtp_grad_elems = 2.0 * double(m.hidden) * m.hidden / t + 3.0 * m.norm_params() / t;
  }
  if (s.p > 1) {
    w.p2p_bytes = double(d.T_local) * d.h * d.B;
    w.p2p_seconds = profile.p2p_seconds(spans.p2p, w.p2p_bytes);
    if (embedding_copy) {  // the copy's gradient summed with the first stage's
      GroupSpan ends = spans.p2p;  // first and last stage: placed at least as far apart as neighbours
      w.tied_embedding_sync_seconds = profile.collective_seconds(CollectiveOp::all_reduce, ends, embedding_rank * w.grad_bytes);
    }
  }

  const double dense_layers = m.dense_layers(), moe_layers = m.moe_layers();
  auto pass_flops = [&](const LayerBlocks& l, bool with_recompute) {
    return l.forward.flops + l.backward.flops + (with_recompute ? l.recompute.flops : 0.0);
  };
  const double head = w.embedding_forward.flops + w.head_forward.flops + w.head_backward.flops + w.embedding_backward.flops;
  w.flops_per_microbatch = dense_layers * pass_flops(w.dense, true) + moe_layers * pass_flops(w.moe, true) + head;
  // Model FLOPs count the model's work once. Every tensor rank runs the gate on all T tokens
  // (without SP), and without expert TP, DTD and SP also the same expert GEMMs on the same tokens
  // (whole F, all C rows): hardware FLOPs (above), but one tensor group's work, of which this
  // rank's share is 1/t.
  const bool gate_replicated = m.is_moe() && s.t > 1 && !s.sp;
  const bool experts_replicated = gate_replicated && !c.expert_tp && !c.dtd;
  auto replicated_flops = [&](const Block& b) {
    double f = 0;
    for (int i = 0; i < b.count; ++i) {
      const char* name = b.ops[i].name;
      const bool expert_gemm = std::strcmp(name, "expert_fc1") == 0 || std::strcmp(name, "expert_fc2") == 0;
      if ((gate_replicated && std::strcmp(name, "gate") == 0) || (experts_replicated && expert_gemm)) f += b.ops[i].flops;
    }
    return f;
  };
  const double moe_duplicates =
      (replicated_flops(w.moe.forward) + replicated_flops(w.moe.backward)) * (1.0 - 1.0 / double(s.t));
  // Dropless: the busiest rank's expert GEMMs run load_factor times the mean tokens; the model's
  // work is the mean.
  auto expert_flops = [](const Block& b) {
    double f = 0;
    for (int i = 0; i < b.count; ++i)
      if (std::strncmp(b.ops[i].name, "expert_fc", 9) == 0) f += b.ops[i].flops;
    return f;
  };
  const double imbalance_excess = s.load_factor > 1.0 ? (expert_flops(w.moe.forward) + expert_flops(w.moe.backward)) *
                                                            (1.0 - 1.0 / s.load_factor)
                                                      : 0.0;
  w.model_flops_per_microbatch = dense_layers * pass_flops(w.dense, false) +
                                 moe_layers * (pass_flops(w.moe, false) - moe_duplicates - imbalance_excess) + head;
  if (m.mtp_layers > 0) {
    // Each module: its entry, a layer of the last layer's kind, the shared head and its loss.
    const bool moe_last = m.is_moe_layer(m.layers - 1);
    const LayerBlocks& last = moe_last ? w.moe : w.dense;
    const double module = w.mtp_forward.flops + w.mtp_backward.flops + w.head_forward.flops + w.head_backward.flops;
    w.flops_per_microbatch += m.mtp_layers * (pass_flops(last, true) + module);
    w.model_flops_per_microbatch +=
        m.mtp_layers * (pass_flops(last, false) - (moe_last ? moe_duplicates + imbalance_excess : 0.0) + module);
  }
}

}  // namespace tedsim
