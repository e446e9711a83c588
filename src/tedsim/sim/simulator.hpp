#pragma once
// One iteration as a discrete-event timeline over all pipeline stages (one representative rank per
// stage). Each stage has a compute stream, which runs its schedule's forward and backward passes
// (pipeline_schedule.hpp) in order, each as soon as its input is there: the previous virtual
// stage's activation (or the next one's gradient) after its p2p transfer, on a link per direction
// that carries one transfer at a time; a data-parallel stream, which syncs gradient buckets as the
// backward of the last micro-batch (every micro-batch with ZeRO >= 2) finishes their layers; and,
// after both, the optimizer step and ZeRO's parameter all-gather. Layer collectives block the
// compute stream (the next op needs their output), so their time is exposed by construction. The
// iteration ends when the last stage to finish ends; its exposed times sum to the iteration time,
// with pp_bubble (idle, waiting on a neighbour's compute) and pp_p2p (idle, waiting on a transfer).
//
// Sends do not block the sender (Megatron-Core with overlapped p2p); a receive blocks the receiver.
// The timeline repeats exactly once every stage is in its steady state, so for many micro-batches it
// simulates a few and extrapolates, after checking that two more micro-batch groups add the same time.
#include <vector>

#include "tedsim/model/workload.hpp"
#include "tedsim/spec/pipeline_layout.hpp"

namespace tedsim {

class TraceRecorder;

struct StageTimes {
  double busy_s = 0;    // compute stream busy (forward, recompute, backward and their collectives)
  double bubble_s = 0;  // compute stream idle, waiting on a neighbour's compute
  double p2p_s = 0;     // compute stream idle, waiting on a transfer in flight
  double end_s = 0;     // the stage's optimizer step done
  double compute_end_s = 0;  // its last pass and gradient sync done (before the tied-embedding sync)
};

struct SimResult {
  double iteration_s = 0;
  PhaseTimes exposed{};  // of the stage that ends last; sums to iteration_s
  PhaseTimes busy{};     // of that stage: total time each category ran, hidden or not
  // Mean over stages of each stage's exposed time (sums to the mean stage end): what a step's
  // timers report as the mean over ranks, every stage having as many ranks. = exposed when P = 1.
  PhaseTimes mean_exposed{};
  int grad_buckets = 0;  // buckets that stage launched per iteration
  int critical_stage = 0;
  std::vector<StageTimes> stages;
};

// `trace` (optional) receives every pass of every stage (the first two micro-batches and the last
// op by op) with its stream, start and duration; a traced run simulates every micro-batch.
SimResult simulate_iteration(const ModelSpec& model, const ParallelConfig& config, const Workload& workload,
                             const StageMap& stage_map, TraceRecorder* trace = nullptr);
// No timeline is faster than its busiest stage's compute stream: every micro-batch's forward and
// backward of that stage's chunks, back to back, less every expert all-to-all where they may run
// overlapped (`a2a_overlap`). Cheap; search prunes with it.
double iteration_lower_bound(const ModelSpec& model, const Workload& workload, const StageMap& stage_map,
                             bool a2a_overlap = false);
// Same, with the configuration's own stage map.
SimResult simulate_iteration(const ModelSpec& model, const ParallelConfig& config, const Workload& workload,
                             TraceRecorder* trace = nullptr);

}  // namespace tedsim
