#include "tedsim/runtime/pipeline/p2p.hpp"

namespace tedsim::runtime {

StageLinks::~StageLinks() {
  if (outgoing_.empty()) return;
  static auto* const unfinished = new std::deque<Outgoing>;
  for (Outgoing& m : outgoing_) unfinished->push_back(std::move(m));
}

void StageLinks::release_sent() {
  while (!outgoing_.empty() && c_.pipe->send_done(outgoing_.front().ticket)) outgoing_.pop_front();
}

void StageLinks::send(int to_stage, const float* data, std::size_t count, bool activation) {
  const double t0 = c_.clock();
  release_sent();
  outgoing_.emplace_back();
  Outgoing& m = outgoing_.back();
  float* buf = ensure(m.data, count);
  c_.ops.copy(buf, data, count);
  c_.ops.fence();
  m.ticket = c_.pipe->send(buf, count, Dtype::fp32, to_stage);
  c_.charge(kPpP2p, activation ? "p2p_send_activation" : "p2p_send_gradient", t0, now_s());
}

void StageLinks::receive(int from_stage, float* data, std::size_t count) {
  const double t0 = c_.clock();
  c_.pipe->recv(data, count, Dtype::fp32, from_stage);
  c_.charge(kPpBubble, "pipeline bubble", t0, now_s());
}

void StageLinks::finish() {
  const double t0 = c_.clock();
  c_.pipe->wait_sends();
  outgoing_.clear();
  c_.charge(kPpP2p, "wait for p2p", t0, now_s());
}

}  // namespace tedsim::runtime
