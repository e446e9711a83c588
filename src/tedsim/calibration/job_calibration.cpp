#include "tedsim/calibration/job_calibration.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "tedsim/calibration/arrival_skew.hpp"
#include "tedsim/calibration/bench.hpp"
#include "tedsim/calibration/expert_shares_measure.hpp"
#include "tedsim/calibration/point_timing.hpp"
#include "tedsim/calibration/sweep.hpp"
#include "tedsim/comm/collective_check.hpp"
#include "tedsim/comm/ted_groups.hpp"
#include "tedsim/comm/watchdog.hpp"
#include "tedsim/model/group_spans.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/profile/recording_profile.hpp"
#include "tedsim/search/evaluator.hpp"

namespace tedsim::calibration {

namespace {

bool same_span(const GroupSpan& a, const GroupSpan& b) {
  return a.ranks == b.ranks && a.nodes == b.nodes && a.max_ranks_per_node == b.max_ranks_per_node &&
         a.groups_per_node == b.groups_per_node && a.crosses_islands == b.crosses_islands;
}

// What to measure, flattened to doubles so rank 0 can share it through host_max (every other rank
// contributes zeros): GEMMs (m, n, k, batch, dtype, grouped), kernels (kind, bytes, dtype), collectives
// (op, group kind, ranks, nodes, rpn, gpn, islands, bytes), arrival-skew group shapes (group kind,
// ranks, nodes, the one segment to add, or 0 for a shape never measured: host_max shares these, so
// nothing is negative) and the GEMM their loop computes with (m, n, k, batch, dtype).
struct Missing {
  std::vector<double> gemms, kernels, collectives, skews, skew_gemm;
};
constexpr std::size_t kGemmFields = 6;

// Arrival-skew segments measured for a job: as a quick calibration's.
constexpr double kJobSkewSegments[] = {0, 8e-3, 64e-3};

void share(Communicator& world, bool root, std::vector<double>& v) {
  std::vector<double> n{root ? double(v.size()) : 0.0};
  world.host_max(n);
  if (!root) v.assign(std::size_t(n[0]), 0.0);
  if (!v.empty()) world.host_max(v);
}

}  // namespace

JobCalibration calibrate_job(Communicator& world, Backend backend, const ModelSpec& model, const std::string& model_name,
                             const TopologySpec& topology, const ParallelConfig& config, const std::string& profile_path,
                             int warmup, int reps) {
  const bool root = world.rank() == 0;
  const Dtype dtype = backend == Backend::cuda ? model.dtype : Dtype::fp32;
  std::unique_ptr<Bench> bench = backend == Backend::cuda ? make_cuda_bench(dtype) : make_cpu_bench();
  JobCalibration result;
  ProfileData data;
  const Provenance here = describe_this_run(backend, *bench);
  const TedLayout layout(world.size(), config.tp, config.ep, config.layout, config.expert_tp, config.pp);
  const GroupSpans spans = compute_group_spans(layout, topology);

  // Rank 0: what the prediction asks that measured points do not answer.
  Missing missing;
  on_root(world, root, [&] {
    std::ifstream probe(profile_path);
    if (probe) {
      data = load_profile_data(profile_path);
      if (data.provenance.backend != here.backend)
        throw InputError(profile_path + ": a profile of the " + data.provenance.backend + " backend; --calibrate adds " +
                         here.backend + " measurements only to a profile of the same backend");
    } else {
      result.created = true;
      data.provenance = here;
    }
    const MeasuredProfile measured(data, topology);
    const RecordingProfile recording(measured);
    Evaluator(model, topology, recording).evaluate(config);
    result.lookups = int(recording.gemms().size() + recording.kernels().size() + recording.collectives().size());
    for (const GemmShape& g : recording.gemms()) {
      const bool have = std::any_of(data.gemms.begin(), data.gemms.end(), [&](const GemmPoint& p) {
        return p.shape.m == g.m && p.shape.n == g.n && p.shape.k == g.k && p.shape.batch == g.batch &&
               p.shape.dtype == g.dtype && p.shape.grouped == g.grouped;
      });
      if (have) continue;
      if (g.dtype != dtype) {
        ++result.unmeasurable;
        continue;
      }
      missing.gemms.insert(missing.gemms.end(),
                          {double(g.m), double(g.n), double(g.k), double(g.batch), double(int(g.dtype)), g.grouped ? 1.0 : 0.0});
    }
    for (const KernelLookup& k : recording.kernels())
      if (measured.departs(k.kind, k.bytes, k.dtype))
        missing.kernels.insert(missing.kernels.end(), {double(int(k.kind)), k.bytes, double(int(k.dtype))});
    for (const CollectiveLookup& c : recording.collectives()) {
      if (!measured.departs(c.op, c.span, c.bytes)) continue;
      int kind = -1;
      if (c.op == CollectiveOp::send_recv) {
        // NCCL point-to-point is not in the communicator yet: the CUDA backend cannot measure it.
        if (config.pp > 1 && backend != Backend::cuda && same_span(spans.p2p, c.span)) kind = int(GroupKind::pipeline);
      } else {
        for (GroupKind gk : TedGroups::kinds) {
          const SpanSet& set = spans.of(gk);
          for (int i = 0; i < set.count; ++i)
            if (same_span(set.spans[std::size_t(i)], c.span)) kind = int(gk);
        }
      }
      if (kind < 0) {
        ++result.unmeasurable;
        continue;
      }
      missing.collectives.insert(missing.collectives.end(),
                                 {double(int(c.op)), double(kind), double(c.span.ranks), double(c.span.nodes),
                                  double(c.span.max_ranks_per_node), double(c.span.groups_per_node),
                                  c.span.crosses_islands ? 1.0 : 0.0, c.bytes});
    }
    for (const SkewLookup& asked : recording.skews()) {
      const GroupSpan& span = asked.span;
      double longest = -1;  // the longest segment measured on this shape (-1: none)
      for (const SkewPoint& p : data.skews)
        if (p.span.ranks == span.ranks && p.span.nodes == span.nodes) longest = std::max(longest, p.compute_s);
      int kind = -1;
      for (GroupKind gk : TedGroups::kinds) {
        const SpanSet& set = spans.of(gk);
        for (int i = 0; i < set.count; ++i)
          if (same_span(set.spans[std::size_t(i)], span)) kind = int(gk);
      }
      // Measured already, and no segment asked far beyond the measured ones: nothing to do.
      const bool far = asked.longest_compute_s > MeasuredProfile::kFarFactor * longest;
      if (kind < 0 || (longest >= 0 && !far)) continue;
      // A shape never measured gets quick calibration's segments; one measured on shorter segments
      // the job's longest (at most 2 s).
      missing.skews.insert(missing.skews.end(), {double(kind), double(span.ranks), double(span.nodes),
                                                 longest < 0 ? 0.0 : std::min(asked.longest_compute_s, 2.0)});
    }
    if (!missing.skews.empty()) {
      // The loop's GEMM: the measured one nearest 100 us, else the job's first.
      const GemmPoint* best = nullptr;
      for (const GemmPoint& p : data.gemms)
        if (p.shape.dtype == dtype && p.seconds.median_s > 0 &&
            (!best || std::fabs(std::log(p.seconds.median_s / 1e-4)) < std::fabs(std::log(best->seconds.median_s / 1e-4))))
          best = &p;
      GemmShape g = best ? best->shape : recording.gemms().empty() ? GemmShape{256, 256, 256, 1, dtype} : recording.gemms().front();
      g.dtype = dtype;
      missing.skew_gemm = {double(g.m), double(g.n), double(g.k), double(g.batch), double(int(g.dtype))};
    }
  });
  share(world, root, missing.gemms);
  share(world, root, missing.kernels);
  share(world, root, missing.collectives);
  share(world, root, missing.skews);
  share(world, root, missing.skew_gemm);
  std::vector<double> counts{double(result.lookups), double(result.unmeasurable), result.created ? 1.0 : 0.0};
  world.host_max(counts);
  result.lookups = int(counts[0]);
  result.unmeasurable = int(counts[1]);
  result.created = counts[2] > 0;
  const std::size_t gemm_n = missing.gemms.size() / kGemmFields, kernel_n = missing.kernels.size() / 3,
                    coll_n = missing.collectives.size() / 8, skew_n = missing.skews.size() / 4;
  if (root)
    std::cout << "validate --calibrate: the prediction asks " << result.lookups << " distinct lookups; "
              << (result.created ? "the new profile " : profile_path + " ") << "lacks " << gemm_n << " GEMM, " << kernel_n
              << " kernel and " << coll_n << " collective points, " << skew_n
              << " arrival-skew group shapes: measuring them on this world" << std::endl;

  const auto check = [&](std::int64_t wrong, const std::string& what) { require_correct(world, wrong, what); };
  const double budget = 0.15;  // seconds of timed repetitions per point (a job asks tens of points, not hundreds)
  long step = 0;
  for (std::size_t i = 0; i < gemm_n; ++i) {
    watchdog::at_step(++step);
    const double* g = &missing.gemms[kGemmFields * i];
    GemmShape shape{std::int64_t(g[0]), std::int64_t(g[1]), std::int64_t(g[2]), std::int64_t(g[3]), Dtype(int(g[4])), g[5] > 0};
    Prepared p = bench->gemm(shape);
    check(p.check(), p.what);
    const Timing t = measure_steady([&] { return slowest(world, summarize(bench->time(p, warmup, reps, budget))); }, 1.5);
    data.gemms.push_back({shape, t});
    ++result.gemms;
  }
  for (std::size_t i = 0; i < kernel_n; ++i) {
    watchdog::at_step(++step);
    const double* k = &missing.kernels[3 * i];
    const KernelKind kind = KernelKind(int(k[0]));
    // A kernel moves what the model's dimensions make of the size asked, not always the size: when
    // it lands on one side of the lookup, a second point aimed by the ratio lands on the other, so
    // the lookup interpolates between measured points.
    double target = k[1];
    for (int attempt = 0; attempt < 2; ++attempt) {
      Prepared p = bench->kernel(kind, target, model);
      if (!p) {
        if (attempt == 0) ++result.unmeasurable;
        break;
      }
      check(p.check(), p.what);
      const Timing t = measure_steady([&] { return slowest(world, summarize(bench->time(p, warmup, reps, budget))); }, 1.5);
      data.kernels.push_back({kind, p.dtype.value_or(bench->dtype()), p.bytes, t});
      if (attempt == 0) ++result.kernels;
      if (p.bytes <= 0 || std::abs(p.bytes - k[1]) <= 1e-9 * k[1]) break;
      target = k[1] * k[1] / p.bytes;
    }
  }
  if (coll_n > 0) {
    TedGroups groups(world, layout);
    for (std::size_t i = 0; i < coll_n; ++i) {
      watchdog::at_step(++step);
      const double* c = &missing.collectives[8 * i];
      const GroupSpan span{int(c[2]), int(c[3]), int(c[4]), int(c[5]), c[6] > 0};
      Communicator& group = groups.group(GroupKind(int(c[1])));
      // The lookup's size, rounded to whole elements per rank both ways, so the measured points
      // bracket it (rank-split collectives need a multiple of the group size).
      const double elems = c[7] / double(bytes_of(dtype));
      const std::int64_t n = splits_over_ranks(CollectiveOp(int(c[0]))) ? group.size() : 1;
      const std::int64_t down = std::max<std::int64_t>(n, std::int64_t(std::floor(elems / double(n))) * n);
      const std::int64_t up = std::max<std::int64_t>(n, std::int64_t(std::ceil(elems / double(n))) * n);
      for (std::int64_t count : down == up ? std::vector<std::int64_t>{down} : std::vector<std::int64_t>{down, up}) {
        CollectiveCase cc;
        cc.op = CollectiveOp(int(c[0]));
        cc.in_place = step_runs_in_place(cc.op, GroupKind(int(c[1])));
        cc.count = count;
        cc.busiest_load = calibrated_busiest_load(model, group.size());
        cc.dtype = dtype;
        cc.warmup = warmup;
        cc.iters = reps;
        CollectiveResult r;
        const Timing t = measure_steady(
            [&] {
              r = check_and_time_groups(world, group, cc);
              if (r.wrong != 0)
                throw RunError(world.where() + ": " + to_string(cc.op) + " on the " + group.name() + " groups: " +
                               std::to_string(r.wrong) + " wrong elements");
              return Timing{r.time_min_s, r.time_median_s, r.time_max_s};
            },
            1.5);
        const double busbw = double(r.bytes) / t.median_s / 1e9 * bus_bandwidth_factor(cc.op, r.ranks);
        data.collectives.push_back({cc.op, dtype, span, double(r.bytes), t, busbw, cc.busiest_load});
      }
      ++result.collectives;
    }
  }
  if (skew_n > 0) {
    TedGroups groups(world, layout);
    const double* g = missing.skew_gemm.data();
    Prepared gemm = bench->gemm(GemmShape{std::int64_t(g[0]), std::int64_t(g[1]), std::int64_t(g[2]), std::int64_t(g[3]), Dtype(int(g[4]))});
    check(gemm.check(), gemm.what);
    const double gemm_s = measure_steady([&] { return slowest(world, summarize(bench->time(gemm, warmup, reps, budget))); }, 1.5).median_s;
    for (std::size_t i = 0; i < skew_n; ++i) {
      const double* c = &missing.skews[4 * i];
      SkewCaseSpec sc;
      sc.kind = GroupKind(int(c[0]));
      sc.span = spans.of(sc.kind).widest();
      const std::vector<double> segments =
          c[3] <= 0 ? std::vector<double>(std::begin(kJobSkewSegments), std::end(kJobSkewSegments)) : std::vector<double>{c[3]};
      for (double segment : segments) {
        watchdog::at_step(++step);
        sc.compute_s = segment;
        data.skews.push_back(measure_arrival_skew(world, groups.group(sc.kind), *bench, gemm, gemm_s, sc, 5));
      }
      ++result.skews;
    }
  }
  // Dropless: the step's routing, where the profile holds no count yet (one profile holds one
  // model's: another model's count stays, and this job assumes its model's imbalance).
  std::vector<double> count{0.0};
  on_root(world, root, [&] {
    if (model.is_moe() && model.moe.dropless() && data.expert_shares.empty()) count[0] = 1.0;
    else if (model.is_moe() && model.moe.dropless() && data.expert_shares.model != model.name)
      result.routing_skipped = "the profile holds the routing of model '" + data.expert_shares.model + "'";
  });
  share(world, root, count);
  if (count[0] > 0) {
    watchdog::at_step(++step);
    RoutingCount routing = count_routing(model, config.seq_len, here.ranks_per_node);
    result.routing_counted = !routing.shares.empty();
    result.routing_skipped = routing.skipped;
    if (root) data.expert_shares = std::move(routing.shares);
  }
  on_root(world, root, [&] {
    // Which models the profile was completed for: their predictions no longer borrow shapes.
    nlohmann::json calibration = data.calibration_json.empty() ? nlohmann::json::object()
                                                               : nlohmann::json::parse(data.calibration_json);
    nlohmann::json& completed = calibration["completed_for"];
    if (!completed.is_array()) completed = nlohmann::json::array();
    const nlohmann::json entry = {{"model", model_name}, {"config", config.describe()}, {"ranks", world.size()}};
    if (std::find(completed.begin(), completed.end(), entry) == completed.end()) completed.push_back(entry);
    data.calibration_json = calibration.dump();
    save_profile(profile_path, data);
  });
  return result;
}

}  // namespace tedsim::calibration
