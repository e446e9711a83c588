#include "tedsim/sim/pipeline_schedule.hpp"

#include <algorithm>

namespace tedsim {

int warmup_forwards(int stage, int pp, int vpp, int microbatches) {
  if (vpp == 1) return std::min(pp - stage - 1, microbatches);
  const int total = microbatches * vpp;
  if (microbatches == pp) return total;
  return std::min((pp - stage - 1) * 2 + (vpp - 1) * pp, total);
}

StageOrder::StageOrder(int stage, int pp, int vpp, int microbatches)
    : pp_(pp), vpp_(vpp), total_(microbatches * vpp), warmup_(warmup_forwards(stage, pp, vpp, microbatches)) {}

PipelineTask StageOrder::pass(int k, bool backward) const {
  PipelineTask t;
  t.backward = backward;
  if (vpp_ == 1) {
    t.microbatch = k;
    return t;
  }
  const int group = pp_ * vpp_;
  const int chunk = (k % group) / pp_;
  t.chunk = backward ? vpp_ - 1 - chunk : chunk;
  t.microbatch = (k / group) * pp_ + k % pp_;
  return t;
}

// Warm-up forwards, then forward k + warm-up and backward k in turn, then the last backwards.
PipelineTask StageOrder::operator[](int i) const {
  if (i < warmup_) return pass(i, false);
  const int steady = total_ - warmup_;
  const int j = i - warmup_;
  if (j < 2 * steady) return j % 2 == 0 ? pass(warmup_ + j / 2, false) : pass(j / 2, true);
  return pass(steady + (j - 2 * steady), true);
}

std::vector<PipelineTask> stage_order(int stage, int pp, int vpp, int microbatches) {
  const StageOrder order(stage, pp, vpp, microbatches);
  std::vector<PipelineTask> tasks;
  tasks.reserve(std::size_t(order.size()));
  for (int i = 0; i < order.size(); ++i) tasks.push_back(order[i]);
  return tasks;
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
