#pragma once
// The categories an iteration's time is attributed to. Exposed times of all phases sum to the
// iteration time; busy times count every op, hidden or not.
#include <array>
#include <cstdint>

namespace tedsim {

enum class Phase : std::uint8_t {
  compute,       // GEMMs, attention and the layers' memory-bound kernels
  tp_allreduce,  // tensor-parallel all-reduces (attention, MLP, experts, embedding, loss) and,
                 // with sequence parallelism, the reduce-scatters that replace them
  tp_allgather,  // all-gathers over the tensor group: duplicate token dropping's, and sequence
                 // parallelism's before each tensor-parallel block
  ep_alltoall,   // expert-parallel all-to-alls
  dp_grad_sync,  // gradient sync over data / expert-data groups, ZeRO parameter all-gathers
  optimizer,     // Adam over the owned shard
  other,         // embedding lookup, final norm, loss
  pp_bubble,     // a pipeline stage idle, waiting on a neighbour's compute
  pp_p2p,        // a pipeline stage idle, waiting on an activation or gradient in flight
  host_launch,   // the compute stream idle, waiting on the host (CPU) to launch its next kernel
  cp_ring,       // context parallelism's key/value exchange around the ring, where the attention
                 // core's steps do not cover it
  count
};
inline constexpr int kPhaseCount = int(Phase::count);
const char* to_string(Phase p);

using PhaseTimes = std::array<double, kPhaseCount>;

}  // namespace tedsim
