#include "tedsim/calibration/sweep.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "tedsim/comm/collective_check.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/workload.hpp"
#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/search/search.hpp"
#include "tedsim/spec/parallel_config.hpp"

namespace tedsim::calibration {
namespace {

// A profile that remembers every question build_workload asks: the
// GEMM shapes and kernel sizes of a configuration, exactly as the cost model will look them up.
// Answers constants: the analytic profile may lack the model's dtype (a CPU topology, fp16 model).
class RecordingProfile final : public Profile {
 public:
  RecordingProfile() = default;
  double gemm_seconds(const GemmShape& s) const override {
    if (s.m > 0 && s.n > 0 && s.k > 0) gemms.insert({s.m, s.n, s.k, s.batch, int(s.dtype), s.grouped});
    return 1e-6;
  }
  double kernel_seconds(KernelKind kind, double bytes, Dtype d) const override {
    if (bytes > 0) {
      auto& r = kernel_range[int(kind)];
      r.first = r.first == 0 ? bytes : std::min(r.first, bytes);
      r.second = std::max(r.second, bytes);
    }
    (void)d;
    return 1e-6;
  }
  double collective_seconds(CollectiveOp op, const GroupSpan& span, double bytes) const override {
    if (span.ranks > 1) {
      largest_collective = std::max(largest_collective, bytes);
      collective_bytes[int(op)].insert(bytes);
    }
    return 1e-6;
  }
  double p2p_seconds(const GroupSpan& span, double bytes) const override {
    return collective_seconds(CollectiveOp::send_recv, span, bytes);
  }
  std::string describe() const override { return "recording"; }

  mutable std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, bool>> gemms;  // m n k batch dtype grouped
  mutable std::map<int, std::pair<double, double>> kernel_range;
  mutable double largest_collective = 0;  // bytes of the largest message any workload sends
  mutable std::map<int, std::set<double>> collective_bytes;  // by op: every message size asked

};

// Bucket of a GEMM shape: each dimension on a grid of factor 2 in log space, its dtype and whether
// it is grouped. Shapes in one bucket have nearly the same efficiency, and the profile interpolates
// between buckets anyway.
using RecordedGemm = std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, bool>;
std::tuple<int, int, int, int, int, bool> bucket(const RecordedGemm& s, bool keep_dtype) {
  const auto b = [](std::int64_t v) { return int(std::lround(std::log2(double(v)))); };
  return {b(std::get<0>(s)), b(std::get<1>(s)), b(std::get<2>(s)), b(std::get<3>(s)), keep_dtype ? std::get<4>(s) : 0,
          std::get<5>(s)};
}

// An FP8 GEMM's dimensions rounded up to cuBLASLt's FP8 layouts (multiples of 16), as Transformer
// Engine pads them (Megatron-Core pads expert rows for FP8 likewise: moe_router_padding_for_fp8).
std::int64_t fp8_layout(std::int64_t v) { return (v + 15) / 16 * 16; }

// The job's own message sizes beside the grid, by op: a collective's time can jump between two grid
// sizes where the library changes algorithm (OpenMPI's reduce-scatter on 2 ranks of a 2-core VM:
// 2.3 ms at 8 MiB, 12.8 ms at 16 MiB, and 3-9 ms from run to run at the 10.5 MiB gradient sync of
// cpu-moe, where the grid's interpolation says 3-5). Sizes of 256 KiB and up inside the sweep's
// range, not within 2% of a grid size, at most 12 per op (evenly spread in log size beyond that).
std::map<int, std::vector<std::int64_t>> job_message_counts(const std::map<int, std::set<double>>& asked,
                                                            const std::vector<std::int64_t>& grid, const Sweep& sweep,
                                                            Dtype dtype) {
  std::map<int, std::vector<std::int64_t>> out;
  const double esize = bytes_of(dtype);
  for (const auto& [op, sizes] : asked) {
    std::vector<std::int64_t> kept;
    for (double bytes : sizes) {
      if (bytes < 256.0 * 1024 || bytes < double(sweep.min_bytes) || bytes > double(sweep.max_bytes)) continue;
      const auto count = std::int64_t(std::llround(bytes / esize));
      const bool near_grid = std::any_of(grid.begin(), grid.end(), [&](std::int64_t g) {
        return std::fabs(double(g) - double(count)) <= 0.02 * double(g);
      });
      if (!near_grid && (kept.empty() || double(count) > 1.02 * double(kept.back()))) kept.push_back(count);
    }
    const std::size_t cap = 12;
    if (kept.size() > cap) {
      std::vector<std::int64_t> spread;
      for (std::size_t i = 0; i < cap; ++i) spread.push_back(kept[i * (kept.size() - 1) / (cap - 1)]);
      kept = spread;
    }
    if (!kept.empty()) out[op] = kept;
  }
  return out;
}

std::vector<double> log_sweep(double lo, double hi, double factor) {
  std::vector<double> out;
  if (hi < lo) hi = lo;
  for (double b = lo; b < hi * 1.0001; b *= factor) out.push_back(std::round(b));
  if (out.empty() || out.back() < hi * 0.9999) out.push_back(std::round(hi));
  return out;
}

// The generic grid: square and skinny power-of-two shapes from 64 to 16384 (the token dimension m
// up to 16384; n and k, the weight dimensions, up to 8192), under the FLOP cap of the device.
std::vector<GemmShape> generic_gemm_grid(Dtype dtype, double flop_cap, bool quick) {
  std::vector<GemmShape> shapes;
  const std::int64_t step = quick ? 4 : 2;
  for (std::int64_t m = 64; m <= 16384; m *= step)
    for (std::int64_t n = 64; n <= 8192; n *= step)
      for (std::int64_t k = 64; k <= 8192; k *= step) {
        const GemmShape g{m, n, k, 1, dtype};
        if (g.flops() <= flop_cap) shapes.push_back(g);
      }
  std::sort(shapes.begin(), shapes.end(), [](const GemmShape& a, const GemmShape& b) { return a.flops() < b.flops(); });
  return shapes;
}

}  // namespace

std::string Sweep::digest() const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the points' fields
  const auto mix = [&h](double v) {
    const std::string text = std::to_string(v) + ";";
    for (const char ch : text) h = (h ^ std::uint8_t(ch)) * 1099511628211ull;
  };
  for (const GemmCase& g : gemms) {
    for (double v : {double(g.shape.m), double(g.shape.n), double(g.shape.k), double(g.shape.batch), double(int(g.shape.dtype))})
      mix(v);
    if (g.shape.grouped) mix(-1.0);  // only where set: a sweep without grouped GEMMs keeps its digest
  }
  for (const KernelCase& k : kernels) {
    mix(double(int(k.kind)));
    mix(k.bytes);
  }
  for (const CollectiveCaseSpec& c : collectives) {
    for (double v : {double(int(c.op)), double(int(c.kind)), double(c.p), double(c.t), double(c.e), double(int(c.layout)),
                     double(c.expert_tp), double(c.span.ranks), double(c.span.nodes), double(c.span.max_ranks_per_node),
                     double(c.span.groups_per_node), double(c.span.crosses_islands), double(c.count)})
      mix(v);
  }
  for (const SkewCaseSpec& c : skews)
    for (double v : {double(int(c.kind)), double(c.p), double(c.t), double(c.e), double(int(c.layout)), double(c.expert_tp),
                     double(c.span.ranks), double(c.span.nodes), c.compute_s})
      mix(v);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

void require_block_placement(const std::vector<std::string>& host_of_rank) {
  std::map<std::string, int> per_host;
  for (const std::string& h : host_of_rank) ++per_host[h];
  int block = 1;
  for (const auto& [host, n] : per_host) block = std::max(block, n);
  for (std::size_t r = 0; r < host_of_rank.size(); ++r) {
    const std::size_t first = r / std::size_t(block) * std::size_t(block);  // first rank of r's block
    if (host_of_rank[r] != host_of_rank[first]) {
      throw InputError("calibrate: rank " + std::to_string(r) + " runs on " + host_of_rank[r] + ", rank " +
                       std::to_string(first) + " on " + host_of_rank[first] + ": the group shapes assume ranks in blocks of " +
                       std::to_string(block) + " per host (ranks 0-" + std::to_string(block - 1) +
                       " on the first host, and so on); launch with `mpirun --map-by slot` or `srun --distribution=block`");
    }
  }
}

// Quick calibration measures the same shapes and sizes as a full one, with fewer repetitions
// (calibrate.cpp): a quick profile must predict the job it was made for. Two things stay bounded:
// GEMMs above the FLOP cap (extrapolated from the largest measured, where efficiency is flat) and
// collectives above twice the largest message the model's workloads send.
Sweep derive_sweep(const ModelSpec& model, const TopologySpec& topology, const SweepOptions& o) {
  Sweep sweep;
  sweep.min_bytes = o.min_bytes > 0 ? o.min_bytes : 1024;
  sweep.max_bytes = o.max_bytes > 0 ? o.max_bytes : (64 << 20);
  sweep.step_factor = o.step_factor > 0 ? o.step_factor : 2.0;
  if (sweep.step_factor <= 1.0) throw InputError("--step-factor: expected a factor > 1");

  // 1. GEMM shapes and kernel sizes of every configuration search would enumerate for the cluster,
  //    with micro-batches up to 4 (1 in quick mode): larger micro-batches only scale the token
  //    dimension, which the efficiency interpolation covers.
  SearchSpace space;
  space.gpus = o.gpus;
  space.global_batch = o.global_batch > 0 ? o.global_batch : 8 * o.gpus;
  space.seq_len = o.seq_len;
  const std::vector<ParallelConfig> configs = enumerate_configs(model, space);
  RecordingProfile rec;
  std::set<std::tuple<int, int, int, bool, bool, int, bool>> seen;  // configurations with the same shapes
  for (ParallelConfig c : configs) {
    if (c.micro_batch > 4) continue;
    // Pipeline degree and recompute change no shape; sequence parallelism changes the router's.
    if (!seen.insert({c.tp, c.ep, c.micro_batch, c.dtd, c.expert_tp, int(c.layout), c.sequence_parallel}).second) continue;
    // The whole prediction, not only the workload: the timeline asks for the gradient buckets'
    // collectives, the largest messages a job sends. ZeRO-1 shards the optimizer step over the
    // data ranks, ZeRO-0 runs it whole and all-reduces the gradients: both sizes (a ZeRO-0 plan's
    // Adam is d times a ZeRO-1 plan's, and was extrapolated before).
    for (int zero : {1, 0}) {
      c.zero = zero;
      (void)Evaluator(model, topology, rec).evaluate(c);
    }
    ++sweep.configs;
  }
  // Distinct shapes, capped: one per bucket (the first seen), then evenly over FLOPs.
  sweep.gemm_shapes_seen = int(rec.gemms.size());
  std::map<std::tuple<int, int, int, int, int, bool>, RecordedGemm> buckets;
  for (const auto& s : rec.gemms) buckets.emplace(bucket(s, o.fp8_gemms), s);
  std::vector<GemmShape> shapes;
  // A CPU core runs ~50 GFLOP/s: shapes above the cap would take seconds per repetition; the
  // profile extrapolates them from the largest measured ones (efficiency is flat up there).
  const double flop_cap = o.gpu ? 1e14 : (o.quick ? 1e10 : 4e10);
  for (const auto& [b, s] : buckets) {
    GemmShape g{std::get<0>(s), std::get<1>(s), std::get<2>(s), std::get<3>(s), o.dtype, std::get<5>(s)};
    if (o.fp8_gemms && Dtype(std::get<4>(s)) == Dtype::fp8) {
      g.dtype = Dtype::fp8;
      g.m = fp8_layout(g.m), g.n = fp8_layout(g.n), g.k = fp8_layout(g.k);
    }
    const double bytes = double(g.batch) * double(g.m * g.k + g.k * g.n + g.m * g.n) * bytes_of(g.dtype);
    if (g.flops() > flop_cap || bytes > (o.gpu ? 16.0 : 2.0) * kGiB) continue;
    shapes.push_back(g);
  }
  std::sort(shapes.begin(), shapes.end(), [](const GemmShape& a, const GemmShape& b) { return a.flops() < b.flops(); });
  const std::size_t cap = 64;
  if (shapes.size() > cap) {
    std::vector<GemmShape> kept;
    for (std::size_t i = 0; i < cap; ++i) kept.push_back(shapes[i * (shapes.size() - 1) / (cap - 1)]);
    shapes = kept;
  }
  if (o.grid) shapes = generic_gemm_grid(o.dtype, flop_cap, o.quick);
  for (const GemmShape& g : shapes) sweep.gemms.push_back({g});

  // Kernel sizes: log-spaced over the range the workloads ask about (half the smallest to twice
  // the largest), factor 4 (16 quick), capped at what a device streams in well under a second.
  const double kernel_cap = o.gpu ? 4.0 * kGiB : 256.0 * kMiB;
  for (const auto& [kind, range] : rec.kernel_range) {
    double lo = std::max(4096.0, range.first / 2), hi = std::max(lo, std::min(kernel_cap, range.second * 2));
    if (o.grid) lo = 4096.0, hi = kernel_cap;  // every size a device streams in well under a second
    for (double b : log_sweep(lo, hi, 4.0)) sweep.kernels.push_back({KernelKind(kind), b});
  }
  // Quick: collectives up to twice the largest message the workloads send (a power of two), not
  // the generic 64 MiB; --max-bytes decides when given.
  if (o.quick && o.max_bytes <= 0 && rec.largest_collective > 0) {
    std::int64_t cap_bytes = 64 << 10;
    while (cap_bytes < std::int64_t(2 * rec.largest_collective) && cap_bytes < (64 << 20)) cap_bytes *= 2;
    sweep.max_bytes = cap_bytes;
  }
  if (sweep.min_bytes > sweep.max_bytes)
    throw InputError("--min-bytes " + std::to_string(sweep.min_bytes) + " is above --max-bytes " +
                     std::to_string(sweep.max_bytes));

  // 2. Collectives: the group shapes of every (t, e, layout, expert TP) on this world, as placed
  //    (ranks_per_node from the real host placement, not the topology's devices_per_node).
  TopologySpec placed = topology;
  placed.devices_per_node = std::max(1, o.ranks_per_node);
  // Islands (devices linked directly inside a node) keep their size only where the topology has
  // them and they tile the placed node; otherwise the whole placed node is one island, or every
  // group on one host would count as crossing islands (and be measured twice, once each way).
  if (topology.island_size >= topology.devices_per_node || placed.devices_per_node % topology.island_size != 0)
    placed.island_size = placed.devices_per_node;
  SearchSpace world_space;
  world_space.gpus = o.world;
  world_space.global_batch = 8 * o.world;
  world_space.seq_len = o.seq_len;
  world_space.zero_stages = {1};
  std::set<std::tuple<int, int, int, int, bool>> layouts;
  std::set<std::tuple<int, int, int, int, int, bool>> measured;  // (op, span)
  std::set<std::pair<int, int>> skew_shapes;                      // (ranks, nodes)
  // Segments of the arrival-skew loop: from the shortest a timing runs to the length of a
  // micro-batch's compute between two collectives of a small model; longer ones scale (profile).
  const std::vector<double> segments = o.quick ? std::vector<double>{0, 8e-3, 64e-3}
                                               : std::vector<double>{0, 2e-3, 8e-3, 32e-3, 128e-3};
  const std::vector<std::int64_t> counts = sweep_counts(sweep.min_bytes, sweep.max_bytes, sweep.step_factor, o.dtype);
  const std::map<int, std::vector<std::int64_t>> job_counts = job_message_counts(rec.collective_bytes, counts, sweep, o.dtype);
  // Every size of `op` on the groups of `cs`, once per op and group shape: the grid, and the
  // sizes the job's own messages have.
  const auto add_cases = [&](CollectiveCaseSpec cs, CollectiveOp op) {
    const GroupSpan& span = cs.span;
    if (!measured.insert({int(op), span.ranks, span.nodes, span.max_ranks_per_node, span.groups_per_node,
                          span.crosses_islands})
             .second)
      return;
    cs.op = op;
    std::vector<std::int64_t> sizes = counts;
    if (auto own = job_counts.find(int(op)); own != job_counts.end())
      sizes.insert(sizes.end(), own->second.begin(), own->second.end());
    std::sort(sizes.begin(), sizes.end());
    for (std::int64_t count : sizes) {
      cs.count = count;
      sweep.collectives.push_back(cs);
    }
  };
  for (const ParallelConfig& c : enumerate_configs(model, world_space)) {
    // Pipeline stages hold their own (smaller) data and expert-data groups.
    if (!layouts.insert({c.pp, c.tp, c.ep, int(c.layout), c.expert_tp}).second) continue;
    const TedLayout layout(o.world, c.tp, c.ep, c.layout, c.expert_tp, c.pp);
    const GroupSpans spans = compute_group_spans(layout, placed);
    const std::pair<GroupKind, std::vector<CollectiveOp>> kinds[] = {
        {GroupKind::tensor, {CollectiveOp::all_reduce, CollectiveOp::all_gather}},
        {GroupKind::expert, {CollectiveOp::all_to_all}},
        {GroupKind::data, {CollectiveOp::all_reduce, CollectiveOp::reduce_scatter, CollectiveOp::all_gather}},
        {GroupKind::expert_data, {CollectiveOp::all_reduce, CollectiveOp::reduce_scatter, CollectiveOp::all_gather}}};
    for (const auto& [kind, ops] : kinds) {
      const SpanSet& set = spans.of(kind);
      if (set.count == 0) continue;
      const GroupSpan span = set.widest();
      if (span.ranks <= 1) continue;
      // A case on this kind's groups under this layout (collective or arrival skew).
      const auto on_these_groups = [&](auto spec) {
        spec.kind = kind;
        spec.t = c.tp;
        spec.e = c.ep;
        spec.p = c.pp;
        spec.layout = c.layout;
        spec.expert_tp = c.expert_tp;
        spec.span = span;
        return spec;
      };
      if (skew_shapes.insert({span.ranks, span.nodes}).second)
        for (double compute_s : segments) {
          SkewCaseSpec sc = on_these_groups(SkewCaseSpec{});
          sc.compute_s = compute_s;
          sweep.skews.push_back(sc);
        }
      for (CollectiveOp op : ops) add_cases(on_these_groups(CollectiveCaseSpec{}), op);
      // Dropless routing exchanges its tokens with an all-to-all-v, the busiest rank receiving more.
      if (kind == GroupKind::expert && model.is_moe() && model.moe.dropless()) {
        CollectiveCaseSpec v = on_these_groups(CollectiveCaseSpec{});
        v.busiest_load = calibrated_busiest_load(model, span.ranks);
        add_cases(v, CollectiveOp::all_to_all_v);
      }
    }
    // The pipeline's p2p: every neighbour pair at once, labelled with the worst pair's span (the
    // cost model's lookup).
    if (c.pp > 1) {
      CollectiveCaseSpec cs;
      cs.kind = GroupKind::pipeline;
      cs.t = c.tp;
      cs.e = c.ep;
      cs.p = c.pp;
      cs.layout = c.layout;
      cs.expert_tp = c.expert_tp;
      cs.span = spans.p2p;
      add_cases(cs, CollectiveOp::send_recv);
    }
  }
  // Group by layout so each layout's communicators are split once.
  std::stable_sort(sweep.collectives.begin(), sweep.collectives.end(),
                   [](const CollectiveCaseSpec& a, const CollectiveCaseSpec& b) {
                     return std::make_tuple(a.p, a.t, a.e, int(a.layout), a.expert_tp) <
                            std::make_tuple(b.p, b.t, b.e, int(b.layout), b.expert_tp);
                   });
  return sweep;
}

double calibrated_busiest_load(const ModelSpec& model, int ranks) {
  if (!model.is_moe() || !model.moe.dropless() || ranks <= 1) return 1.0;
  return std::clamp(busiest_rank_load(model.moe.experts, ranks, model.moe.imbalance), 1.0, double(ranks));
}

bool step_runs_in_place(CollectiveOp op, GroupKind group) {
  const bool data_group = group == GroupKind::data || group == GroupKind::expert_data;
  return data_group && (op == CollectiveOp::all_reduce || op == CollectiveOp::reduce_scatter || op == CollectiveOp::all_gather);
}

}  // namespace tedsim::calibration
