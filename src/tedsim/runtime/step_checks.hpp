#pragma once
// What the step checks of its own results: that no gradient or loss went non-finite, and the
// checksums of the global model the equivalence tests compare across configurations.
#include <string>
#include <vector>

#include "tedsim/runtime/params.hpp"
#include "tedsim/runtime/step_ops.hpp"
#include "tedsim/runtime/trainer.hpp"

namespace tedsim::runtime {

// Where the first non-finite gradient is ("" if none): the parameters' gradients, then the owned
// ZeRO-3 shards (`shards`, null where not sharded, [0] non-expert, [1] expert). Read on the host:
// every call on the CPU backend; on CUDA (a download of every gradient) only when `loss_share` is
// non-finite, so a NaN gradient there is named one step later.
std::string first_non_finite(StepOps& ops, ParamStore& store, const Tensor* const shards[2], double loss_share);

// Collective over `world`: per-kind checksums of the global model (each global element counted
// once, by its primary replica), then "all".
std::vector<Checksum> global_checksums(StepOps& ops, ParamStore& store, Communicator& world);

}  // namespace tedsim::runtime
