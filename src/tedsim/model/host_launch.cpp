#include "tedsim/model/host_launch.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>

#include "tedsim/spec/cuda_graph_scope.hpp"

namespace tedsim {
namespace {

// The ops of the given blocks, in order, as one sequence the host issues back to back.
struct OpSequence {
  std::array<const Op*, 2 * Block::kMaxOps> ops{};
  int count = 0;
  explicit OpSequence(std::initializer_list<const Block*> blocks) {
    for (const Block* b : blocks)
      for (int i = 0; i < b->count; ++i) {
        if (count == int(ops.size())) throw std::logic_error("tedsim: host launch sequence longer than two blocks");
        ops[std::size_t(count++)] = &b->ops[i];
      }
  }
  const Op& operator[](int i) const { return *ops[std::size_t(i)]; }
};

// The host's time for op i: its calls, or inside a captured region one replay for the whole region
// (charged to the region's first op).
double host_seconds_of(const OpSequence& s, int i, double op_seconds, std::uint8_t graph_scopes) {
  const std::uint8_t scope = s[i].graph_scope & graph_scopes;
  if (scope == 0) return s[i].host_calls * op_seconds;
  const bool continues_region = i > 0 && (s[i - 1].graph_scope & graph_scopes) == scope;
  return continues_region ? 0.0 : op_seconds;
}

HostLaunchWait wait_of(const OpSequence& s, double op_seconds, std::uint8_t graph_scopes) {
  HostLaunchWait w;
  // One graph of the whole step: one launch per iteration, and no sync inside it.
  if (op_seconds <= 0 || s.count == 0 || (graph_scopes & kGraphFullIteration)) return w;
  int first_sync = -1;
  double device_s = 0;
  for (int i = 0; i < s.count; ++i) {
    w.host_s += host_seconds_of(s, i, op_seconds, graph_scopes);
    device_s += s[i].seconds;
    if (s[i].host_sync) w.host_s += s[i].host_resume_calls * op_seconds;
    if (first_sync < 0 && s[i].host_sync) first_sync = i;
  }
  if (first_sync < 0) {
    w.wait_s = std::max(0.0, w.host_s - device_s);
    return w;
  }
  // Host and device both at the moment the sync returned; the device's queue is empty while the
  // host runs its code after the sync.
  double host = s[first_sync].host_resume_calls * op_seconds, device = 0;
  for (int j = 1; j <= s.count; ++j) {
    const int i = (first_sync + j) % s.count;
    host += host_seconds_of(s, i, op_seconds, graph_scopes);
    device = std::max(device, host) + s[i].seconds;
    if (s[i].host_sync) host = std::max(host, device) + s[i].host_resume_calls * op_seconds;
  }
  w.wait_s = std::max(0.0, device - device_s);
  return w;
}

void append_wait(Block& b, double seconds) {
  if (seconds <= 0) return;
  Op op;
  op.name = "host_launch_wait";
  op.phase = Phase::host_launch;
  op.seconds = seconds;
  op.host_calls = 0;
  op.forward_only = true;
  b.add(op);
}

}  // namespace

HostLaunchWait host_launch_wait(const Block& block, double op_seconds, std::uint8_t graph_scopes) {
  return wait_of(OpSequence{&block}, op_seconds, graph_scopes);
}

void add_host_launch_wait(Block& block, double op_seconds, std::uint8_t graph_scopes) {
  append_wait(block, host_launch_wait(block, op_seconds, graph_scopes).wait_s);
}

void add_host_launch_wait(Block& recompute, Block& backward, double op_seconds, std::uint8_t graph_scopes) {
  append_wait(backward, wait_of(OpSequence{&recompute, &backward}, op_seconds, graph_scopes).wait_s);
}

}  // namespace tedsim
