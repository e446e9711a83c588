#pragma once
// validate --calibrate: before the job runs, measure every lookup its prediction makes that the
// profile cannot answer from measured points (a GEMM shape not measured exactly; a kernel size or
// collective beyond the measured range, on a borrowed group shape or never measured), on this
// world's own groups, add the points to the profile and write it back. The job is already under
// mpirun with the right ranks, so its groups are the ones the prediction prices.
#include <string>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/parallel_config.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace tedsim::calibration {

struct JobCalibration {
  int lookups = 0;                           // distinct questions the prediction asked
  int gemms = 0, kernels = 0, collectives = 0;  // points measured
  int skews = 0;                                // group shapes whose arrival skew was measured
  int unmeasurable = 0;  // lookups this backend cannot measure (another dtype, no such kernel here)
  bool created = false;  // the profile file did not exist
  bool routing_counted = false;  // dropless: the step's routing was counted into the profile
  std::string routing_skipped;   // ... or why it was not
};

// Collective over `world`. Rank 0 reads `profile_path` (a missing file starts a new profile),
// finds what is missing and shares the list; every rank measures; rank 0 writes the profile
// atomically, noting `model_name` (as given) among the models it was completed for. Throws
// InputError for a profile of another backend.
JobCalibration calibrate_job(Communicator& world, Backend backend, const ModelSpec& model, const std::string& model_name,
                             const TopologySpec& topology, const ParallelConfig& config, const std::string& profile_path,
                             int warmup, int reps);

}  // namespace tedsim::calibration
