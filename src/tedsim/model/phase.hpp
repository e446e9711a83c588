#pragma once
// The categories an iteration's time is attributed to. Exposed times of all phases sum to the
// iteration time; busy times count every op, hidden or not.
#include <array>
#include <cstdint>

namespace tedsim {

enum class Phase : std::uint8_t {
  compute,       // GEMMs, attention and the layers' memory-bound kernels
  tp_allreduce,  // tensor-parallel all-reduces (attention, MLP, experts, embedding, loss)
  tp_allgather,  // duplicate-token-dropping all-gathers over the tensor group
  ep_alltoall,   // expert-parallel all-to-alls
  dp_grad_sync,  // gradient sync over data / expert-data groups, ZeRO parameter all-gathers
  optimizer,     // Adam over the owned shard
  other,         // embedding lookup, final norm, loss
  count
};
inline constexpr int kPhaseCount = int(Phase::count);
const char* to_string(Phase p);

using PhaseTimes = std::array<double, kPhaseCount>;

}  // namespace tedsim
