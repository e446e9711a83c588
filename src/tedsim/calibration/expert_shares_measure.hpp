#pragma once
// Dropless MoE models: how the router spreads the step's tokens over the experts
// (spec/expert_shares.hpp), measured by running the forward of the step itself: the model as the
// Trainer initialises it (the same seed as `validate`'s step), on the step's own synthetic tokens,
// one sequence per rank per micro-batch, every rank holding every expert. The counts of each MoE
// layer pass are summed over the world. Forward only: nothing is trained, so these are the shares
// of the first iterations, before the auxiliary loss has moved the router.
#include "tedsim/comm/communicator.hpp"
#include "tedsim/spec/expert_shares.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim::calibration {

// Collective over `world`. Empty for a dense or capacity-routed model.
ExpertShares measure_expert_shares(Communicator& world, const ModelSpec& model, int seq_len, int iterations);

}  // namespace tedsim::calibration
