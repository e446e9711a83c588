#pragma once
// One rank's timeline for one iteration: every micro-batch's forward and backward on the compute
// stream (layer collectives block it: the next op needs their output), gradient buckets on a
// data-parallel stream that starts each bucket once its layers' backward is done and the previous
// bucket has left, then the optimizer step and ZeRO's parameter all-gather. Overlap of gradient
// sync with backward is computed from these dependencies, not assumed.
#include "tedsim/model/workload.hpp"

namespace tedsim {

class TraceRecorder;

struct SimResult {
  double iteration_s = 0;
  PhaseTimes exposed{};  // sums to iteration_s
  PhaseTimes busy{};     // total time each category ran, hidden or not
  int grad_buckets = 0;  // buckets launched per iteration
};

// `trace` (optional) receives every op with its stream, start and duration.
SimResult simulate_iteration(const ModelSpec& model, const ParallelConfig& config, const Workload& workload,
                             TraceRecorder* trace = nullptr);

}  // namespace tedsim
