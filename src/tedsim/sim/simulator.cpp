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

// Time and per-phase time of a sequence of blocks.
struct Span {
  double seconds = 0;
  PhaseTimes phases{};
  void add(const Block& b, double times = 1.0) {
    seconds += times * b.seconds;
    for (int p = 0; p < kPhaseCount; ++p) phases[p] += times * b.phase_seconds[p];
  }
};

// The compute stream never waits for the data-parallel stream until the optimizer step, so the
// timeline is: micro-batches back to back on the compute stream, gradient buckets queued on the
// data-parallel stream as backward produces them, and a wait for that stream before the step.
class Timeline {
 public:
  Timeline(const ModelSpec& m, const Workload& w, TraceRecorder* trace)
      : m_(m), w_(w), trace_(trace), last_mb_(w.shape.ga - 1) {
    full_ne_bucket_s_ = w.nonexpert_sync_seconds(kGradBucketElems);
    full_ex_bucket_s_ = w.expert_sync_seconds(kGradBucketElems);
    const double dense = m.dense_layers(), moe = m.moe_layers();
    forward_.add(w.head_forward);
    forward_.add(w.dense.forward, dense);
    forward_.add(w.moe.forward, moe);
    backward_.add(w.head_backward);
    for (const LayerBlocks* l : {&w.dense, &w.moe}) {
      const double n = l == &w.dense ? dense : moe;
      backward_.add(l->recompute, n);
      backward_.add(l->backward, n);
    }
    dense_bwd_s_ = w.dense.recompute.seconds + w.dense.backward.seconds;
    moe_bwd_s_ = w.moe.recompute.seconds + w.moe.backward.seconds;
  }

  // Forward and backward of `count` micro-batches whose gradients only accumulate.
  void microbatches_without_sync(int first, int count) {
    int mb = first;
    for (; mb < first + count && traced(mb); ++mb) {
      trace_forward(mb);
      trace_backward(mb, false);
    }
    const int rest = first + count - mb;
    if (rest <= 0) return;
    if (trace_)
      trace_->add({"microbatches " + std::to_string(mb) + "-" + std::to_string(mb + rest - 1),
                   "forward and backward, no gradient sync", Phase::compute, Stream::compute, now_,
                   rest * (forward_.seconds + backward_.seconds)});
    advance(forward_, rest);
    advance(backward_, rest);
  }

  // Forward and backward of one micro-batch whose gradients are synced in buckets as each layer's
  // backward finishes them.
  void microbatch_with_sync(int mb) {
    if (traced(mb)) {
      trace_forward(mb);
      trace_backward(mb, true);
      return;
    }
    advance(forward_, 1);
    const double start = now_;
    now_ += w_.head_backward.seconds;
    for (int layer = m_.layers - 1; layer >= 0; --layer) {
      const bool moe = m_.is_moe_layer(layer);
      now_ += moe ? moe_bwd_s_ : dense_bwd_s_;
      const LayerBlocks& l = moe ? w_.moe : w_.dense;
      add_grads(l.nonexpert_grad_elems, l.expert_grad_elems, mb, layer);
    }
    add_grads(w_.embedding_grad_elems, 0.0, mb, -1);
    flush(mb);
    now_ = start;
    advance(backward_, 1);
  }

  // ZeRO-2 syncs every micro-batch. Once a micro-batch's buckets drain before the next backward
  // starts, every later micro-batch repeats it exactly, so those are added without replaying.
  void microbatches_each_with_sync(int count) {
    for (int mb = 0; mb < count; ++mb) {
      const int buckets_before = result_.grad_buckets;
      const double busy_before = result_.busy[int(Phase::dp_grad_sync)];
      microbatch_with_sync(mb);
      const int remaining = count - 1 - mb - 1;  // micro-batches before the last one
      const bool drains = dp_free_ <= now_ + forward_.seconds;
      if (drains && remaining > 0 && !traced(mb + 1)) {
        advance(forward_, remaining);
        advance(backward_, remaining);
        result_.grad_buckets += remaining * (result_.grad_buckets - buckets_before);
        result_.busy[int(Phase::dp_grad_sync)] += remaining * (result_.busy[int(Phase::dp_grad_sync)] - busy_before);
        mb += remaining;
      }
    }
  }

  void finish_step() {
    // The optimizer needs every gradient: wait for the data-parallel stream.
    if (dp_free_ > now_) {
      if (trace_) trace_->add({"wait for gradient sync", "before the optimizer", Phase::dp_grad_sync, Stream::compute, now_, dp_free_ - now_});
      result_.exposed[int(Phase::dp_grad_sync)] += dp_free_ - now_;
      now_ = dp_free_;
    }
    blocking("adam_step", Phase::optimizer, w_.optimizer_seconds);
    blocking("zero_param_allgather", Phase::dp_grad_sync, w_.param_allgather_seconds);
    result_.iteration_s = now_;
  }

  SimResult result() const { return result_; }

 private:
  bool traced(int mb) const { return trace_ && (mb < kTraceExpandedMicrobatches || mb == last_mb_); }

  void advance(const Span& s, double times) {
    now_ += times * s.seconds;
    for (int p = 0; p < kPhaseCount; ++p) {
      result_.exposed[p] += times * s.phases[p];
      result_.busy[p] += times * s.phases[p];
    }
  }

  // Op-by-op versions for traced micro-batches; they advance time exactly as the fast path does.
  void trace_block(const Block& block, int mb, const char* pass, int layer) {
    const std::string where = "microbatch " + std::to_string(mb) + " " + pass +
                              (layer >= 0 ? " layer " + std::to_string(layer) : std::string());
    for (int i = 0; i < block.count; ++i) {
      const Op& op = block.ops[i];
      trace_->add({op.name, where, op.phase, Stream::compute, now_, op.seconds});
      now_ += op.seconds;
      result_.exposed[int(op.phase)] += op.seconds;
      result_.busy[int(op.phase)] += op.seconds;
    }
  }
  void trace_forward(int mb) {
    trace_block(w_.head_forward, mb, "forward head", -1);
    for (int layer = 0; layer < m_.layers; ++layer)
      trace_block(m_.is_moe_layer(layer) ? w_.moe.forward : w_.dense.forward, mb, "forward", layer);
  }
  void trace_backward(int mb, bool sync) {
    trace_block(w_.head_backward, mb, "backward head", -1);
    for (int layer = m_.layers - 1; layer >= 0; --layer) {
      const LayerBlocks& l = m_.is_moe_layer(layer) ? w_.moe : w_.dense;
      trace_block(l.recompute, mb, "recompute", layer);
      trace_block(l.backward, mb, "backward", layer);
      if (sync) add_grads(l.nonexpert_grad_elems, l.expert_grad_elems, mb, layer);
    }
    if (sync) {
      add_grads(w_.embedding_grad_elems, 0.0, mb, -1);
      flush(mb);
    }
  }

  void blocking(const char* name, Phase phase, double seconds) {
    if (seconds <= 0) return;
    if (trace_) trace_->add({name, "after the last micro-batch", phase, Stream::compute, now_, seconds});
    now_ += seconds;
    result_.exposed[int(phase)] += seconds;
    result_.busy[int(phase)] += seconds;
  }

  // Queues `count` buckets of `seconds` each on the data-parallel stream, behind what is queued.
  void launch_sync(const char* name, double seconds, int mb, int layer, int count = 1) {
    if (seconds <= 0 || count <= 0) return;
    if (!traced(mb)) {
      dp_free_ = std::max(now_, dp_free_) + count * seconds;
    } else {
      for (int i = 0; i < count; ++i) {
        const double start = std::max(now_, dp_free_);
        dp_free_ = start + seconds;
        trace_->add({name, "microbatch " + std::to_string(mb) + (layer >= 0 ? " after layer " + std::to_string(layer) : " after embedding"),
                     Phase::dp_grad_sync, Stream::data_parallel, start, seconds});
      }
    }
    result_.busy[int(Phase::dp_grad_sync)] += count * seconds;
    result_.grad_buckets += count;
  }

  void add_grads(double nonexpert, double expert, int mb, int layer) {
    ne_pending_ += nonexpert;
    ex_pending_ += expert;
    const int ne_full = int(ne_pending_ / kGradBucketElems), ex_full = int(ex_pending_ / kGradBucketElems);
    ne_pending_ -= ne_full * kGradBucketElems;
    ex_pending_ -= ex_full * kGradBucketElems;
    launch_sync("grad_sync_nonexpert", full_ne_bucket_s_, mb, layer, ne_full);
    launch_sync("grad_sync_expert", full_ex_bucket_s_, mb, layer, ex_full);
  }

  void flush(int mb) {
    if (ne_pending_ > 0) launch_sync("grad_sync_nonexpert", w_.nonexpert_sync_seconds(ne_pending_), mb, -1);
    if (ex_pending_ > 0) launch_sync("grad_sync_expert", w_.expert_sync_seconds(ex_pending_), mb, -1);
    ne_pending_ = ex_pending_ = 0;
  }

  const ModelSpec& m_;
  const Workload& w_;
  TraceRecorder* trace_;
  int last_mb_;
  SimResult result_;
  Span forward_, backward_;
  double dense_bwd_s_ = 0, moe_bwd_s_ = 0;
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
    timeline.microbatches_each_with_sync(ga);
  } else {
    // Gradients accumulate locally until the last micro-batch, whose backward overlaps the sync.
    timeline.microbatches_without_sync(0, ga - 1);
    timeline.microbatch_with_sync(ga - 1);
  }
  timeline.finish_step();
  return timeline.result();
}

}  // namespace tedsim
