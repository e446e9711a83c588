#include "tedsim/sim/pipeline_schedule.hpp"

#include <algorithm>

namespace tedsim {

int warmup_forwards(int stage, int pp, int vpp, int microbatches) {
  if (vpp == 1) return std::min(pp - stage - 1, microbatches);
  const int total = microbatches * vpp;
  if (microbatches == pp) return total;
  return std::min((pp - stage - 1) * 2 + (vpp - 1) * pp, total);
}

std::vector<PipelineTask> stage_order(int stage, int pp, int vpp, int microbatches) {
  const int total = microbatches * vpp;
  const int warmup = warmup_forwards(stage, pp, vpp, microbatches);
  const int group = pp * vpp;
  auto task = [&](int k, bool backward) {
    PipelineTask t;
    t.backward = backward;
    if (vpp == 1) {
      t.microbatch = k;
      return t;
    }
    const int chunk = (k % group) / pp;
    t.chunk = backward ? vpp - 1 - chunk : chunk;
    t.microbatch = (k / group) * pp + k % pp;
    return t;
  };
  std::vector<PipelineTask> order;
  order.reserve(std::size_t(2 * total));
  for (int k = 0; k < warmup; ++k) order.push_back(task(k, false));
  for (int k = 0; k < total - warmup; ++k) {
    order.push_back(task(warmup + k, false));
    order.push_back(task(k, true));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(task(k, true));
  return order;
}

double peak_in_flight_bytes(const std::vector<PipelineTask>& order, const double* chunk_bytes) {
  double now = 0, peak = 0;
  for (const PipelineTask& t : order) {
    if (t.backward) {
      now -= chunk_bytes[t.chunk];
    } else {
      now += chunk_bytes[t.chunk];
      peak = std::max(peak, now);
    }
  }
  return peak;
}

}  // namespace tedsim
