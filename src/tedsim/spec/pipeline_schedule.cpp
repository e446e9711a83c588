#include "tedsim/spec/pipeline_schedule.hpp"

#include <algorithm>

namespace tedsim {

int warmup_forwards(int stage, int pp, int vpp, int microbatches, bool merged) {
  const int extra = merged ? 1 : 0;
  if (vpp == 1) return std::min(pp - stage - 1 + extra, microbatches);
  return std::min((pp - stage - 1) * 2 + (vpp - 1) * pp + extra, microbatches * vpp);
}

StageOrder::StageOrder(int stage, int pp, int vpp, int microbatches, bool merged)
    : pp_(pp),
      vpp_(vpp),
      total_(microbatches * vpp),
      warmup_(warmup_forwards(stage, pp, vpp, microbatches, merged)),
      merged_(merged) {}

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

std::vector<PipelineTask> stage_order(int stage, int pp, int vpp, int microbatches, bool merged) {
  const StageOrder order(stage, pp, vpp, microbatches, merged);
  std::vector<PipelineTask> tasks;
  tasks.reserve(std::size_t(order.size()));
  for (int i = 0; i < order.size(); ++i) tasks.push_back(order[i]);
  return tasks;
}

double peak_in_flight_bytes(const StageOrder& order, const double* chunk_bytes) {
  double now = 0, peak = 0;
  for (int i = 0; i < order.size(); ++i) {
    const PipelineTask t = order[i];
    if (t.backward) {
      now -= chunk_bytes[t.chunk];
    } else {
      now += chunk_bytes[t.chunk];
      peak = std::max(peak, now);
    }
  }
  return peak;
}

double peak_in_flight_bytes(int stage, int pp, int vpp, int microbatches, const double* chunk_bytes, bool merged,
                            double merged_layer_bytes) {
  const int total = microbatches * vpp, warmup = warmup_forwards(stage, pp, vpp, microbatches, merged);
  const int group = pp * vpp;
  // What a steady step holds beyond the kept chunks: a whole forward before its backward, or in a
  // merged step, the forward's layers as the backward's are freed, one layer ahead.
  const auto step_peak = [&](double forward, double backward) {
    return merged ? std::max(forward - backward, 0.0) + std::min(merged_layer_bytes, forward) : forward;
  };
  // Chunks of one size: the warm-up forwards and one more are the peak (merged: one layer more).
  bool equal = true;
  for (int v = 1; v < vpp; ++v) equal &= chunk_bytes[v] == chunk_bytes[0];
  if (equal) {
    if (warmup >= total) return total * chunk_bytes[0];
    return warmup * chunk_bytes[0] + step_peak(chunk_bytes[0], chunk_bytes[0]);
  }
  // Forward k runs chunk (k mod PV) / P, backward k chunk V - 1 - (k mod PV) / P.
  const auto forward_chunk = [&](int k) { return (k % group) / pp; };
  // Bytes of the warm-up forwards: whole periods hold every chunk P times.
  double chunk_sum = 0;
  for (int v = 0; v < vpp; ++v) chunk_sum += chunk_bytes[v];
  double kept = double(warmup / group) * pp * chunk_sum;
  for (int i = warmup / group * group; i < warmup; ++i) kept += chunk_bytes[forward_chunk(i)];
  double peak = kept;
  const int steps = std::min(total - warmup, group);
  for (int k = 0; k < steps; ++k) {
    const double forward = chunk_bytes[forward_chunk(warmup + k)], backward = chunk_bytes[vpp - 1 - forward_chunk(k)];
    peak = std::max(peak, kept + step_peak(forward, backward));
    kept += forward - backward;
  }
  return peak;
}

}  // namespace tedsim
