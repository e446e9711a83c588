#pragma once
// The validation driver's measurement: warm-up iterations, then N timed iterations of the training
// step, aggregated over ranks.
//  - iteration time of an iteration = the slowest rank's (host_max); median / min / max / p10 / p90
//    over the measured iterations;
//  - phase times = the mean over ranks of each rank's exposed time per phase (each rank's phases
//    sum to its iteration time; "compute" is the remainder after the bracketed phases), median
//    over iterations;
//  - memory = the peak of the bytes held by the step's own tensors (TrackingAllocator: parameters,
//    gradients, Adam state, activations, communication buffers), max over ranks, next to the
//    process's max RSS (getrusage), which also counts MPI's buffers and the binary.
#include <limits>
#include <vector>

#include "tedsim/runtime/trainer.hpp"

namespace tedsim::runtime {

struct Spread {
  double median = 0, min = 0, max = 0, p10 = 0, p90 = 0;
};
Spread spread_of(std::vector<double> values);

struct MeasuredRun {
  int warmup = 0, iterations = 0;
  std::vector<double> losses;            // every step, warm-up included
  // Whether the model learns: the loss on one batch no step trains on (the samples of the step
  // after the last), before the first step and after the last. A step's own loss compares
  // batches of different difficulty; this compares one batch. NaN where not measured (under a
  // kernel census, whose counts must be the steps' alone).
  std::int64_t held_out_batch = 0;
  double held_out_before = std::numeric_limits<double>::quiet_NaN();
  double held_out_after = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> iteration_s;       // measured iterations, max over ranks
  Spread iteration;                      // of iteration_s
  PhaseSeconds phase_median{};           // median over iterations of the rank-mean phase time
  double tensor_peak_bytes = 0;          // max over ranks
  double max_rss_bytes = 0;              // max over ranks
  std::string description;               // Trainer::describe()
  // Dropless models: the busiest expert's tokens over the mean, per MoE layer pass, on rank 0's
  // expert group (warm-up included).
  std::vector<double> imbalance;
  std::vector<double> rank_load;  // the same passes' busiest expert rank: its rows over the mean rank's
  // With TrainerOptions::record_slices: the measured iteration nearest the median (its number,
  // from 1), and on every world rank its timed regions in time order, the gaps between them filled
  // with "compute" slices, up to that rank's end of the step.
  int traced_iteration = 0;
  std::vector<std::vector<StepSlice>> rank_slices;
};

// Collective over `world`. Throws what the Trainer throws.
MeasuredRun measure_training(Communicator& world, const ModelSpec& model, const ParallelConfig& config,
                             const TrainerOptions& options, int warmup, int iterations);

}  // namespace tedsim::runtime
