#include "tedsim/model/memory.hpp"

#include <algorithm>

#include "tedsim/spec/topology_spec.hpp"

namespace tedsim {
namespace {

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", for
// 2-byte activations, tensor parallelism and no sequence parallelism:
//   attention s*b*h*(3 + 8/t) + 5*a*s^2*b/t (two 2-byte tensors and a 1-byte mask per score),
//   layernorms 4*s*b*h, MLP s*b*h*3 + intermediates (16*s*b*h/t for F = 4h with GeLU).
// Scaled by act_bytes/2 for fp32 activations.
struct LayerActivations {
  double attention_and_norms, dense_mlp, moe_mlp, moe_transient, cac_dense, cac_moe;
};

LayerActivations layer_activations(const ModelSpec& m, const ParallelConfig& c, const StepShape& s) {
  const double sb = double(s.s) * s.b, h = m.hidden, t = s.t, a = m.heads, B = s.act_bytes;
  const double scale = B / 2.0;
  LayerActivations l{};
  l.attention_and_norms = scale * (sb * h * (3.0 + 8.0 / t) + 5.0 * a * s.s * sb / t + 4.0 * sb * h);
  const double fc1_factor = m.activation == Activation::swiglu ? 2.0 : 1.0;
  // fc1 output (fc1_factor * F/t) and activation output (F/t), both in activation precision.
  l.dense_mlp = scale * sb * h * 3.0 + sb * (fc1_factor + 1.0) * (double(m.ffn) / t) * B;
  const double T = double(s.tokens);
  l.cac_dense = 2.0 * T * h * B;
  if (m.is_moe()) {
    const double E = m.moe.experts, slots = E * double(s.capacity);
    const double rows = double(s.expert_rows) * s.local_experts;
    const double a2a = E * double(s.capacity_a2a) * h * B;
    const bool gathered = c.dtd && s.t > 1;
    // Saved for backward: MLP input and mask, fp32 gate probabilities, expert inputs, fc1 and
    // activation outputs, the combine input (its weights need it).
    l.moe_mlp = scale * sb * h * 3.0 + T * E * 4.0 + rows * h * B + rows * (fc1_factor + 1.0) * s.ffn_local * B +
                slots * h * B;
    // Transient: dispatch buffer, all-to-all receive buffers, expert output.
    l.moe_transient = slots * h * B + 2.0 * a2a + rows * h * B;
    // CAC keeps every collective's output: attention all-reduce (t > 1), both all-to-alls, the
    // expert all-reduce and DTD's all-gathers.
    l.cac_moe = (s.t > 1 ? T * h * B : 0.0) + (s.e > 1 ? 2.0 * a2a : 0.0) + (c.expert_tp && s.t > 1 ? rows * h * B : 0.0) +
                (gathered ? (c.expert_tp ? 2.0 : 1.0) * slots * h * B : 0.0);
  }
  if (s.t == 1) l.cac_dense = 0;  // no tensor all-reduces to stash
  return l;
}

}  // namespace

MemoryBreakdown estimate_memory(const ModelSpec& m, const ParallelConfig& c, const Workload& w,
                                const TopologySpec& topology) {
  const StepShape& s = w.shape;
  MemoryBreakdown mem;
  const double B = bytes_of(m.dtype);
  // Half-precision training keeps an fp32 master copy plus Adam's m and v (12 bytes per
  // parameter); fp32 training updates the weights in place and keeps m and v (8 bytes).
  const double opt_bytes = B == 4 ? 8.0 : 12.0;
  const double ne = w.nonexpert_params_rank, ex = w.expert_params_rank;
  const double opt_ne_shard = c.zero >= 1 ? s.d : 1, opt_ex_shard = c.zero >= 1 ? s.de : 1;
  const double grad_ne_shard = c.zero >= 2 ? s.d : 1, grad_ex_shard = c.zero >= 2 ? s.de : 1;
  mem.weights = (ne + ex) * B;
  mem.grads = ne * B / grad_ne_shard + ex * B / grad_ex_shard;
  mem.optimizer = ne * opt_bytes / opt_ne_shard + ex * opt_bytes / opt_ex_shard;

  const LayerActivations l = layer_activations(m, c, s);
  const double dense_full = l.attention_and_norms + l.dense_mlp;
  const double moe_full = l.attention_and_norms + l.moe_mlp;
  const double layer_input = double(s.tokens) * m.hidden * B;
  // The loss keeps fp32 softmax over this rank's vocabulary slice.
  const double logits = double(s.tokens) * (double(m.vocab) / s.t) * 4.0;
  if (c.checkpoint) {
    mem.activations = m.layers * layer_input + std::max(dense_full, m.is_moe() ? moe_full : 0.0) + logits;
    if (c.cac) mem.cac_stash = m.dense_layers() * l.cac_dense + m.moe_layers() * l.cac_moe;
  } else {
    mem.activations = m.dense_layers() * dense_full + m.moe_layers() * moe_full + logits;
  }
  mem.moe_buffers = m.is_moe() ? l.moe_transient : 0.0;
  // The step upcasts this rank's owned expert gradients to fp32; tiling bounds the buffer.
  const double ex_owned = ex / opt_ex_shard;
  if (B != 4) mem.optimizer_spike = 4.0 * (c.tiled_optimizer ? std::min(ex_owned, kOptimizerTileElems) : ex_owned);
  const double fixed = mem.weights + mem.grads + mem.optimizer;
  mem.peak = fixed + std::max(mem.activations + mem.moe_buffers + mem.cac_stash, mem.optimizer_spike);
  mem.capacity = (topology.device.memory_gib - topology.device.reserved_gib) * kGiB;
  return mem;
}

}  // namespace tedsim
