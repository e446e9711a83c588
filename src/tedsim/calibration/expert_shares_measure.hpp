#pragma once
// Dropless MoE models: how the router spreads the step's tokens over the experts
// (spec/expert_shares.hpp), measured by running the forward of the step itself: the model as the
// Trainer initialises it (the same seed as `validate`'s step), on the step's own synthetic tokens,
// one sequence per rank per micro-batch, every rank holding every expert. The counts of each MoE
// layer pass are summed over the world. Forward only: nothing is trained, so these are the shares
// of the first iterations, before the auxiliary loss has moved the router.
#include <string>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/spec/expert_shares.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim::calibration {

// Forward passes counted: one sequence per rank each, every MoE layer a pass.
inline constexpr int kRoutingIterations = 8;
// The forward FLOPs a rank may spend on the count (about half a minute on one core of the build
// VM): above it the count would outlast the calibration of a small model.
inline constexpr double kRoutingFlopLimit = 2e12;

// Collective over `world` (the CPU step's MPI world). Empty for a dense or capacity-routed model.
ExpertShares measure_expert_shares(Communicator& world, const ModelSpec& model, int seq_len, int iterations);

struct RoutingCount {
  ExpertShares shares;  // empty when not counted
  std::string skipped;  // why not ("" when counted, or when the model is not dropless)
};

// What calibrate and validate --calibrate run: the count on the CPU step over MPI whatever the
// calibration's backend (a freshly initialised router routes alike on both; the host, unlike a GPU
// of the calibration world, can hold a small model whole on every rank), unless the step refuses
// the model (alike on every rank, before any collective), every rank could not hold it (16 bytes
// a parameter within a quarter of the host's memory, shared by its `ranks_per_node`), or the
// passes would take more than kRoutingFlopLimit a rank. Collective over MPI_COMM_WORLD.
RoutingCount count_routing(const ModelSpec& model, int seq_len, int ranks_per_node);

}  // namespace tedsim::calibration
