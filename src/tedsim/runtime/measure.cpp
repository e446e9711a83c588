#include "tedsim/runtime/measure.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>

#include "tedsim/comm/watchdog.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim::runtime {

Spread spread_of(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const std::size_t lo = static_cast<std::size_t>(pos);
    const std::size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  s.median = at(0.5);
  s.min = v.front();
  s.max = v.back();
  s.p10 = at(0.1);
  s.p90 = at(0.9);
  return s;
}

namespace {

// Every rank's slices of the iteration nearest the median, onto every rank (host_max over one
// block per rank: [seconds, count, then name id, phase, start, end per slice]).
void gather_slices(Communicator& world, const std::vector<StepStats>& steps, MeasuredRun& run) {
  std::size_t pick = 0;
  for (std::size_t i = 1; i < run.iteration_s.size(); ++i)
    if (std::fabs(run.iteration_s[i] - run.iteration.median) < std::fabs(run.iteration_s[pick] - run.iteration.median)) pick = i;
  run.traced_iteration = int(pick) + 1;
  const StepStats& mine = steps[pick];
  const std::vector<std::string>& names = step_slice_names();
  std::vector<double> most{double(mine.slices.size())};
  world.host_max(most);
  const std::size_t per_rank = 2 + 4 * std::size_t(most[0]);
  const int n = world.size();
  constexpr double kEmpty = -1e300;
  std::vector<double> blocks(per_rank * std::size_t(n), kEmpty);
  double* own = blocks.data() + per_rank * std::size_t(world.rank());
  own[0] = mine.seconds;
  own[1] = double(mine.slices.size());
  for (std::size_t i = 0; i < mine.slices.size(); ++i) {
    const StepSlice& s = mine.slices[i];
    const auto it = std::find(names.begin(), names.end(), s.name);
    own[2 + 4 * i] = double(it == names.end() ? 0 : it - names.begin());
    own[3 + 4 * i] = s.phase;
    own[4 + 4 * i] = s.start_s;
    own[5 + 4 * i] = s.end_s;
  }
  world.host_max(blocks);
  run.rank_slices.assign(std::size_t(n), {});
  for (int r = 0; r < n; ++r) {
    const double* b = blocks.data() + per_rank * std::size_t(r);
    std::vector<StepSlice> timed;
    for (std::size_t i = 0; i < std::size_t(b[1]); ++i)
      timed.push_back({names[std::size_t(b[2 + 4 * i])].c_str(), int(b[3 + 4 * i]), b[4 + 4 * i], b[5 + 4 * i]});
    std::sort(timed.begin(), timed.end(), [](const StepSlice& x, const StepSlice& y) { return x.start_s < y.start_s; });
    std::vector<StepSlice>& out = run.rank_slices[std::size_t(r)];
    double at = 0;
    const auto compute_until = [&](double t) {
      if (t > at + 1e-9) out.push_back({names[0].c_str(), kCompute, at, t});
      at = std::max(at, t);
    };
    for (const StepSlice& s : timed) {
      compute_until(s.start_s);
      out.push_back(s);
      at = std::max(at, s.end_s);
    }
    compute_until(b[0]);
  }
}

}  // namespace

MeasuredRun measure_training(Communicator& world, const ModelSpec& model, const ParallelConfig& config,
                             const TrainerOptions& options, int warmup, int iterations) {
  if (warmup < 0) throw InputError("--warmup: expected a count >= 0, got " + std::to_string(warmup));
  if (iterations <= 0) throw InputError("--iters: expected a positive count, got " + std::to_string(iterations));
  MemoryCounter::reset_peak();
  MeasuredRun run;
  run.warmup = warmup;
  run.iterations = iterations;
  TrainerOptions measured = options;
  measured.track_routing = false;  // no host copies of routing inside timed iterations
  // Two one-value reductions per dropless MoE layer pass: small beside the step.
  measured.track_imbalance = model.is_moe() && model.moe.dropless();
  Trainer trainer(world, model, config, measured);
  run.description = trainer.describe();
  const bool held_out = options.census == nullptr;
  run.held_out_batch = warmup + iterations;
  if (held_out) run.held_out_before = trainer.global_loss(run.held_out_batch);
  // The evaluation's load samples are not a step's.
  const auto skip_imbalance = static_cast<std::ptrdiff_t>(trainer.imbalance_samples().size());
  const auto skip_rank_load = static_cast<std::ptrdiff_t>(trainer.rank_load_samples().size());
  long step = 0;  // the watchdog's step count (where --inject-fault strikes), warm-up included
  for (int i = 0; i < warmup; ++i) {
    watchdog::at_step(++step);
    run.losses.push_back(trainer.step().loss);
  }
  std::vector<std::array<double, kPhaseCount>> phases;
  std::vector<StepStats> traced;  // this rank's measured steps, with record_slices
  for (int i = 0; i < iterations; ++i) {
    watchdog::at_step(++step);
    world.barrier();  // iterations start together, so the slowest rank's time is the iteration's
    const StepStats st = trainer.step();
    run.losses.push_back(st.loss);
    if (options.record_slices) traced.push_back(st);
    std::vector<double> mx{st.seconds};
    world.host_max(mx);
    run.iteration_s.push_back(mx[0]);
    // Mean over ranks through host_max with one slot per rank: the control plane works on host
    // values whatever the data backend (NCCL reduces device memory only).
    const int n = world.size();
    std::vector<double> slots(static_cast<std::size_t>(n) * kPhaseCount, -1.0);
    for (int p = 0; p < kPhaseCount; ++p) slots[static_cast<std::size_t>(world.rank()) * kPhaseCount + p] = st.phase[p];
    world.host_max(slots);
    std::array<double, kPhaseCount> mean{};
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < kPhaseCount; ++p) mean[p] += slots[static_cast<std::size_t>(r) * kPhaseCount + p] / n;
    phases.push_back(mean);
  }
  run.iteration = spread_of(run.iteration_s);
  if (options.record_slices) gather_slices(world, traced, run);
  run.imbalance.assign(trainer.imbalance_samples().begin() + skip_imbalance, trainer.imbalance_samples().end());
  run.rank_load.assign(trainer.rank_load_samples().begin() + skip_rank_load, trainer.rank_load_samples().end());
  if (held_out) run.held_out_after = trainer.global_loss(run.held_out_batch);
  for (int p = 0; p < kPhaseCount; ++p) {
    std::vector<double> v;
    for (const auto& ph : phases) v.push_back(ph[p]);
    run.phase_median[p] = spread_of(v).median;
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::vector<double> mem{static_cast<double>(MemoryCounter::peak().load()), static_cast<double>(ru.ru_maxrss) * 1024.0};
  world.host_max(mem);
  run.tensor_peak_bytes = mem[0];
  run.max_rss_bytes = mem[1];
  return run;
}

}  // namespace tedsim::runtime
