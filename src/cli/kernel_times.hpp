#pragma once
// `tedsim validate --kernel-times`: where a mis-prediction lives, kernel by kernel. Every kernel
// call of rank 0's step is timed (runtime/kernel_census.hpp) and set beside the prediction's ops of
// the same kind on that rank's stage, per iteration. Collectives are left to the phase table.
#include <iosfwd>

#include "tedsim/model/workload.hpp"
#include "tedsim/runtime/kernel_census.hpp"
#include "tedsim/sim/trace.hpp"

namespace tedsim::cli {

// `census`: rank 0's calls over `steps` training steps; `predicted`: the prediction's timeline;
// `workload`: the ops it was built from (to tell a GEMM from a memory-bound kernel by name).
void print_kernel_times(std::ostream& out, const runtime::KernelCensus& census, double steps,
                        const TraceRecorder& predicted, const Workload& workload);

}  // namespace tedsim::cli
