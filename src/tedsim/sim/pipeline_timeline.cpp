#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "tedsim/sim/arrival_skew.hpp"
#include "tedsim/sim/overlapped_pair.hpp"
#include "tedsim/spec/pipeline_schedule.hpp"
#include "tedsim/sim/simulator.hpp"
#include "tedsim/sim/trace.hpp"

namespace tedsim {
namespace {

// Micro-batches drawn op by op in a trace (the first ones and the last, whose backward overlaps the
// gradient sync); the others appear as one slice per pass.
constexpr int kTraceExpandedMicrobatches = 2;

// Time and per-phase time of a sequence of blocks.
struct Span {
  double seconds = 0;
  PhaseTimes phases{};
  void add(const Block& b) {
    seconds += b.seconds;
    for (int p = 0; p < kPhaseCount; ++p) phases[p] += b.phase_seconds[p];
  }
};

// Gradients a backward pass finishes, `offset` seconds after it starts.
struct GradReady {
  double offset, nonexpert, expert;
};

// What one model chunk of one stage costs per micro-batch.
struct ChunkWork {
  Span forward, backward;
  std::vector<const Block*> forward_blocks, backward_blocks;  // in order, for the arrival waits
  // For merged steps (expert all-to-all overlap): each layer's nodes, forward in layer order,
  // backward in backward order, and the seconds of the rest (embedding, head, MTP), which runs alone.
  std::vector<PassNodes> forward_layers, backward_layers;
  double forward_alone_s = 0, backward_alone_s = 0;
  std::vector<GradReady> grads;  // in backward order
  double zero3_hidden_fwd = 0, zero3_hidden_bwd = 0;
  ModelChunk chunk;
};

struct StageWork {
  std::vector<ChunkWork> chunks;
  double nonexpert_params = 0, expert_params = 0;
  double expert_rows_s = 0;  // per micro-batch: its MoE layers' ops on the experts' rows, every pass
};

// The ops that run on the local experts' rows (moe_ops.cpp's expert_*: the layout copies, the
// grouped GEMMs, the activation, its clamp and the second bias), whose time follows the rank's
// share of the routed tokens.
double expert_rows_seconds(const Block& b) {
  double s = 0;
  for (int i = 0; i < b.count; ++i)
    if (!b.ops[i].is_collective && std::strncmp(b.ops[i].name, "expert_", 7) == 0) s += b.ops[i].seconds;
  return s;
}

std::vector<StageWork> stage_work(const ModelSpec& m, const Workload& w, const StageMap& map) {
  std::vector<StageWork> stages(std::size_t(map.pp));
  for (int p = 0; p < map.pp; ++p) {
    StageWork& sw = stages[std::size_t(p)];
    for (int v = 0; v < map.vpp; ++v) {
      const ModelChunk& c = map.chunk(p, v);
      ChunkWork cw;
      cw.chunk = c;
      const auto forward = [&](const Block& b) {
        cw.forward.add(b);
        cw.forward_blocks.push_back(&b);
      };
      const auto backward = [&](const Block& b) {
        cw.backward.add(b);
        cw.backward_blocks.push_back(&b);
      };
      if (c.embedding) forward(w.embedding_forward);
      for (int layer = c.first_layer; layer < c.first_layer + c.layers; ++layer) {
        const LayerBlocks& l = w.layer_blocks(m, layer);
        forward(l.forward);
        cw.forward_layers.push_back(forward_nodes(l.forward));
        if (m.is_moe_layer(layer))
          sw.expert_rows_s += expert_rows_seconds(l.forward) + expert_rows_seconds(l.recompute) + expert_rows_seconds(l.backward);
        sw.nonexpert_params += l.nonexpert_grad_elems;
        sw.expert_params += l.expert_grad_elems;
      }
      if (c.head) {
        forward(w.head_forward);
        // Multi-token prediction after the loss: each module's entry, a layer of the last
        // layer's kind and the shared head again; backward in reverse, before the main head's.
        const LayerBlocks& last = w.layer_blocks(m, m.layers - 1);
        for (int k = 0; k < c.mtp_layers; ++k) {
          forward(w.mtp_forward);
          forward(last.forward);
          forward(w.head_forward);
        }
        for (int k = 0; k < c.mtp_layers; ++k) {
          backward(w.head_backward);
          backward(last.recompute);
          backward(last.backward);
          backward(w.mtp_backward);
          cw.grads.push_back({cw.backward.seconds, last.nonexpert_grad_elems + w.mtp_grad_elems, last.expert_grad_elems});
          sw.nonexpert_params += last.nonexpert_grad_elems + w.mtp_grad_elems;
          sw.expert_params += last.expert_grad_elems;
          if (m.is_moe_layer(m.layers - 1))
            sw.expert_rows_s += expert_rows_seconds(last.forward) + expert_rows_seconds(last.recompute) + expert_rows_seconds(last.backward);
          cw.zero3_hidden_fwd += last.zero3_hidden_forward_s;
          cw.zero3_hidden_bwd += last.zero3_hidden_backward_s;
        }
        backward(w.head_backward);
        cw.grads.push_back({cw.backward.seconds, w.head_grad_elems, 0.0});
        sw.nonexpert_params += w.head_grad_elems;
      }
      for (int layer = c.first_layer + c.layers - 1; layer >= c.first_layer; --layer) {
        const LayerBlocks& l = w.layer_blocks(m, layer);
        backward(l.recompute);
        backward(l.backward);
        cw.backward_layers.push_back(backward_nodes(l.recompute, l.backward));
        if (!l.grads_synced_in_backward)
          cw.grads.push_back({cw.backward.seconds, l.nonexpert_grad_elems, l.expert_grad_elems});
        // ZeRO-3's gathers hidden behind the forward and behind the backward.
        cw.zero3_hidden_fwd += l.zero3_hidden_forward_s;
        cw.zero3_hidden_bwd += l.zero3_hidden_backward_s;
      }
      if (c.embedding) {
        backward(w.embedding_backward);
        cw.grads.push_back({cw.backward.seconds, w.embedding_grad_elems, 0.0});
        sw.nonexpert_params += w.embedding_grad_elems;
      }
      cw.forward_alone_s = cw.forward.seconds;
      for (const PassNodes& n : cw.forward_layers) cw.forward_alone_s -= n.total();
      cw.backward_alone_s = cw.backward.seconds;
      for (const PassNodes& n : cw.backward_layers) cw.backward_alone_s -= n.total();
      sw.chunks.push_back(std::move(cw));
    }
  }
  return stages;
}

// One run of the discrete-event timeline for `m` micro-batches.
class PipelineTimeline {
 public:
  PipelineTimeline(const ModelSpec& m, const ParallelConfig& c, const Workload& w, const StageMap& map,
                   const std::vector<StageWork>& work, const ArrivalSkew& skew, TraceRecorder* trace)
      : m_(m), c_(c), w_(w), map_(map), work_(work), skew_(skew), trace_(trace), P_(map.pp), V_(map.vpp) {
    if (c.moe_a2a_overlap) {
      const int sms = w.profile ? w.profile->device_sms() : 0;
      sm_fraction_ = sms > 0 ? double(c.moe_a2a_overlap_sms) / sms : 0.0;
      merged_.assign(std::size_t(P_ * V_ * V_), MergedTime{});
      merged_known_.assign(merged_.size(), false);
    }
  }

  // Every stage's group clocks when its first pass starts (P = 1: after micro-batches run
  // outside the timeline); default: the ranks met at the iteration's start.
  void set_initial_clock(const GroupClock& clock) { initial_clock_ = clock; }

  SimResult run(int microbatches) {
    mb_count_ = microbatches;
    const int virtual_stages = P_ * V_;
    const std::size_t keys = std::size_t(microbatches) * virtual_stages * 2;
    finish_.assign(keys, -1.0);
    transfer_start_.assign(keys, -1.0);
    transfer_end_.assign(keys, -1.0);
    stages_.assign(std::size_t(P_), StageState{});
    for (StageState& st : stages_) st.clock = initial_clock_;
    orders_.clear();
    std::size_t remaining = 0;
    for (int p = 0; p < P_; ++p) {
      orders_.emplace_back(p, P_, V_, microbatches, c_.moe_a2a_overlap);
      stages_[std::size_t(p)].current = orders_.back()[0];
      remaining += std::size_t(orders_.back().size());
      if (trace_) trace_->name_stage(p, "stage " + std::to_string(p) + ": " + stage_text(p));
    }
    // Each sweep runs, stage by stage, every task whose input is there; a valid schedule always
    // lets some stage advance. Sweeps alternate direction: activations flow down the stages,
    // gradients up, and each sweep carries one of them through.
    for (bool down = true; remaining > 0; down = !down) {
      std::size_t ran = 0;
      for (int i = 0; i < P_; ++i) {
        const int p = down ? i : P_ - 1 - i;
        StageState& st = stages_[std::size_t(p)];
        const StageOrder& order = orders_[std::size_t(p)];
        while (st.next < order.size()) {
          // Expert all-to-all overlap: a steady-state forward runs merged with the backward after it.
          const int step = order.merges_with_next(st.next) ? 2 : 1;
          if (step == 2 ? !try_run_merged(p, st.current, order[st.next + 1]) : !try_run(p, st.current)) break;
          st.next += step;
          ran += std::size_t(step);
          if (st.next < order.size()) st.current = order[st.next];
        }
      }
      if (ran == 0) throw std::logic_error("tedsim: pipeline timeline deadlocked (a schedule order its dependencies cannot run)");
      remaining -= ran;
    }
    finish_step();
    return result();
  }

 private:
  struct StageState {
    int next = 0;
    PipelineTask current;  // order[next]
    double compute_free = 0, dp_free = 0, end = 0;
    double link_free[2] = {0, 0};  // sends downstream (activations) and upstream (gradients)
    double ne_pending = 0, ex_pending = 0;
    PhaseTimes exposed{}, busy{};
    int grad_buckets = 0, p2p_sends = 0;
    StageTimes times;
    GroupClock clock;                           // compute since each group kind last met
    bool data_met = false, expert_data_met = false;  // this iteration's first bucket launched
  };

  std::size_t key(int mb, int vstage, bool backward) const {
    return (std::size_t(mb) * std::size_t(P_ * V_) + std::size_t(vstage)) * 2 + (backward ? 1 : 0);
  }

  // When `task`'s input is there on stage `p` (false: another stage has not produced it yet);
  // `crossed`: it came over a pipeline link.
  bool input_ready(int p, const PipelineTask& task, double& ready, bool& crossed) const {
    const int virtual_stages = P_ * V_;
    const int vstage = task.chunk * P_ + p;
    const std::size_t self = key(task.microbatch, vstage, task.backward);
    ready = 0;
    crossed = false;
    if (!task.backward) {
      if (vstage > 0) {
        if (finish_[key(task.microbatch, vstage - 1, false)] < 0) return false;
        ready = transfer_end_[self];
        crossed = true;
      }
    } else if (vstage == virtual_stages - 1) {
      ready = finish_[key(task.microbatch, vstage, false)];  // the loss: this stage's own forward
    } else {
      if (finish_[key(task.microbatch, vstage + 1, true)] < 0) return false;
      ready = transfer_end_[self];
      crossed = true;
    }
    return true;
  }

  // The compute stream of stage `p` idles until `ready` (if later than it is free): waiting on the
  // transfer while it is in flight (from `transfer_start`; < 0: no transfer), on the neighbour's
  // compute before. Returns when the pass starts.
  double idle_until(int p, double ready, double transfer_start) {
    StageState& st = stages_[std::size_t(p)];
    const double start = std::max(st.compute_free, ready);
    if (start > st.compute_free) {
      double in_flight = 0;
      if (transfer_start >= 0) in_flight = std::max(0.0, start - std::max(st.compute_free, transfer_start));
      const double bubble = start - st.compute_free - in_flight;
      st.exposed[int(Phase::pp_p2p)] += in_flight;
      st.exposed[int(Phase::pp_bubble)] += bubble;
      st.times.p2p_s += in_flight;
      st.times.bubble_s += bubble;
      if (trace_ && bubble > 0)
        trace_->add({"pipeline bubble", "waiting on a neighbour stage", Phase::pp_bubble, Stream::compute, st.compute_free, bubble, p});
      if (trace_ && in_flight > 0)
        trace_->add({"wait for p2p", "activation or gradient in flight", Phase::pp_p2p, Stream::compute, start - in_flight, in_flight, p});
    }
    return start;
  }

  // The arrival waits of a pass's collectives for their groups' last members (arrival_skew.hpp).
  double arrival_waits(StageState& st, const std::vector<const Block*>& blocks) {
    if (!skew_.active()) return 0;
    PhaseTimes waits{};
    double waited = 0;
    for (const Block* b : blocks) waited += skew_.walk(*b, st.clock, waits);
    for (int i = 0; i < kPhaseCount; ++i) {
      st.exposed[i] += waits[i];
      st.busy[i] += waits[i];
    }
    st.times.busy_s += waited;
    return waited;
  }

  // A forward of chunk `f` merged with a backward of chunk `b` on stage `p`: layer pairs as
  // overlapped_pair.hpp runs them, the layers one chunk has more and its embedding, head and MTP
  // modules alone. Memoized per chunk pair.
  const MergedTime& merged_time(int p, int f, int b) {
    const std::size_t i = (std::size_t(p) * V_ + std::size_t(f)) * V_ + std::size_t(b);
    if (merged_known_[i]) return merged_[i];
    const ChunkWork& F = work_[std::size_t(p)].chunks[std::size_t(f)];
    const ChunkWork& B = work_[std::size_t(p)].chunks[std::size_t(b)];
    MergedTime t;
    t.seconds = F.forward_alone_s + B.backward_alone_s;
    const std::size_t pairs = std::min(F.forward_layers.size(), B.backward_layers.size());
    for (std::size_t k = 0; k < pairs; ++k) t.add(merge_layers(F.forward_layers[k], B.backward_layers[k], sm_fraction_));
    for (std::size_t k = pairs; k < F.forward_layers.size(); ++k) t.seconds += F.forward_layers[k].total();
    for (std::size_t k = pairs; k < B.backward_layers.size(); ++k) t.seconds += B.backward_layers[k].total();
    merged_known_[i] = true;
    return merged_[i] = t;
  }

  // Runs forward `fwd` and backward `bwd` as one merged step on stage `p` once both inputs are there.
  bool try_run_merged(int p, const PipelineTask& fwd, const PipelineTask& bwd) {
    double ready_f = 0, ready_b = 0;
    bool crossed_f = false, crossed_b = false;
    if (!input_ready(p, fwd, ready_f, crossed_f) || !input_ready(p, bwd, ready_b, crossed_b)) return false;
    const int vf = fwd.chunk * P_ + p, vb = bwd.chunk * P_ + p;
    const std::size_t kf = key(fwd.microbatch, vf, false), kb = key(bwd.microbatch, vb, true);
    // The later input sets the start; the idle before it is that input's.
    const bool backward_later = ready_b >= ready_f;
    const double transfer_start = backward_later ? (crossed_b ? transfer_start_[kb] : -1.0) : (crossed_f ? transfer_start_[kf] : -1.0);
    const double start = idle_until(p, std::max(ready_f, ready_b), transfer_start);
    StageState& st = stages_[std::size_t(p)];
    const ChunkWork& F = work_[std::size_t(p)].chunks[std::size_t(fwd.chunk)];
    const ChunkWork& B = work_[std::size_t(p)].chunks[std::size_t(bwd.chunk)];
    const double waited = arrival_waits(st, F.forward_blocks) + arrival_waits(st, B.backward_blocks);
    const MergedTime& t = merged_time(p, fwd.chunk, bwd.chunk);
    // finish_step books both passes whole; the merge hid communication and slowed the compute.
    const double hidden_a2a = std::min(t.hidden_a2a, F.forward.phases[int(Phase::ep_alltoall)] + B.backward.phases[int(Phase::ep_alltoall)]);
    st.exposed[int(Phase::ep_alltoall)] -= hidden_a2a;
    st.exposed[int(Phase::compute)] += t.contention - t.hidden_other - (t.hidden_a2a - hidden_a2a);
    st.busy[int(Phase::compute)] += t.contention;
    st.times.busy_s += t.seconds - F.forward.seconds - B.backward.seconds;
    if (trace_)
      trace_->add({"forward + backward (expert all-to-all overlap)",
                   "forward microbatch " + std::to_string(fwd.microbatch) + ", backward microbatch " + std::to_string(bwd.microbatch),
                   Phase::compute, Stream::compute, start, t.seconds + waited, p});
    const double end = start + t.seconds + waited;
    st.compute_free = end;
    finish_[kf] = finish_[kb] = end;
    const double gathers = F.zero3_hidden_fwd + B.zero3_hidden_bwd;
    if (gathers > 0) st.dp_free = std::max(st.dp_free, start) + gathers;
    if (c_.zero >= 2 || bwd.microbatch == mb_count_ - 1) {
      // The backward's gradients, at their share of the merged step.
      const double scale = B.backward.seconds > 0 ? (end - start) / B.backward.seconds : 0.0;
      for (const GradReady& g : B.grads) add_grads(p, g.nonexpert, g.expert, start + std::min(g.offset * scale, end - start), bwd.microbatch);
      flush(p, end, bwd.microbatch);
    }
    send_result(p, fwd, vf, end);
    send_result(p, bwd, vb, end);
    return true;
  }

  // Runs `task` on stage `p` if its input is there; false if it must wait for another stage.
  bool try_run(int p, const PipelineTask& task) {
    const int vstage = task.chunk * P_ + p;
    const std::size_t self = key(task.microbatch, vstage, task.backward);
    double ready = 0;
    bool crossed = false;
    if (!input_ready(p, task, ready, crossed)) return false;
    StageState& st = stages_[std::size_t(p)];
    const double start = idle_until(p, ready, crossed ? transfer_start_[self] : -1.0);
    // Every pass runs once per micro-batch: finish_step adds their phase times in one go.
    const ChunkWork& cw = work_[std::size_t(p)].chunks[std::size_t(task.chunk)];
    const Span& span = task.backward ? cw.backward : cw.forward;
    // The waits at this pass's collectives for their groups' last members (arrival_skew.hpp).
    const double waited = arrival_waits(st, task.backward ? cw.backward_blocks : cw.forward_blocks);
    if (trace_) trace_pass(p, task, cw, start);
    const double end = start + span.seconds + waited;
    st.compute_free = end;
    finish_[self] = end;
    // ZeRO-3's prefetched parameter gathers share the data-parallel stream with gradient sync.
    const double gathers = task.backward ? cw.zero3_hidden_bwd : cw.zero3_hidden_fwd;
    if (gathers > 0) st.dp_free = std::max(st.dp_free, start) + gathers;
    // Gradients: every micro-batch with ZeRO >= 2, else the chunk's last micro-batch only.
    if (task.backward && (c_.zero >= 2 || task.microbatch == mb_count_ - 1)) {
      for (const GradReady& g : cw.grads) add_grads(p, g.nonexpert, g.expert, start + g.offset, task.microbatch);
      flush(p, end, task.microbatch);
    }
    send_result(p, task, vstage, end);
    return true;
  }

  // Puts this pass's output on the link to the stage that needs it.
  void send_result(int p, const PipelineTask& task, int vstage, double end) {
    const int virtual_stages = P_ * V_;
    int to_vstage = -1;
    if (!task.backward && vstage + 1 < virtual_stages) to_vstage = vstage + 1;
    if (task.backward && vstage > 0) to_vstage = vstage - 1;
    if (to_vstage < 0) return;
    StageState& st = stages_[std::size_t(p)];
    double& link = st.link_free[task.backward ? 1 : 0];
    const double start = std::max(end, link);
    const double seconds = w_.p2p_seconds;
    link = start + seconds;
    st.p2p_sends += 1;
    const std::size_t consumer = key(task.microbatch, to_vstage, task.backward);
    transfer_start_[consumer] = start;
    transfer_end_[consumer] = start + seconds;
    if (trace_ && seconds > 0)
      trace_->add({task.backward ? "p2p_send_gradient" : "p2p_send_activation",
                   "microbatch " + std::to_string(task.microbatch) + " to stage " + std::to_string(to_vstage % P_),
                   Phase::pp_p2p, Stream::p2p, start, seconds, p});
  }

  // Queues `count` buckets of `seconds` each on the stage's data-parallel stream at `now`.
  // The iteration's first bucket of a group also waits for the group's last member to arrive.
  void launch_sync(int p, const char* name, GroupKind group, double seconds, double now, int mb, int count = 1) {
    if (seconds <= 0 || count <= 0) return;
    StageState& st = stages_[std::size_t(p)];
    bool& met = group == GroupKind::data ? st.data_met : st.expert_data_met;
    const double wait = met ? 0.0 : skew_.meet(group, st.clock);
    met = true;
    for (int i = 0; i < count; ++i) {
      const double start = std::max(now, st.dp_free);
      const double bucket = seconds + (i == 0 ? wait : 0.0);
      st.dp_free = start + bucket;
      if (trace_) trace_->add({name, "microbatch " + std::to_string(mb), Phase::dp_grad_sync, Stream::data_parallel, start, bucket, p});
    }
    st.busy[int(Phase::dp_grad_sync)] += count * seconds + wait;
    st.grad_buckets += count;
  }

  void add_grads(int p, double nonexpert, double expert, double now, int mb) {
    StageState& st = stages_[std::size_t(p)];
    st.ne_pending += nonexpert;
    st.ex_pending += expert;
    const int ne_full = int(st.ne_pending / kGradBucketElems), ex_full = int(st.ex_pending / kGradBucketElems);
    st.ne_pending -= ne_full * kGradBucketElems;
    st.ex_pending -= ex_full * kGradBucketElems;
    // A full bucket's time is looked up only when one fills: a model smaller than a bucket never
    // asks the profile about a 40M-element collective it does not run.
    if (ne_full > 0 && full_ne_bucket_s_ < 0) full_ne_bucket_s_ = w_.nonexpert_sync_seconds(kGradBucketElems);
    if (ex_full > 0 && full_ex_bucket_s_ < 0) full_ex_bucket_s_ = w_.expert_sync_seconds(kGradBucketElems);
    launch_sync(p, "grad_sync_nonexpert", GroupKind::data, full_ne_bucket_s_, now, mb, ne_full);
    launch_sync(p, "grad_sync_expert", GroupKind::expert_data, full_ex_bucket_s_, now, mb, ex_full);
  }

  void flush(int p, double now, int mb) {
    StageState& st = stages_[std::size_t(p)];
    if (st.ne_pending > 0)
      launch_sync(p, "grad_sync_nonexpert", GroupKind::data, w_.nonexpert_sync_seconds(st.ne_pending), now, mb);
    if (st.ex_pending > 0)
      launch_sync(p, "grad_sync_expert", GroupKind::expert_data, w_.expert_sync_seconds(st.ex_pending), now, mb);
    st.ne_pending = st.ex_pending = 0;
  }

  void blocking(int p, const char* name, Phase phase, double seconds) {
    if (seconds <= 0) return;
    StageState& st = stages_[std::size_t(p)];
    if (trace_) trace_->add({name, "after the last micro-batch", phase, Stream::compute, st.end, seconds, p});
    st.end += seconds;
    st.exposed[int(phase)] += seconds;
    st.busy[int(phase)] += seconds;
  }

  void finish_step() {
    for (int p = 0; p < P_; ++p) {
      StageState& st = stages_[std::size_t(p)];
      for (const ChunkWork& cw : work_[std::size_t(p)].chunks) {
        for (int i = 0; i < kPhaseCount; ++i) {
          const double pass = mb_count_ * (cw.forward.phases[i] + cw.backward.phases[i]);
          st.exposed[i] += pass;
          st.busy[i] += pass;
        }
        st.busy[int(Phase::dp_grad_sync)] += mb_count_ * (cw.zero3_hidden_fwd + cw.zero3_hidden_bwd);
        st.times.busy_s += mb_count_ * (cw.forward.seconds + cw.backward.seconds);
      }
      st.busy[int(Phase::pp_p2p)] += st.p2p_sends * w_.p2p_seconds;
      st.end = st.compute_free;
      // The optimizer needs every gradient: wait for the data-parallel stream.
      if (st.dp_free > st.end) {
        if (trace_) trace_->add({"wait for gradient sync", "before the optimizer", Phase::dp_grad_sync, Stream::compute, st.end, st.dp_free - st.end, p});
        st.exposed[int(Phase::dp_grad_sync)] += st.dp_free - st.end;
        st.end = st.dp_free;
      }
      st.times.compute_end_s = st.end;
    }
    // Tied embeddings: the first and the last stage all-reduce the embedding's gradient.
    if (P_ > 1 && w_.tied_embedding_sync_seconds > 0) {
      StageState& first = stages_.front();
      StageState& last = stages_.back();
      // The stage that ends first waits inside the all-reduce for the other: the all-reduce's
      // time, as the step's timer around it shows.
      const double both = std::max(first.end, last.end);
      for (StageState* st : {&first, &last}) {
        if (trace_ && both > st->end)
          trace_->add({"wait for the other stage", "in the tied-embedding all-reduce", Phase::dp_grad_sync, Stream::compute,
                       st->end, both - st->end, int(st - stages_.data())});
        st->exposed[int(Phase::dp_grad_sync)] += both - st->end;
        st->end = both;
      }
      blocking(0, "tied_embedding_allreduce", Phase::dp_grad_sync, w_.tied_embedding_sync_seconds);
      blocking(P_ - 1, "tied_embedding_allreduce", Phase::dp_grad_sync, w_.tied_embedding_sync_seconds);
    }
    for (int p = 0; p < P_; ++p) {
      const StageWork& sw = work_[std::size_t(p)];
      StageState& st = stages_[std::size_t(p)];
      const double adam = w_.optimizer_seconds(sw.nonexpert_params, sw.expert_params);
      blocking(p, "adam_step", Phase::optimizer, adam);
      // ZeRO's all-gather of the updated parameters waits for its group's last member too.
      const double gather = w_.param_allgather_seconds(sw.nonexpert_params, sw.expert_params);
      if (gather > 0) {
        skew_.advance(st.clock, adam);
        GroupClock expert_clock = st.clock;
        const double wait = std::max(skew_.meet(GroupKind::data, st.clock), skew_.meet(GroupKind::expert_data, expert_clock));
        blocking(p, "zero_param_allgather", Phase::dp_grad_sync, gather + wait);
      }
      stages_[std::size_t(p)].times.end_s = stages_[std::size_t(p)].end;
    }
  }

  SimResult result() const {
    SimResult r;
    int critical = 0;
    for (int p = 1; p < P_; ++p)
      if (stages_[std::size_t(p)].end > stages_[std::size_t(critical)].end) critical = p;
    const StageState& st = stages_[std::size_t(critical)];
    r.iteration_s = st.end;
    r.exposed = st.exposed;
    r.busy = st.busy;
    r.grad_buckets = st.grad_buckets;
    r.critical_stage = critical;
    for (const StageState& s : stages_)
      for (int i = 0; i < kPhaseCount; ++i) r.mean_exposed[i] += s.exposed[i] / P_;
    for (const StageState& s : stages_) r.stages.push_back(s.times);
    return r;
  }

  std::string stage_text(int p) const {
    std::string text;
    for (int v = 0; v < V_; ++v) {
      const ModelChunk& c = map_.chunk(p, v);
      text += (v ? ", " : "") + std::string(c.embedding ? "embedding + " : "") + "layers " + std::to_string(c.first_layer) +
              "-" + std::to_string(c.first_layer + c.layers - 1) + (c.head ? " + head" : "");
    }
    return text;
  }

  bool traced(int mb) const {
    return trace_->every_microbatch() || mb < kTraceExpandedMicrobatches || mb == mb_count_ - 1;
  }

  void trace_block(int p, const Block& block, const std::string& where, double& now) {
    for (int i = 0; i < block.count; ++i) {
      const Op& op = block.ops[i];
      trace_->add({op.name, where, op.phase, Stream::compute, now, op.seconds, p});
      now += op.seconds;
    }
  }

  void trace_pass(int p, const PipelineTask& task, const ChunkWork& cw, double start) {
    const std::string pass = std::string(task.backward ? "backward" : "forward") + " microbatch " +
                             std::to_string(task.microbatch) + (V_ > 1 ? " chunk " + std::to_string(task.chunk) : "");
    if (!traced(task.microbatch)) {
      const Span& span = task.backward ? cw.backward : cw.forward;
      trace_->add({pass, "layers " + std::to_string(cw.chunk.first_layer) + "-" + std::to_string(cw.chunk.first_layer + cw.chunk.layers - 1),
                   Phase::compute, Stream::compute, start, span.seconds, p});
      return;
    }
    double now = start;
    const ModelChunk& c = cw.chunk;
    auto layer_where = [&](const char* what, int layer) { return pass + " " + what + " layer " + std::to_string(layer); };
    if (!task.backward) {
      if (c.embedding) trace_block(p, w_.embedding_forward, pass + " embedding", now);
      for (int layer = c.first_layer; layer < c.first_layer + c.layers; ++layer)
        trace_block(p, w_.layer_blocks(m_, layer).forward, layer_where("forward", layer), now);
      if (c.head) trace_block(p, w_.head_forward, pass + " head", now);
      for (int k = 0; k < c.mtp_layers; ++k) {  // in stage_work's order
        const std::string module = pass + " multi-token prediction " + std::to_string(k);
        trace_block(p, w_.mtp_forward, module, now);
        trace_block(p, w_.layer_blocks(m_, m_.layers - 1).forward, module + " layer", now);
        trace_block(p, w_.head_forward, module + " head", now);
      }
      return;
    }
    for (int k = c.mtp_layers - 1; k >= 0; --k) {
      const std::string module = pass + " multi-token prediction " + std::to_string(k);
      const LayerBlocks& last = w_.layer_blocks(m_, m_.layers - 1);
      trace_block(p, w_.head_backward, module + " head", now);
      trace_block(p, last.recompute, module + " recompute layer", now);
      trace_block(p, last.backward, module + " backward layer", now);
      trace_block(p, w_.mtp_backward, module, now);
    }
    if (c.head) trace_block(p, w_.head_backward, pass + " head", now);
    for (int layer = c.first_layer + c.layers - 1; layer >= c.first_layer; --layer) {
      const LayerBlocks& l = w_.layer_blocks(m_, layer);
      trace_block(p, l.recompute, layer_where("recompute", layer), now);
      trace_block(p, l.backward, layer_where("backward", layer), now);
    }
    if (c.embedding) trace_block(p, w_.embedding_backward, pass + " embedding", now);
  }

  const ModelSpec& m_;
  const ParallelConfig& c_;
  const Workload& w_;
  const StageMap& map_;
  const std::vector<StageWork>& work_;
  const ArrivalSkew& skew_;
  TraceRecorder* trace_;
  GroupClock initial_clock_{};
  int P_, V_;
  int mb_count_ = 0;
  double full_ne_bucket_s_ = -1, full_ex_bucket_s_ = -1;  // a full bucket's sync, once one fills
  double sm_fraction_ = 0;  // of the compute's SMs the all-to-all kernels hold while overlapped
  std::vector<MergedTime> merged_;  // merged steps by (stage, forward chunk, backward chunk)
  std::vector<bool> merged_known_;
  std::vector<double> finish_, transfer_start_, transfer_end_;
  std::vector<StageState> stages_;
  std::vector<StageOrder> orders_;
};

// a + n * (b - a), field by field: the timeline n micro-batch groups past `a`, in steady state.
SimResult extrapolate(const SimResult& a, const SimResult& b, double n) {
  auto lerp = [n](double x, double y) { return x + n * (y - x); };
  SimResult r = b;
  r.iteration_s = lerp(a.iteration_s, b.iteration_s);
  for (int p = 0; p < kPhaseCount; ++p) {
    r.exposed[p] = lerp(a.exposed[p], b.exposed[p]);
    r.mean_exposed[p] = lerp(a.mean_exposed[p], b.mean_exposed[p]);
    r.busy[p] = lerp(a.busy[p], b.busy[p]);
  }
  r.grad_buckets = int(std::lround(lerp(a.grad_buckets, b.grad_buckets)));
  for (std::size_t s = 0; s < r.stages.size(); ++s) {
    r.stages[s].busy_s = lerp(a.stages[s].busy_s, b.stages[s].busy_s);
    r.stages[s].bubble_s = lerp(a.stages[s].bubble_s, b.stages[s].bubble_s);
    r.stages[s].p2p_s = lerp(a.stages[s].p2p_s, b.stages[s].p2p_s);
    r.stages[s].end_s = lerp(a.stages[s].end_s, b.stages[s].end_s);
    r.stages[s].compute_end_s = lerp(a.stages[s].compute_end_s, b.stages[s].compute_end_s);
  }
  return r;
}

// Steady state: two more micro-batch groups add the same time to the iteration, to every phase
// and to every stage.
bool same_increment(const SimResult& a, const SimResult& b, const SimResult& c) {
  const double tolerance = 1e-10 * std::max(1e-12, std::fabs(c.iteration_s));
  const auto linear = [&](double x, double y, double z) { return std::fabs((y - x) - (z - y)) <= tolerance; };
  if (a.critical_stage != b.critical_stage || b.critical_stage != c.critical_stage) return false;
  if (!linear(a.iteration_s, b.iteration_s, c.iteration_s)) return false;
  if (b.grad_buckets - a.grad_buckets != c.grad_buckets - b.grad_buckets) return false;
  for (int p = 0; p < kPhaseCount; ++p)
    if (!linear(a.exposed[p], b.exposed[p], c.exposed[p]) || !linear(a.busy[p], b.busy[p], c.busy[p]) ||
        !linear(a.mean_exposed[p], b.mean_exposed[p], c.mean_exposed[p]))
      return false;
  // The critical stage stays critical only if no stage (nor a stage's end before the tied
  // embedding couples the first and the last) grows faster than it does.
  const double critical_step = c.stages[std::size_t(c.critical_stage)].end_s - b.stages[std::size_t(c.critical_stage)].end_s;
  for (std::size_t s = 0; s < a.stages.size(); ++s) {
    const StageTimes &x = a.stages[s], &y = b.stages[s], &z = c.stages[s];
    if (!linear(x.bubble_s, y.bubble_s, z.bubble_s) || !linear(x.p2p_s, y.p2p_s, z.p2p_s) ||
        !linear(x.end_s, y.end_s, z.end_s) || !linear(x.busy_s, y.busy_s, z.busy_s) ||
        !linear(x.compute_end_s, y.compute_end_s, z.compute_end_s))
      return false;
    if (z.end_s - y.end_s > critical_step + tolerance || z.compute_end_s - y.compute_end_s > critical_step + tolerance)
      return false;
  }
  return true;
}

// Dropless with experts over several ranks: the timeline runs the busiest rank (load_factor times
// the mean expert tokens), which sets everyone's pace. A rank of mean load runs its experts' rows
// in 1/load_factor of that time and waits the rest inside the all-to-all that next exchanges
// them: the mean over ranks (mean_exposed) moves that share from compute to ep_alltoall.
void mean_rank_imbalance(SimResult& r, const Workload& w, const std::vector<StageWork>& work) {
  if (w.shape.e <= 1 || w.shape.load_factor <= 1.0) return;
  double expert_s = 0;
  for (const StageWork& sw : work) expert_s += sw.expert_rows_s;
  const double shift = expert_s / double(work.size()) * w.shape.ga * (1.0 - 1.0 / w.shape.load_factor);
  r.mean_exposed[int(Phase::compute)] -= shift;
  r.mean_exposed[int(Phase::ep_alltoall)] += shift;
}

SimResult simulate(const ModelSpec& m, const ParallelConfig& c, const Workload& w, const StageMap& map,
                   const std::vector<StageWork>& work, TraceRecorder* trace);

}  // namespace

SimResult simulate_iteration(const ModelSpec& m, const ParallelConfig& c, const Workload& w, const StageMap& map,
                             TraceRecorder* trace) {
  const std::vector<StageWork> work = stage_work(m, w, map);
  SimResult r = simulate(m, c, w, map, work, trace);
  mean_rank_imbalance(r, w, work);
  return r;
}

namespace {

SimResult simulate(const ModelSpec& m, const ParallelConfig& c, const Workload& w, const StageMap& map,
                   const std::vector<StageWork>& work, TraceRecorder* trace) {
  const ArrivalSkew skew(c, w);
  PipelineTimeline timeline(m, c, w, map, work, skew, trace);
  const int total = w.shape.ga;
  if (!trace && map.pp == 1 && c.zero < 2 && total > 1 && !c.moe_a2a_overlap) {
    // One stage syncing only after its last micro-batch: the others run back to back before it,
    // with nothing to wait for, so the timeline is one micro-batch's, shifted by theirs.
    const ChunkWork& cw = work[0].chunks[0];
    const int before = total - 1;
    // Their collectives' arrival waits: once a micro-batch leaves the group clocks as the one
    // before it did, every later one waits the same.
    PhaseTimes waits{};
    double waited = 0;
    if (skew.active()) {
      GroupClock clock{}, previous{};
      for (int i = 0; i < before; ++i) {
        PhaseTimes mb{};
        double mb_waited = 0;
        for (const std::vector<const Block*>* pass : {&cw.forward_blocks, &cw.backward_blocks})
          for (const Block* b : *pass) mb_waited += skew.walk(*b, clock, mb);
        const int repeat = i > 0 && clock == previous ? before - i : 1;
        for (int p = 0; p < kPhaseCount; ++p) waits[p] += repeat * mb[p];
        waited += repeat * mb_waited;
        if (repeat > 1) break;
        previous = clock;
      }
      timeline.set_initial_clock(clock);
    }
    SimResult r = timeline.run(1);
    r.iteration_s += before * (cw.forward.seconds + cw.backward.seconds) + waited;
    for (int p = 0; p < kPhaseCount; ++p) {
      r.exposed[p] += before * (cw.forward.phases[p] + cw.backward.phases[p]) + waits[p];
      r.busy[p] += before * (cw.forward.phases[p] + cw.backward.phases[p]) + waits[p];
    }
    r.busy[int(Phase::dp_grad_sync)] += before * (cw.zero3_hidden_fwd + cw.zero3_hidden_bwd);
    r.mean_exposed = r.exposed;
    r.stages[0].busy_s += before * (cw.forward.seconds + cw.backward.seconds) + waited;
    r.stages[0].end_s = r.iteration_s;
    return r;
  }
  // Micro-batches advance in groups of P under the interleaved schedule.
  const int group = map.vpp > 1 ? map.pp : 1;
  // The warm-up fills the pipeline within P micro-batches: start looking there. Where the data-
  // parallel stream sets the pace, the stages' idle times can repeat every other group: then two
  // groups make the period.
  for (int k = std::max(2, map.pp); !trace && k + 2 * group < total; k *= 2) {
    for (const int period : {group, 2 * group}) {
      const int first = k + (total - k) % period;  // the same residue as `total`
      if (first + 2 * period >= total) break;
      const SimResult a = timeline.run(first), b = timeline.run(first + period), c3 = timeline.run(first + 2 * period);
      if (same_increment(a, b, c3)) return extrapolate(a, b, double(total - first) / period);
      // Two groups only help where the iteration already grows evenly.
      const double d1 = b.iteration_s - a.iteration_s, d2 = c3.iteration_s - b.iteration_s;
      if (std::fabs(d1 - d2) > 1e-10 * c3.iteration_s) break;
    }
  }
  return timeline.run(total);
}

}  // namespace

double iteration_lower_bound(const ModelSpec& m, const Workload& w, const StageMap& map, bool a2a_overlap) {
  double busiest = 0;
  for (int p = 0; p < map.pp; ++p) {
    double stage = 0;
    for (int v = 0; v < map.vpp; ++v) {
      const ModelChunk& c = map.chunk(p, v);
      if (c.embedding) stage += w.embedding_forward.seconds + w.embedding_backward.seconds;
      if (c.head) stage += w.head_forward.seconds + w.head_backward.seconds;
      for (int layer = c.first_layer; layer < c.first_layer + c.layers; ++layer) {
        const LayerBlocks& l = w.layer_blocks(m, layer);
        stage += l.forward.seconds + l.recompute.seconds + l.backward.seconds;
        if (a2a_overlap)
          stage -= l.forward.phase_seconds[int(Phase::ep_alltoall)] + l.backward.phase_seconds[int(Phase::ep_alltoall)];
      }
    }
    busiest = std::max(busiest, stage);
  }
  return busiest * w.shape.ga;
}

SimResult simulate_iteration(const ModelSpec& m, const ParallelConfig& c, const Workload& w, TraceRecorder* trace) {
  return simulate_iteration(m, c, w, build_stage_map(m.layers, c.pp, c.vpp, c.pipeline_layout, m.mtp_layers), trace);
}

}  // namespace tedsim
