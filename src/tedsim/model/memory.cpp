#include "tedsim/model/memory.hpp"

#include <algorithm>

#include "tedsim/spec/pipeline_schedule.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace tedsim {

LayerActivationBytes layer_activation_bytes(const ModelSpec& m, const ParallelConfig& c, const StepShape& s,
                                            double fp8_input_bytes) {
  // Korthikanti et al. 2022 for 2-byte activations: per layer, attention 11sbh + 5as^2b, MLP 19sbh,
  // layernorms 4sbh. With tensor parallelism, the parts inside the tensor-parallel blocks divide by
  // t (attention 8sbh/t + 5as^2b/t, MLP 16sbh/t for F = 4h GeLU); the rest (the blocks' inputs 2sbh
  // each, their dropout masks sbh each, the layernorms' inputs 4sbh: 10sbh) divides by t only with
  // sequence parallelism. Selective recompute of the attention core drops 5as^2b/t; a fused
  // (flash) core never holds it.
  const double sb = double(s.s) * s.b / s.cp, h = m.hidden, t = s.t, a = m.heads, B = s.act_bytes;
  const double scale = B / 2.0;
  const double shard = s.sp ? t : 1.0;  // the replicated parts with SP
  const double block_input = scale * 2.0 * sb * h / shard;
  // A saved input of an FP8 linear (the FP8 copy), of anything else: activation precision.
  const bool fp8 = m.dtype == Dtype::fp8;
  const double Bq = fp8 ? fp8_input_bytes : B;
  const double linear_input = Bq * sb * h / shard;  // the norm's output, saved by qkv or fc1
  const double dropout_mask = scale * sb * h / shard;
  const double norm_inputs = scale * 4.0 * sb * h / shard;
  // What the attention core keeps for its backward: the query, key and value it was given and its
  // output (the output projection's input too), at their own widths per tensor rank. Multi-head
  // attention at head_dim = h / heads: 4h, Korthikanti's 8sbh/t in 2-byte elements. Grouped-query
  // attention keeps its fewer key and value heads (replicated up to one per rank). MLA's up
  // projections give every head a key of qk_head_dim (the nope part and the shared rope part) and
  // a value of v_head_dim; mla_up_proj recompute drops those three and recomputes them from the
  // latents, which MLA keeps beside: each compressed q and kv, before and after its norm (they are
  // replicated on every tensor rank), and the rope key.
  const double heads_local = double(m.heads) / t;
  double qkv_width = 0, latents = 0;
  if (m.is_mla()) {
    qkv_width = c.recomputes(kRecomputeMlaUpProj)
                    ? 0.0
                    : heads_local * (2.0 * m.mla.qk_head_dim() + m.mla.v_head_dim);
    latents = 2.0 * m.mla.q_lora_rank + 2.0 * m.mla.kv_lora_rank + m.mla.qk_rope_head_dim;
  } else {
    const double kv_local = std::max(1.0, double(m.kv_heads) / t);
    qkv_width = heads_local * m.head_dim() + 2.0 * kv_local * m.head_dim();
    // A q/k norm keeps its input, the query and the key before it, beside its output.
    if (m.qk_norm != QkNorm::none) qkv_width += heads_local * m.head_dim() + kv_local * m.head_dim();
  }
  const double out_width = heads_local * (m.is_mla() ? m.mla.v_head_dim : m.head_dim());
  // FP8: the output projection keeps its own FP8 copy of the core's output beside the core's bf16 one.
  const double attn_split = B * sb * (qkv_width + out_width + latents) + (fp8 ? Bq * sb * out_width : 0.0);
  // A fused (flash) core keeps no s x s tensor: only each row's fp32 log-sum-exp for its backward.
  const double attn_core = m.core_attention == AttentionKernel::flash ? 4.0 * a * sb / t : scale * 5.0 * a * s.s * sb / t;
  const double fc1_factor = m.activation == Activation::swiglu ? 2.0 : 1.0;
  // fc1 output (fc1_factor * F/t, for the activation's backward) and activation output (F/t, fc2's
  // input: its FP8 copy in FP8 training).
  const double mlp_inner = sb * (double(m.ffn) / t) * (fc1_factor * B + Bq);
  const bool ln = c.recomputes(kRecomputeLayernorm);
  // The norm's output that qkv (fused norm and linear) keeps; MLA's two down projections each keep
  // an FP8 copy of it, about the bf16 size of one.
  const double attn_input = m.is_mla() ? block_input : linear_input;

  LayerActivationBytes l;
  const double attention_full = attn_input + dropout_mask + attn_split + attn_core;
  const double attention = (ln ? 0.0 : attn_input) + dropout_mask + attn_split +
                           (c.recomputes(kRecomputeCoreAttn) ? 0.0 : attn_core);
  const double dense_mlp_full = linear_input + dropout_mask + mlp_inner;
  const double dense_mlp = c.recomputes(kRecomputeMlp) ? (ln ? 0.0 : linear_input) + dropout_mask
                                                       : (ln ? 0.0 : linear_input) + dropout_mask + mlp_inner;
  l.dense_full = norm_inputs + attention_full + dense_mlp_full;
  l.dense = norm_inputs + attention + dense_mlp;
  const double T = double(s.tokens);
  l.cac_dense = s.t > 1 ? 2.0 * T * h * B / shard : 0.0;  // the two tensor-parallel outputs
  if (m.is_moe()) {
    const double E = m.moe.experts, slots = E * double(s.capacity);
    const double router_tokens = s.sp ? T / t : T;
    const double rows = double(s.expert_rows) * s.local_experts;
    const double a2a = E * double(s.capacity_a2a) * h * B;
    const bool gathered = (c.dtd && s.t > 1) || s.sp;
    const double expert_act_out = rows * s.ffn_local * Bq;
    // gpt-oss's clamp (ModelSpec::activation_clamp) outside the fused GLU: the clamps keep fc1's
    // output for their gradient and the fused GLU its clamped copy, one more fc1 output; the fused
    // grouped MLP clamps in its epilogue.
    const double clamp_copy =
        m.activation_clamp > 0 && fc1_factor == 2 && !c.fused_grouped_mlp ? rows * fc1_factor * s.ffn_local * B : 0.0;
    // Saved for backward: the block's input (the router's, bf16: the MoE block's norm is not fused
    // into a linear) and dropout mask, fp32 gate probabilities, expert inputs, fc1 and activation
    // outputs, and where the combine weights the outputs its input (the weights' gradient needs
    // it; Megatron-Core weights inside the experts' activation instead, whose backward has the fc1
    // output already kept); FP8 linears' inputs as their FP8 copies.
    // Shared experts keep their fc1 and activation outputs like a dense MLP of their width (in FP8
    // also their own copy of the block's input).
    const double shared_width = double(m.shared_width()) / t;
    const double shared_inner = shared_width > 0 ? T * shared_width * (fc1_factor * B + Bq) + (fp8 ? T * h * Bq / shard : 0.0)
                                                 : 0.0;
    const double moe_inner = router_tokens * E * 4.0 + rows * h * Bq + rows * fc1_factor * s.ffn_local * B +
                             expert_act_out + clamp_copy + (c.moe_weights_at_combine ? slots * h * B : 0.0) + shared_inner;
    const double moe_full = block_input + dropout_mask + moe_inner;
    const double moe_kept =
        c.recomputes(kRecomputeMoe) ? (ln ? 0.0 : block_input) + dropout_mask
                                    : (ln ? 0.0 : block_input) + dropout_mask + moe_inner -
                                          (c.recomputes(kRecomputeMoeAct) ? expert_act_out + clamp_copy : 0.0);
    l.moe_full = norm_inputs + attention_full + moe_full;
    l.moe = norm_inputs + attention + moe_kept;
    // Transient: dispatch buffer, all-to-all receive buffers, expert output.
    l.moe_transient = slots * h * B + 2.0 * a2a + rows * h * B;
    // CAC keeps every collective's output: attention all-reduce (t > 1), both all-to-alls, the
    // expert all-reduce and DTD's all-gathers.
    l.cac_moe = (s.t > 1 ? T * h * B / shard : 0.0) + (s.e > 1 ? 2.0 * a2a : 0.0) +
                (c.expert_tp && s.t > 1 ? rows * h * B : 0.0) +
                (gathered ? (c.expert_tp ? 2.0 : 1.0) * slots * (s.sp ? t : 1.0) * h * B : 0.0);
  }
  return l;
}

namespace {

struct StageParams {
  double nonexpert = 0, expert = 0;
  double largest_layer = 0;  // one layer's parameters (ZeRO-3's gathered buffer)
};

StageParams stage_params(const ModelSpec& m, const Workload& w, const StageMap& map, int stage) {
  StageParams p;
  for (int v = 0; v < map.vpp; ++v) {
    const ModelChunk& c = map.chunk(stage, v);
    for (int layer = c.first_layer; layer < c.first_layer + c.layers; ++layer) {
      const LayerBlocks& l = w.layer_blocks(m, layer);
      p.nonexpert += l.nonexpert_grad_elems;
      p.expert += l.expert_grad_elems;
      p.largest_layer = std::max(p.largest_layer, l.nonexpert_grad_elems + l.expert_grad_elems);
    }
    if (c.embedding) p.nonexpert += w.embedding_grad_elems;
    if (c.head) p.nonexpert += w.head_grad_elems;
    if (c.mtp_layers > 0) {  // each module: its entry and a layer of the last layer's kind
      const LayerBlocks& l = w.layer_blocks(m, m.layers - 1);
      p.nonexpert += c.mtp_layers * (w.mtp_grad_elems + l.nonexpert_grad_elems);
      p.expert += c.mtp_layers * l.expert_grad_elems;
    }
  }
  return p;
}

}  // namespace

MemoryBreakdown estimate_memory(const ModelSpec& m, const ParallelConfig& c, const Workload& w, const TopologySpec& topology,
                                const StageMap& map, std::vector<MemoryBreakdown>* stages) {
  const StepShape& s = w.shape;
  const double B = bytes_of(storage_dtype(m.dtype));
  // Half-precision training keeps an fp32 master copy plus Adam's m and v (12 bytes per
  // parameter, 8 with bf16 moments); fp32 training updates the weights in place and keeps m and v.
  const double opt_bytes = (B == 4 ? 0.0 : 4.0) + 2.0 * bytes_of(c.adam_moments);
  const double opt_ne_shard = c.zero >= 1 ? s.d : 1, opt_ex_shard = c.zero >= 1 ? s.de : 1;
  const double grad_ne_shard = c.zero >= 2 ? s.d : 1, grad_ex_shard = c.zero >= 2 ? s.de : 1;
  const double weight_ne_shard = c.zero >= 3 ? s.d : 1, weight_ex_shard = c.zero >= 3 ? s.de : 1;
  const double fp8_input_bytes = topology.device.fp8_recipe == Fp8Recipe::mxfp8 ? 1.0 + 1.0 / 32.0 : 1.0;
  const LayerActivationBytes l = layer_activation_bytes(m, c, s, fp8_input_bytes);
  const double layer_input = double(s.tokens) * m.hidden * B / (s.sp ? s.t : 1);
  // The loss keeps fp32 softmax over this rank's vocabulary slice.
  const double logits = double(s.tokens) * (double(m.vocab) / s.t) * 4.0;
  const double capacity = (topology.device.memory_gib - topology.device.reserved_gib) * kGiB;

  MemoryBreakdown worst;
  worst.peak = -1;
  if (stages) stages->clear();
  std::vector<double> kept(std::size_t(map.vpp)), with_stash(std::size_t(map.vpp));
  for (int stage = 0; stage < map.pp; ++stage) {
    const StageParams p = stage_params(m, w, map, stage);
    MemoryBreakdown mem;
    mem.capacity = capacity;
    mem.weights = p.nonexpert * B / weight_ne_shard + p.expert * B / weight_ex_shard;
    if (c.zero >= 3) mem.weights += 2.0 * p.largest_layer * B;  // the layer in use and the one prefetched
    mem.grads = p.nonexpert * B / grad_ne_shard + p.expert * B / grad_ex_shard;
    mem.optimizer = p.nonexpert * opt_bytes / opt_ne_shard + p.expert * opt_bytes / opt_ex_shard;

    // What one micro-batch keeps per chunk until its backward, and the transient of recomputing.
    bool has_moe = false, has_head = false;
    double recompute_transient = 0, largest_layer = 0, largest_layer_with_stash = 0;
    for (int v = 0; v < map.vpp; ++v) {
      const ModelChunk& chunk = map.chunk(stage, v);
      double bytes = 0, stash = 0;
      // The multi-token-prediction modules' layers (of the last layer's kind) keep theirs too.
      for (int i = 0; i < chunk.layers + chunk.mtp_layers; ++i) {
        const int layer = i < chunk.layers ? chunk.first_layer + i : m.layers - 1;
        const bool moe = m.is_moe_layer(layer);
        has_moe |= moe;
        double layer_bytes = 0, layer_stash = 0;
        if (c.full_recompute()) {
          layer_bytes = layer_input;
          if (c.cac) layer_stash = moe ? l.cac_moe : l.cac_dense;
          recompute_transient = std::max(recompute_transient, moe ? l.moe_full : l.dense_full);
        } else {
          layer_bytes = moe ? l.moe : l.dense;
          if (c.recompute == Recompute::selective)
            recompute_transient = std::max(recompute_transient, (moe ? l.moe_full - l.moe : l.dense_full - l.dense));
        }
        bytes += layer_bytes;
        stash += layer_stash;
        largest_layer = std::max(largest_layer, layer_bytes);
        largest_layer_with_stash = std::max(largest_layer_with_stash, layer_bytes + layer_stash);
      }
      has_head |= chunk.head;
      kept[std::size_t(v)] = bytes;
      with_stash[std::size_t(v)] = bytes + stash;
    }
    // The schedule's warm-up forwards and one more are in flight at the peak (1F1B: min(P - p, m)
    // micro-batches); chunks of different sizes make it depend on which ones. The expert
    // all-to-all overlap's merged steps warm up one forward more, and then run each forward beside
    // a backward layer by layer, holding one layer more than the backward has freed.
    const bool merged = c.moe_a2a_overlap;
    const double in_flight = peak_in_flight_bytes(stage, map.pp, map.vpp, s.ga, kept.data(), merged, largest_layer);
    const double in_flight_with_stash =
        c.cac ? peak_in_flight_bytes(stage, map.pp, map.vpp, s.ga, with_stash.data(), merged, largest_layer_with_stash)
              : in_flight;
    mem.activations = in_flight + recompute_transient + (has_head ? logits : 0.0);
    mem.cac_stash = in_flight_with_stash - in_flight;
    mem.moe_buffers = has_moe ? l.moe_transient : 0.0;
    // Each boundary a stage touches holds a receive buffer and a send buffer, for activations and
    // for their gradients.
    if (map.pp > 1) mem.pipeline_buffers = 4.0 * w.p2p_bytes;
    // The step upcasts this rank's owned expert gradients to fp32; tiling bounds the buffer.
    const double ex_owned = p.expert / opt_ex_shard;
    if (B != 4) mem.optimizer_spike = 4.0 * (c.tiled_optimizer ? std::min(ex_owned, kOptimizerTileElems) : ex_owned);
    const double fixed = mem.weights + mem.grads + mem.optimizer;
    mem.peak = fixed + std::max(mem.activations + mem.moe_buffers + mem.cac_stash + mem.pipeline_buffers,
                                mem.optimizer_spike);
    if (mem.peak > worst.peak) worst = mem;
    if (stages) stages->push_back(mem);
  }
  return worst;
}

MemoryBreakdown estimate_memory(const ModelSpec& m, const ParallelConfig& c, const Workload& w,
                                const TopologySpec& topology) {
  return estimate_memory(m, c, w, topology, build_stage_map(m.layers, c.pp, c.vpp, c.pipeline_layout, m.mtp_layers));
}

}  // namespace tedsim
