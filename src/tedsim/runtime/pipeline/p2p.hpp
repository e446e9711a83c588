#pragma once
// The activations and gradients that cross pipeline stages (Megatron-Core's p2p_communication):
// received blocking (the wait is pp_bubble), sent without blocking (copying into the message and
// posting it is pp_p2p), so that two neighbours that each send before they receive never wait on
// each other. A message's buffer lives until the transport is done with it.
#include <cstdint>
#include <deque>

#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

class StageLinks {
 public:
  explicit StageLinks(StepContext& c) : c_(c) {}
  // Buffers of sends still in flight (a step ended by an exception) are left to the process's end
  // rather than freed under the transport.
  ~StageLinks();
  StageLinks(const StageLinks&) = delete;
  StageLinks& operator=(const StageLinks&) = delete;

  // `activation`: a forward's output (else a backward's input gradient); the trace names them apart.
  void send(int to_stage, const float* data, std::size_t count, bool activation);
  void receive(int from_stage, float* data, std::size_t count);
  // The step's end: waits for every send.
  void finish();

 private:
  struct Outgoing {
    std::uint64_t ticket = 0;
    Tensor data;
  };
  void release_sent();

  StepContext& c_;
  std::deque<Outgoing> outgoing_;
};

}  // namespace tedsim::runtime
