#pragma once
// The calibration driver: derives the sweep (sweep.hpp), measures every point on this rank's
// device and over the real TED groups of this MPI world, prints nccl-tests-style tables (rank 0),
// and writes a measured profile (measured_profile.hpp) atomically. Progress is checkpointed to
// `<out>.partial` after every point; re-running the same command resumes from there (arguments
// must match, else it refuses) and produces the complete profile.
// Every rank calls run_calibration; MPI must be initialised (the CLI does it).
#include <cstdint>
#include <string>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace tedsim::calibration {

struct CalibrationOptions {
  Backend backend = Backend::cpu;
  std::string model_name, topology_name;  // as given on the command line (checked on resume)
  ModelSpec model;
  TopologySpec topology;
  int gpus = 0;              // cluster size the shapes are derived for; 0: the world size
  int global_batch = 0;      // 0: 8 per device
  int seq_len = 0;
  bool quick = false;
  bool grid = false;         // generic GEMM/kernel grid instead of the model's shapes
  std::int64_t min_bytes = 0, max_bytes = 0;  // collectives; 0: defaults
  double step_factor = 0;
  int reps = 0, warmup = -1;  // 0 / -1: defaults (quick: 5 / 1, full: 20 / 2)
  double spread_limit = 1.5;  // re-measure (up to twice) points whose max/min is above this
  std::string out;
  int stop_after = 0;         // testing: stop after measuring this many points (0: never)
  bool verbose_tables = true;
};

// Returns the process exit code (0). Throws InputError / RunError (on every rank alike).
int run_calibration(const CalibrationOptions& options);

}  // namespace tedsim::calibration
