#include "tedsim/sim/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "tedsim/sim/trace.hpp"

namespace tedsim {
namespace {

// Micro-batches drawn op by op in a trace (the first ones and the last, whose backward overlaps the
// gradient sync); the others appear as one slice, which keeps a trace of hundreds of micro-batches
// small enough to open.
constexpr int kTraceExpandedMicrobatches = 2;

class Timeline {
 public:
  Timeline(const ModelSpec& m, const Workload& w, TraceRecorder* trace)
      : m_(m), w_(w), trace_(trace), last_mb_(w.shape.ga - 1) {
    full_ne_bucket_s_ = w.nonexpert_sync_seconds(kGradBucketElems);
    full_ex_bucket_s_ = w.expert_sync_seconds(kGradBucketElems);
  }

  // Runs a block on the compute stream; all of it is exposed.
  void run(const Block& block, int times, const char* context, int microbatch, int layer) {
    if (traced(microbatch)) {
      double at = now_;
      const std::string where = "microbatch " + std::to_string(microbatch) + " " + context +
                                (layer >= 0 ? " layer " + std::to_string(layer) : std::string());
      for (int i = 0; i < block.count; ++i) {
        const Op& op = block.ops[i];
        trace_->add({op.name, where, op.phase, Stream::compute, at, op.seconds});
        at += op.seconds;
      }
    }
    now_ += times * block.seconds;
    for (int p = 0; p < kPhaseCount; ++p) {
      result_.exposed[p] += times * block.phase_seconds[p];
      result_.busy[p] += times * block.phase_seconds[p];
    }
  }

  // Plain forward and backward of `count` micro-batches with no gradient sync.
  void run_microbatches_without_sync(int first, int count) {
    int mb = first;
    for (; trace_ && mb < first + count && mb < kTraceExpandedMicrobatches; ++mb) {
      run_forward(mb, 1);
      run_backward(mb, 1);
    }
    const int rest = first + count - mb;
    if (rest <= 0) return;
    const double start = now_;
    run_forward(-1, rest);
    run_backward(-1, rest);
    if (trace_)
      trace_->add({"microbatches " + std::to_string(mb) + "-" + std::to_string(mb + rest - 1),
                   "forward and backward, no gradient sync", Phase::compute, Stream::compute, start, now_ - start});
  }

  // Forward and backward of one micro-batch whose gradients are synced in buckets as they appear.
  void run_microbatch_with_sync(int mb) {
    run_forward(mb, 1);
    run(w_.head_backward, 1, "backward head", mb, -1);
    for (int layer = m_.layers - 1; layer >= 0; --layer) {
      const LayerBlocks& l = m_.is_moe_layer(layer) ? w_.moe : w_.dense;
      run(l.recompute, 1, "recompute", mb, layer);
      run(l.backward, 1, "backward", mb, layer);
      add_grads(l.nonexpert_grad_elems, l.expert_grad_elems, mb, layer);
    }
    add_grads(w_.embedding_grad_elems, 0.0, mb, -1);
    flush(mb);
  }

  void finish_step() {
    // The optimizer needs every gradient: wait for the data-parallel stream.
    if (dp_free_ > now_) {
      result_.exposed[int(Phase::dp_grad_sync)] += dp_free_ - now_;
      now_ = dp_free_;
    }
    blocking("adam_step", Phase::optimizer, w_.optimizer_seconds);
    blocking("zero_param_allgather", Phase::dp_grad_sync, w_.param_allgather_seconds);
    result_.iteration_s = now_;
  }

  SimResult result() const { return result_; }

 private:
  void run_forward(int mb, int times) {
    run(w_.head_forward, times, "forward head", mb, -1);
    for (int layer = 0; layer < m_.layers; ++layer)
      run(m_.is_moe_layer(layer) ? w_.moe.forward : w_.dense.forward, times, "forward", mb, layer);
  }
  void run_backward(int mb, int times) {
    run(w_.head_backward, times, "backward head", mb, -1);
    for (int layer = m_.layers - 1; layer >= 0; --layer) {
      const LayerBlocks& l = m_.is_moe_layer(layer) ? w_.moe : w_.dense;
      run(l.recompute, times, "recompute", mb, layer);
      run(l.backward, times, "backward", mb, layer);
    }
  }

  void blocking(const char* name, Phase phase, double seconds) {
    if (seconds <= 0) return;
    if (trace_) trace_->add({name, "after the last micro-batch", phase, Stream::compute, now_, seconds});
    now_ += seconds;
    result_.exposed[int(phase)] += seconds;
    result_.busy[int(phase)] += seconds;
  }

  void launch_sync(const char* name, double seconds, int mb, int layer) {
    if (seconds <= 0) return;
    const double start = std::max(now_, dp_free_);
    dp_free_ = start + seconds;
    result_.busy[int(Phase::dp_grad_sync)] += seconds;
    ++result_.grad_buckets;
    if (traced(mb))
      trace_->add({name, "microbatch " + std::to_string(mb) + " after layer " + std::to_string(layer),
                   Phase::dp_grad_sync, Stream::data_parallel, start, seconds});
  }

  void add_grads(double nonexpert, double expert, int mb, int layer) {
    ne_pending_ += nonexpert;
    ex_pending_ += expert;
    for (; ne_pending_ >= kGradBucketElems; ne_pending_ -= kGradBucketElems)
      launch_sync("grad_sync_nonexpert", full_ne_bucket_s_, mb, layer);
    for (; ex_pending_ >= kGradBucketElems; ex_pending_ -= kGradBucketElems)
      launch_sync("grad_sync_expert", full_ex_bucket_s_, mb, layer);
  }

  void flush(int mb) {
    if (ne_pending_ > 0) launch_sync("grad_sync_nonexpert", w_.nonexpert_sync_seconds(ne_pending_), mb, 0);
    if (ex_pending_ > 0) launch_sync("grad_sync_expert", w_.expert_sync_seconds(ex_pending_), mb, 0);
    ne_pending_ = ex_pending_ = 0;
  }

  bool traced(int mb) const {
    return trace_ && mb >= 0 && (mb < kTraceExpandedMicrobatches || mb == last_mb_);
  }

  const ModelSpec& m_;
  const Workload& w_;
  TraceRecorder* trace_;
  int last_mb_;
  SimResult result_;
  double now_ = 0, dp_free_ = 0;
  double ne_pending_ = 0, ex_pending_ = 0;
  double full_ne_bucket_s_ = 0, full_ex_bucket_s_ = 0;
};

}  // namespace

SimResult simulate_iteration(const ModelSpec& model, const ParallelConfig& config, const Workload& workload,
                             TraceRecorder* trace) {
  Timeline timeline(model, workload, trace);
  const int ga = workload.shape.ga;
  if (config.zero >= 2) {
    // ZeRO-2 keeps only its gradient shard, so every micro-batch reduce-scatters its gradients.
    for (int mb = 0; mb < ga; ++mb) timeline.run_microbatch_with_sync(mb);
  } else {
    // Gradients accumulate locally until the last micro-batch, whose backward overlaps the sync.
    timeline.run_microbatches_without_sync(0, ga - 1);
    timeline.run_microbatch_with_sync(ga - 1);
  }
  timeline.finish_step();
  return timeline.result();
}

}  // namespace tedsim
