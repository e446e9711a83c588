#pragma once
// The host's side of a step. Eager PyTorch launches every kernel from Python, one framework call
// each at the host's pace (Profile::host_op_seconds); a compute stream the host cannot keep fed
// idles (Phase::host_launch). Where the host waits on the device (MoE dispatch reads its token
// counts back: a device-to-host sync in every MoE layer's forward), the queue of launched work
// drains and the host starts again behind the device: its own code after the sync
// (Op::host_resume_calls) and the calls after it cost their full time until the host is ahead
// again. A CUDA graph (ParallelConfig::cuda_graph_scopes) replays a
// captured region for one call.
//
// A block with a sync is walked op by op from the op after its first sync around to that sync
// again (the steady state of a stack of such layers: the next layer's ops up to its sync are this
// segment's tail): the host issues each op's calls in turn, and the device starts an op once it is
// issued and the op before it is done. A block without one holds the device back only if its calls
// take the host longer than the block takes the device (the host runs ahead across blocks without
// a sync, so a short stretch of small kernels inside the block is covered by the lead it built).
#include <cstdint>

#include "tedsim/model/workload.hpp"

namespace tedsim {

struct HostLaunchWait {
  double host_s = 0;  // the host's time issuing the block's calls
  double wait_s = 0;  // the compute stream idle, waiting on them
};

HostLaunchWait host_launch_wait(const Block& block, double op_seconds, std::uint8_t graph_scopes);
// Appends the wait to `block` as the op "host_launch_wait" (phase host_launch); none when 0.
void add_host_launch_wait(Block& block, double op_seconds, std::uint8_t graph_scopes);
// A layer's recompute and backward, which the host issues back to back: their wait, on `backward`.
void add_host_launch_wait(Block& recompute, Block& backward, double op_seconds, std::uint8_t graph_scopes);

}  // namespace tedsim
