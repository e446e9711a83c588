#pragma once
// The arrival-skew loop of calibration: how long a rank waits inside a blocking collective for
// the last member of its group after every rank computed the same work, as in a training step.
// Collective timings line ranks up first (as nccl-tests does) and so measure the transfer alone;
// the step's phase timers also count this wait, which on a loaded host is often the larger part.
#include "tedsim/calibration/bench.hpp"
#include "tedsim/calibration/sweep.hpp"
#include "tedsim/comm/communicator.hpp"
#include "tedsim/profile/measured_profile.hpp"

namespace tedsim::calibration {

// Collective over `world` (every rank calls it; `group` is this rank's group of the case's kind,
// all groups of the kind run at once). Each repetition: `gemm` repeated to about case.compute_s
// (gemm_s: its time, the same on every rank), then two 1-element all-reduces on the group; the
// first one's time beyond the second's (which starts lined up) is the wait. Repetitions: up to
// `reps`, fewer for long segments (about half a second of compute per point), at least 5.
SkewPoint measure_arrival_skew(Communicator& world, Communicator& group, Bench& bench, const Prepared& gemm,
                               double gemm_s, const SkewCaseSpec& c, int reps);

}  // namespace tedsim::calibration
