#pragma once
// The one collective table: bytes moved and bus-bandwidth factor per operation (nccl-tests'
// definitions), shared by calibration (to report busbw) and prediction (to turn busbw into time).
#include "tedsim/profile/profile.hpp"

namespace tedsim {

// busbw = algbw * factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n.
double bus_bandwidth_factor(CollectiveOp op, int ranks);

}  // namespace tedsim
