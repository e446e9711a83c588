#include "tedsim/profile/analytic_profile.hpp"

#include <algorithm>
#include <cmath>

#include "tedsim/core/error.hpp"
#include "tedsim/profile/collective_table.hpp"

namespace tedsim {

AnalyticProfile::AnalyticProfile(const TopologySpec& topology)
    : topo_(topology),
      gemm_by_flops_(topology.gemm_efficiency_by_flops),
      gemm_by_min_dim_(topology.gemm_efficiency_by_min_dim),
      memory_by_bytes_(topology.memory_efficiency_by_bytes),
      fp8_scale_by_flops_(topology.fp8_gemm_scale_by_flops),
      launch_s_(topology.device.kernel_launch_us * kMicro) {
  for (int i = 0; i < 2; ++i) {
    flash_forward_[i] = LogCurve(topology.attention.flash_forward[i]);
    flash_backward_[i] = LogCurve(topology.attention.flash_backward[i]);
    fp8_forward_[i] = LogCurve(topology.attention.fp8_forward[i]);
    fp8_backward_[i] = LogCurve(topology.attention.fp8_backward[i]);
    unfused_[i] = LogCurve(topology.attention.unfused[i]);
  }
}

double AnalyticProfile::gemm_seconds(const GemmShape& s) const {
  if (s.m <= 0 || s.n <= 0 || s.k <= 0 || s.batch <= 0) return 0.0;
  const double peak = topo_.device.peak_tflops_of(s.dtype) * kTera;
  if (peak <= 0)
    throw InputError("topology '" + topo_.name + "': device " + topo_.device.name + " has no " +
                     to_string(s.dtype) + " peak (add peak_tflops." + to_string(s.dtype) +
                     " or use another --dtype)");
  const double flops = s.flops();
  const double min_dim = double(std::min({s.m, s.n, s.k}));
  // Efficiency of one product of the batch: a batch of small GEMMs is not a big GEMM.
  double efficiency = gemm_by_flops_(flops / double(s.batch)) * gemm_by_min_dim_(min_dim);
  if (s.dtype == Dtype::fp8 && !fp8_scale_by_flops_.empty()) efficiency *= fp8_scale_by_flops_(flops / double(s.batch));
  // The device's FP8 training recipe: block-scaled MXFP8 GEMMs against the per-tensor curve.
  if (s.dtype == Dtype::fp8) efficiency *= topo_.mxfp8_gemm_scale;
  // A MoE layer's grouped experts in FP8 (GemmShape::grouped), against the per-tensor curve.
  if (s.dtype == Dtype::fp8 && s.grouped) efficiency *= topo_.fp8_grouped_gemm_scale;
  return flops / (peak * efficiency) + launch_s_;
}

double AnalyticProfile::kernel_seconds(KernelKind, double bytes, Dtype) const {
  if (bytes <= 0) return 0.0;
  const double bandwidth = topo_.device.memory_bandwidth_gbs * kGB * memory_by_bytes_(bytes);
  return bytes / bandwidth + launch_s_;
}

double AnalyticProfile::rate_at(const LogCurve (&curves)[2], double head_dim, double seq) {
  if (curves[0].empty()) return curves[1](seq);
  if (curves[1].empty()) return curves[0](seq);
  const double lo = AttentionRates::kHeadDims[0], hi = AttentionRates::kHeadDims[1];
  const double f = std::clamp(std::log(head_dim / lo) / std::log(hi / lo), 0.0, 1.0);
  return (1 - f) * curves[0](seq) + f * curves[1](seq);
}

// The tables' FLOPs are FlashAttention's benchmark's: a fused kernel skips the masked half of the
// square, so its causal rates count half of it; an unfused core computes the whole square whatever
// the mask, so its table holds rates over the whole square (the benchmark's non-causal bars). The
// unfused table is forward + backward (3.5x the forward's FLOPs at one rate): each pass takes its
// FLOP share. MLA's query-key and value head sizes differ: the rate of their mean.
double AnalyticProfile::attention_seconds(AttentionKernel kernel, bool backward, const AttentionShape& s) const {
  if (s.batch_heads <= 0 || s.seq <= 0) return 0.0;
  const double head_dim = 0.5 * double(s.head_dim + s.v_head_dim);
  const double seq = double(s.seq);
  const double pass = backward ? 2.5 : 1.0;  // the backward's FLOPs over the forward's
  if (kernel == AttentionKernel::flash) {
    if (!topo_.attention.has_flash()) return -1;
    // A sliding window's fused kernel skips the tiles outside the band: its work is the band's,
    // at the rate of a causal core as long as the window (each query tile meets as few key tiles
    // as there); below the tables' shortest sequence, that point's rate (optimistic there).
    const bool windowed = s.window > 0 && s.window < s.seq;
    if (s.fp8) {
      if (!topo_.attention.has_fp8()) return -1;
      // cuDNN's FP8 backward does not skip the tiles outside a window: in its own GB200 benchmark
      // (gpt_oss_20260615_141706.csv) its time grows with s^2 (0.64, 2.06, 7.33, 27.5 ms from 2k to
      // 16k tokens), so a windowed layer's FP8 backward is the whole causal core's.
      if (backward && windowed) {
        AttentionShape whole = s;
        whole.window = 0;
        return pass * 0.5 * whole.forward_flops() / (rate_at(fp8_backward_, head_dim, seq) * kTera) + launch_s_;
      }
      const double rate = rate_at(backward ? fp8_backward_ : fp8_forward_, head_dim, windowed ? double(s.window) : seq) * kTera;
      return pass * 0.5 * s.forward_flops() / rate + launch_s_;
    }
    const double rate = rate_at(backward ? flash_backward_ : flash_forward_, head_dim, windowed ? double(s.window) : seq) * kTera;
    return pass * 0.5 * s.forward_flops() / rate + launch_s_;
  }
  if (!topo_.attention.has_unfused()) return -1;
  // An unfused core computes the whole square and masks it, window or not.
  AttentionShape whole = s;
  whole.window = 0;
  const double rate = rate_at(unfused_, head_dim, seq) * kTera;
  return pass * whole.forward_flops() / rate + 3 * launch_s_;  // three kernels a pass
}

// Alpha-beta per link level. Inside a node a device's links carry its own traffic (NVLink,
// NVSwitch); across nodes the node's NICs are shared by every group with members on the node that
// spans nodes (all groups of a kind run at once). Latency: ring steps for all-gather,
// reduce-scatter and all-to-all; tree depth for all-reduce (NCCL picks tree/LL for small messages).
double AnalyticProfile::collective_seconds(CollectiveOp op, const GroupSpan& span, double bytes) const {
  const int n = span.ranks;
  if (n <= 1 || bytes <= 0) return 0.0;
  if (op == CollectiveOp::send_recv) return p2p_seconds(span, bytes);
  const bool multi_node = span.nodes > 1;
  const double intra_bw = (span.crosses_islands ? topo_.cross_island_bandwidth_gbs : topo_.intra.bandwidth_gbs) *
                          kGB * topo_.intra.efficiency;
  const double inter_bw_per_group = topo_.inter.bandwidth_gbs * kGB * topo_.inter.efficiency /
                                    std::max(1, span.groups_per_node);
  const double alpha = (multi_node ? topo_.inter.latency_us : topo_.intra.latency_us) * kMicro;
  const double steps = std::ceil(std::log2(double(n)));

  // Dropless's all-to-all-v: the busiest rank's exchange, priced as an even one of its size.
  if (op == CollectiveOp::all_to_all_v) op = CollectiveOp::all_to_all;
  if (op == CollectiveOp::all_to_all) {
    // Each rank sends bytes/n to every other rank: (k-1)/n of it stays in the node, (n-k)/n leaves.
    const double k = span.max_ranks_per_node;
    const double intra_s = bytes * (k - 1.0) / n / intra_bw;
    // Every member of every group on the node pushes its outgoing share through the node's NICs:
    // k senders per group, groups_per_node groups. Both are worst cases over the nodes, taken
    // separately, so their product can exceed the node's devices; no node sends more than all of
    // its devices with their largest outgoing share, (n-1)/n each.
    const double node_bw = topo_.inter.bandwidth_gbs * kGB * topo_.inter.efficiency;
    const double egress = std::min(bytes * (n - k) / n * k * std::max(1, span.groups_per_node),
                                   bytes * (n - 1.0) / n * topo_.devices_per_node);
    const double inter_s = multi_node ? egress / node_bw : 0.0;
    return std::max(intra_s, inter_s) + (n - 1) * alpha;
  }
  const double wire_bytes = bytes * bus_bandwidth_factor(op, n);
  const double bw = multi_node ? std::min(intra_bw, inter_bw_per_group) : intra_bw;
  const double latency = op == CollectiveOp::all_reduce ? std::min(2.0 * (n - 1), 2.0 * steps) * alpha
                                                        : (n - 1) * alpha;
  return wire_bytes / bw + latency;
}

// Inside a node the pair has a device's links to itself; across nodes the boundary's pairs that
// share the sender's node share its NICs.
double AnalyticProfile::p2p_seconds(const GroupSpan& span, double bytes) const {
  if (bytes <= 0) return 0.0;
  if (span.nodes <= 1) {
    const double bw = (span.crosses_islands ? topo_.cross_island_bandwidth_gbs : topo_.intra.bandwidth_gbs) * kGB *
                      topo_.intra.efficiency;
    return bytes / bw + topo_.intra.latency_us * kMicro;
  }
  const double bw = topo_.inter.bandwidth_gbs * kGB * topo_.inter.efficiency / std::max(1, span.groups_per_node);
  return bytes / bw + topo_.inter.latency_us * kMicro;
}

std::string AnalyticProfile::describe() const {
  return "analytic (datasheet peaks x efficiency curves of topology '" + topo_.name + "')";
}

}  // namespace tedsim
