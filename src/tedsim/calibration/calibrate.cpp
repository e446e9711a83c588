#include "tedsim/calibration/calibrate.hpp"

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "tedsim/calibration/arrival_skew.hpp"
#include "tedsim/calibration/bench.hpp"
#include "tedsim/calibration/expert_shares_measure.hpp"
#include "tedsim/calibration/point_timing.hpp"
#include "tedsim/calibration/sweep.hpp"
#include "tedsim/comm/collective_check.hpp"
#include "tedsim/comm/ted_groups.hpp"
#include "tedsim/comm/watchdog.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/report/text_table.hpp"

namespace tedsim::calibration {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string fmt(double v, int prec = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

struct Progress {
  Clock::time_point start = Clock::now();
  std::size_t total = 0, skipped = 0, done = 0;
  bool show = false;
  void step(const std::string& what) {
    ++done;
    if (!show) return;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const std::size_t measured = done;
    const std::size_t left = total - skipped - measured;
    const double eta = measured ? elapsed / double(measured) * double(left) : 0;
    std::fprintf(stderr, "\r[%zu/%zu] %-48.48s %6.1f s elapsed, ~%.0f s left   ", skipped + measured, total,
                 what.c_str(), elapsed, eta);
    if (left == 0) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }
};

}  // namespace

// The change of the sentinel GEMM's time between the start and the end of a calibration above
// which the profile is reported as measured on a machine that changed speed. On the 2-core build
// VM the sentinel moves by up to 30% within a few seconds with nothing else running (4 runs,
// 2026-12-02: -29%, -29%, +22%, +2%), so the limit sits above that shared-VM noise.
constexpr double kDriftLimit = 0.35;

int run_calibration(const CalibrationOptions& o) {
  std::unique_ptr<Communicator> world = make_world_communicator(o.backend);
  const bool root = world->rank() == 0;
  const int reps = o.reps > 0 ? o.reps : (o.quick ? 5 : 20);
  const int warmup = o.warmup >= 0 ? o.warmup : (o.quick ? 1 : 2);
  const double budget = o.quick ? 0.05 : 0.3;  // seconds of timed repetitions per point, at least 3 reps
  if (o.out.empty()) throw InputError("--out: a profile file to write is required");

  // FP8 training keeps bf16 tensors (kernels, collectives) and multiplies in FP8 inside Transformer
  // Engine's linears: those GEMMs are timed in FP8 (cuBLASLt, scaled E4M3), the rest in bf16.
  const Dtype dtype = o.backend == Backend::cuda ? storage_dtype(o.model.dtype) : Dtype::fp32;
  std::unique_ptr<Bench> bench = o.backend == Backend::cuda ? make_cuda_bench(dtype) : make_cpu_bench();
  ProfileData data;
  data.provenance = describe_this_run(o.backend, *bench);
  Provenance& prov = data.provenance;

  SweepOptions so;
  so.gpus = o.gpus > 0 ? o.gpus : world->size();
  so.world = world->size();
  so.ranks_per_node = prov.ranks_per_node;
  so.global_batch = o.global_batch;
  so.seq_len = o.seq_len;
  so.quick = o.quick;
  so.grid = o.grid;
  so.gpu = o.backend == Backend::cuda;
  so.dtype = dtype;
  so.fp8_gemms = o.backend == Backend::cuda && o.model.dtype == Dtype::fp8;
  so.min_bytes = o.min_bytes;
  so.max_bytes = o.max_bytes;
  so.step_factor = o.step_factor;
  const Sweep sweep = derive_sweep(o.model, o.topology, so);

  json args = {{"model", o.model_name},     {"topology", o.topology_name},  {"backend", prov.backend},
               {"gpus", so.gpus},           {"world", so.world},            {"ranks_per_node", so.ranks_per_node},
               {"global_batch", o.global_batch}, {"seq", o.seq_len},        {"quick", o.quick}, {"grid", o.grid},
               {"min_bytes", sweep.min_bytes}, {"max_bytes", sweep.max_bytes}, {"step_factor", sweep.step_factor},
               {"reps", reps},              {"warmup", warmup},             {"points", sweep.points()},
               {"sweep_digest", sweep.digest()}};

  // Resume: rank 0 reads <out>.partial and tells everyone how many points are done (or that the
  // arguments differ: then every rank refuses, so no rank is left waiting in a collective).
  const std::string partial = o.out + ".partial";
  std::size_t done = 0;
  std::string refusal;
  on_root(*world, root, [&] {
    std::ifstream probe(partial);
    if (probe) {
      ProfileData previous = load_profile_data(partial);
      json prev_args = previous.calibration_json.empty() ? json() : json::parse(previous.calibration_json);
      json prev_cmp = prev_args.contains("arguments") ? prev_args["arguments"] : json();
      if (prev_cmp != args) {
        refusal = partial + ": a partial calibration with different arguments is there (it had " + prev_cmp.dump() +
                  ", this run has " + args.dump() + "); re-run with the same arguments to resume it, or delete it";
      } else {
        done = prev_args.value("done", std::size_t(0));
        data.gemms = previous.gemms;
        data.kernels = previous.kernels;
        data.collectives = previous.collectives;
        data.skews = previous.skews;
        prov.date = previous.provenance.date;
        std::cerr << "calibrate: resuming " << partial << ": " << done << " of " << sweep.points()
                  << " points already measured\n";
      }
    }
  });
  {
    std::vector<double> v{root ? double(done) : 0.0, root && !refusal.empty() ? 1.0 : 0.0};
    world->host_max(v);
    done = std::size_t(v[0]);
    if (v[1] > 0) throw InputError(root ? refusal : partial + ": arguments differ from the partial calibration (see rank 0)");
  }

  if (root) {
    TextTable t({"calibration", "resolved to"});
    t.align_left();
    t.add_row({"model", o.model.name + " (" + o.model_name + ")"});
    t.add_row({"topology", o.topology.name + " (" + o.topology_name + ")"});
    t.add_row({"backend", prov.backend + ", " + std::to_string(prov.ranks) + " ranks on " + std::to_string(prov.hosts.size()) +
                              " host(s), " + std::to_string(prov.ranks_per_node) + " per host"});
    t.add_row({"device", prov.devices.front() + ", " + to_string(dtype)});
    t.add_row({"shapes from", std::to_string(sweep.configs) + " configurations of " + std::to_string(so.gpus) +
                                  " devices: " + std::to_string(sweep.gemm_shapes_seen) + " distinct GEMM shapes, " +
                                  std::to_string(sweep.gemms.size()) + " measured"});
    t.add_row({"points", std::to_string(sweep.gemms.size()) + " GEMM, " + std::to_string(sweep.kernels.size()) + " kernel, " +
                             std::to_string(sweep.collectives.size()) + " collective, " +
                             std::to_string(sweep.skews.size()) + " arrival-skew"});
    t.add_row({"collective sizes", std::to_string(sweep.min_bytes) + " .. " + std::to_string(sweep.max_bytes) +
                                       " bytes, x" + fmt(sweep.step_factor, 1)});
    t.add_row({"repetitions", std::to_string(warmup) + " warm-up, up to " + std::to_string(reps) + " timed"});
    t.add_row({"output", o.out + (done ? " (resuming)" : "")});
    t.print(std::cout);
    std::cout << std::endl;
  }

  json calib = {{"arguments", args}, {"done", done}};
  Progress progress;
  progress.total = sweep.points();
  progress.skipped = done;
  progress.show = root;
  std::size_t index = 0, measured_now = 0;
  bool stopped = false;
  const auto checkpoint = [&] {
    ++measured_now;
    calib["done"] = index;
    on_root(*world, root, [&] {
      data.calibration_json = calib.dump();
      data.complete = false;
      save_profile(partial, data);
    });
    if (o.stop_after > 0 && int(measured_now) >= o.stop_after && index < sweep.points()) stopped = true;
  };
  const auto check = [&](std::int64_t wrong, const std::string& what) { require_correct(*world, wrong, what); };
  // Times with re-measurement: a point whose spread (max/min, slowest rank) is above the limit is
  // measured again, at most twice; the tightest attempt is kept. Decided on reduced values, so
  // every rank makes the same choice.
  const auto measure = [&](const std::function<Timing()>& once) { return measure_steady(once, o.spread_limit); };

  // A sentinel GEMM (the sweep's middle one) timed before the first point and after the last:
  // how much the machine's speed changed while it was being measured. A profile measured while
  // another job came and went predicts neither speed, and nothing else in it would show that.
  Prepared sentinel = sweep.gemms.empty() ? Prepared{} : bench->gemm(sweep.gemms[sweep.gemms.size() / 2].shape);
  const auto time_sentinel = [&]() -> double {
    if (!sentinel) return 0;
    const Prepared& p = sentinel;
    // A full calibration's repetitions even in a quick one: the comparison is only as good as these.
    return measure([&] { return slowest(*world, summarize(bench->time(p, 2, 20, 0.3))); }).median_s;
  };
  time_sentinel();  // the process's first GEMM runs cold (page faults, thread start): not a speed
  const double sentinel_before_s = time_sentinel();

  // ---- GEMMs -------------------------------------------------------------------------------
  int gemm_rows = 0, kernel_rows = 0;
  TextTable gemm_table({"m", "n", "k", "batch", "dtype", "median us", "min us", "max us", "TFLOP/s"});
  for (const GemmCase& g : sweep.gemms) {
    if (stopped) break;
    if (index++ < done) continue;
    watchdog::at_step(long(measured_now) + 1);  // points of this run are its steps
    Prepared p = bench->gemm(g.shape);
    check(p.check(), p.what);
    const Timing t = measure([&] { return slowest(*world, summarize(bench->time(p, warmup, reps, budget))); });
    data.gemms.push_back({g.shape, t});
    gemm_table.add_row({std::to_string(g.shape.m), std::to_string(g.shape.n), std::to_string(g.shape.k),
                        std::to_string(g.shape.batch) + (g.shape.grouped ? " grouped" : ""), to_string(g.shape.dtype),
                        fmt(t.median_s * 1e6, 1),
                        fmt(t.min_s * 1e6, 1), fmt(t.max_s * 1e6, 1), fmt(g.shape.flops() / t.median_s / 1e12, 4)});
    ++gemm_rows;
    checkpoint();
    progress.step(p.what);
  }
  // ---- kernels ------------------------------------------------------------------------------
  TextTable kernel_table({"kernel", "dtype", "bytes", "median us", "min us", "max us", "GB/s"});
  for (const KernelCase& k : sweep.kernels) {
    if (stopped) break;
    if (index++ < done) continue;
    watchdog::at_step(long(measured_now) + 1);  // points of this run are its steps
    Prepared p = bench->kernel(k.kind, k.bytes, o.model);
    if (p) {
      check(p.check(), p.what);
      const Timing t = measure([&] { return slowest(*world, summarize(bench->time(p, warmup, reps, budget))); });
      const Dtype kernel_dtype = p.dtype.value_or(bench->dtype());
      data.kernels.push_back({k.kind, kernel_dtype, p.bytes, t});
      kernel_table.add_row({to_string(k.kind), to_string(kernel_dtype), fmt(p.bytes, 0), fmt(t.median_s * 1e6, 1),
                            fmt(t.min_s * 1e6, 1), fmt(t.max_s * 1e6, 1), fmt(p.bytes / t.median_s / 1e9, 2)});
      ++kernel_rows;
    }
    checkpoint();
    progress.step(std::string("kernel ") + to_string(k.kind) + (p ? "" : " (no such kernel here)"));
  }
  // ---- collectives over the real TED groups (all groups of a kind at once) --------------------
  std::vector<CollectiveResult> results;
  std::unique_ptr<TedGroups> groups;
  std::tuple<int, int, int, int, bool> groups_key{-1, -1, -1, -1, false};
  for (const CollectiveCaseSpec& c : sweep.collectives) {
    if (stopped) break;
    if (index++ < done) continue;
    watchdog::at_step(long(measured_now) + 1);  // points of this run are its steps
    const std::tuple<int, int, int, int, bool> key{c.p, c.t, c.e, int(c.layout), c.expert_tp};
    if (!groups || key != groups_key) {
      groups.reset();
      groups = std::make_unique<TedGroups>(*world, TedLayout(world->size(), c.t, c.e, c.layout, c.expert_tp, c.p));
      groups_key = key;
    }
    CollectiveCase cc;
    cc.op = c.op;
    cc.in_place = step_runs_in_place(c.op, c.kind);
    cc.count = c.count;
    cc.busiest_load = c.busiest_load;
    cc.dtype = dtype;
    cc.warmup = warmup;
    cc.iters = reps;
    cc.before_each = [&] { bench->cool_caches(); };
    CollectiveResult r;
    const Timing t = measure([&] {
      r = check_and_time_groups(*world, groups->group(c.kind), cc);
      if (r.wrong != 0)
        throw RunError(world->where() + ": " + to_string(c.op) + " on the " + to_string(c.kind) + " groups: " +
                       std::to_string(r.wrong) + " wrong elements at " + std::to_string(r.bytes) + " bytes");
      return Timing{r.time_min_s, r.time_median_s, r.time_max_s};
    });
    r.time_min_s = t.min_s;
    r.time_median_s = t.median_s;
    r.time_max_s = t.max_s;
    r.algbw_gbs = double(r.bytes) / t.median_s / 1e9;
    r.busbw_gbs = r.algbw_gbs * bus_bandwidth_factor(c.op, r.ranks);
    results.push_back(r);
    data.collectives.push_back({c.op, dtype, c.span, double(r.bytes), t, r.busbw_gbs, c.busiest_load});
    checkpoint();
    progress.step(std::string(to_string(c.op)) + " " + to_string(c.kind) + " " + std::to_string(r.bytes) + " B");
  }
  // ---- arrival skew: the wait at a blocking collective after the same compute on every rank ----
  TextTable skew_table({"group", "compute ms", "mean wait ms", "p90 wait ms", "wait / compute"});
  // The loop computes with the sweep's GEMM nearest 100 us at the sentinel's rate, so its
  // shortest segment (3 of them) is as short as a step's between two collectives.
  Prepared skew_gemm;
  double skew_gemm_s = 0;
  const auto prepare_skew_gemm = [&] {
    const GemmShape& ref = sweep.gemms[sweep.gemms.size() / 2].shape;
    const double target = ref.flops() / sentinel_before_s * 1e-4;
    const GemmShape* best = &ref;
    for (const GemmCase& g : sweep.gemms)
      if (std::fabs(std::log(g.shape.flops() / target)) < std::fabs(std::log(best->flops() / target))) best = &g.shape;
    skew_gemm = bench->gemm(*best);
    skew_gemm_s = measure([&] { return slowest(*world, summarize(bench->time(skew_gemm, 2, 20, 0.3))); }).median_s;
  };
  for (const SkewCaseSpec& c : sweep.skews) {
    if (stopped) break;
    if (index++ < done) continue;
    watchdog::at_step(long(measured_now) + 1);
    const std::tuple<int, int, int, int, bool> key{c.p, c.t, c.e, int(c.layout), c.expert_tp};
    if (!groups || key != groups_key) {
      groups.reset();
      groups = std::make_unique<TedGroups>(*world, TedLayout(world->size(), c.t, c.e, c.layout, c.expert_tp, c.p));
      groups_key = key;
    }
    if (!sentinel || sentinel_before_s <= 0) break;  // no GEMM to compute with (a sweep without shapes)
    if (!skew_gemm) prepare_skew_gemm();
    const SkewPoint sp =
        measure_arrival_skew(*world, groups->group(c.kind), *bench, skew_gemm, skew_gemm_s, c, o.quick ? 5 : 20);
    data.skews.push_back(sp);
    skew_table.add_row({describe_span(c.span), fmt(sp.compute_s * 1e3, 2), fmt(sp.wait_mean_s * 1e3, 3),
                        fmt(sp.wait_p90_s * 1e3, 3), fmt(sp.compute_s > 0 ? sp.wait_mean_s / sp.compute_s : 0, 3)});
    checkpoint();
    progress.step("arrival skew " + std::to_string(c.span.ranks) + " ranks, " + fmt(sp.compute_s * 1e3, 1) + " ms");
  }
  groups.reset();

  if (root && o.verbose_tables) {
    if (gemm_rows > 0) {
      std::cout << "# GEMMs (" << prov.devices.front() << ", slowest rank)\n";
      gemm_table.print(std::cout);
      std::cout << '\n';
    }
    if (kernel_rows > 0) {
      std::cout << "# memory-bound kernels (slowest rank)\n";
      kernel_table.print(std::cout);
      std::cout << '\n';
    }
    if (!results.empty()) std::cout << format_nccl_table(results) << '\n';
    if (!data.skews.empty()) {
      std::cout << "# arrival skew (wait inside a blocking collective after the same compute on every rank)\n";
      skew_table.print(std::cout);
      std::cout << '\n';
    }
  }
  if (stopped) {
    if (root)
      std::cout << "calibrate: stopped after " << measured_now << " points (--stop-after); " << index << " of "
                << sweep.points() << " in " << partial << "; re-run the same command to resume\n";
    return 0;
  }
  const double sentinel_after_s = time_sentinel();
  if (sentinel_before_s > 0 && sentinel_after_s > 0) {
    const GemmShape& g = sweep.gemms[sweep.gemms.size() / 2].shape;
    const double drift = sentinel_after_s / sentinel_before_s - 1;
    calib["drift"] = {{"gemm", {g.m, g.n, g.k, g.batch}}, {"before_s", sentinel_before_s}, {"after_s", sentinel_after_s},
                      {"change", drift}};
    if (g.grouped) calib["drift"]["grouped"] = true;  // timed as a grouped GEMM is (cpu_bench.cpp)
    if (root && std::fabs(drift) > kDriftLimit)
      std::cout << "calibrate: WARNING: the machine's speed changed while it was measured: the sentinel GEMM " << g.m
                << "x" << g.n << "x" << g.k << " took " << fmt(sentinel_before_s * 1e6, 1) << " us before the first point and "
                << fmt(sentinel_after_s * 1e6, 1) << " us after the last (" << (drift > 0 ? "+" : "") << fmt(100 * drift, 0)
                << "%); predictions from this profile describe neither speed: calibrate again when the machine is quiet\n";
  }
  // ---- routing: how the step's own router spreads its tokens over the experts ------------------
  const RoutingCount routing = count_routing(o.model, o.seq_len, prov.ranks_per_node);
  data.expert_shares = routing.shares;
  if (root && !routing.shares.empty()) {
    const ExpertShares& x = routing.shares;
    std::cout << "calibrate: routing of the step's tokens (" << x.passes.size() << " MoE layer passes of "
              << x.rows_per_pass << " rows): the busiest expert " << fmt(x.imbalance(), 2) << "x the mean";
    if (world->size() > 1 && o.model.moe.experts % world->size() == 0)
      std::cout << ", the busiest of " << world->size() << " expert ranks " << fmt(x.busiest_rank_load(world->size()), 3) << "x";
    std::cout << "\n";
  }
  if (root && !routing.skipped.empty())
    std::cout << "calibrate: routing not counted: " << routing.skipped << "; predictions assume the model's imbalance\n";
  on_root(*world, root, [&] {
    calib["done"] = sweep.points();
    data.calibration_json = calib.dump();
    data.complete = true;
    save_profile(o.out, data);
    std::remove(partial.c_str());
    std::cout << "calibrate: wrote " << o.out << ": " << data.gemms.size() << " GEMM, " << data.kernels.size()
              << " kernel, " << data.collectives.size() << " collective points, " << data.skews.size()
              << " arrival-skew points" << (data.expert_shares.empty() ? "" : ", the routing's expert shares") << "\n";
  });
  return 0;
}

}  // namespace tedsim::calibration
