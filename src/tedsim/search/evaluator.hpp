#pragma once
// Turns one configuration into a prediction: workload, timeline, memory and the derived rates.
// Group placements depend only on (G, P, t, e, layout, expert TP), so they are computed once per such
// combination and reused across the micro-batch and option variations of a search.
#include <map>
#include <tuple>

#include "tedsim/model/memory.hpp"
#include "tedsim/sim/simulator.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace tedsim {

struct Prediction {
  ParallelConfig config;
  SimResult sim;
  MemoryBreakdown memory;              // the stage with the largest peak (what must fit)
  std::vector<MemoryBreakdown> stage_memory;  // every pipeline stage's
  StageMap stage_map;
  double tokens_per_s = 0, samples_per_s = 0;
  double tflops_per_gpu = 0;            // hardware FLOPs (recompute included) per second per device
  double mfu = 0;                       // model FLOPs (no recompute) / (time x devices x dtype peak)
  double flops_per_iteration = 0;       // all devices, recompute included
  double model_flops_per_iteration = 0; // all devices, no recompute
  bool fits() const { return memory.fits(); }
};

class Evaluator {
 public:
  Evaluator(const ModelSpec& model, const TopologySpec& topology, const Profile& profile);
  // `config` must be valid (validate_config); `trace` optionally records the timeline.
  Prediction evaluate(const ParallelConfig& config, TraceRecorder* trace = nullptr) const;
  // For search: memory first, and no timeline for configurations that cannot fit (their rates
  // stay 0), which is where most of a large search space ends.
  Prediction evaluate_if_fits(const ParallelConfig& config) const;
  // For search, with a workload built for `config` (or for one that differs only in chunks, ZeRO
  // 0-2 and tiling, with those fields set): memory first; a configuration that fits but whose
  // lower bound on the iteration time cannot reach `tokens_per_s_to_beat` skips the timeline (its
  // rates stay 0).
  Prediction evaluate_bounded(const ParallelConfig& config, const Workload& workload, double tokens_per_s_to_beat) const;
  Workload workload_for(const ParallelConfig& config) const;
  void build_workload_for(const ParallelConfig& config, Workload& workload) const;
  const GroupSpans& spans_for(const ParallelConfig& config) const;
  const ModelSpec& model() const { return model_; }
  const TopologySpec& topology() const { return topology_; }
  const Profile& profile() const { return profile_; }

 private:
  Prediction evaluate(const ParallelConfig& config, const Workload& workload, TraceRecorder* trace, bool skip_unfit,
                      double tokens_per_s_to_beat) const;
  const ModelSpec& model_;
  const TopologySpec& topology_;
  const Profile& profile_;
  double peak_flops_;
  mutable std::map<std::tuple<int, int, int, int, bool, int, int>, GroupSpans> spans_;
};

}  // namespace tedsim
