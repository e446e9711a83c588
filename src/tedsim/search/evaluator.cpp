#include "tedsim/search/evaluator.hpp"

namespace tedsim {

Evaluator::Evaluator(const ModelSpec& model, const TopologySpec& topology, const Profile& profile)
    : model_(model), topology_(topology), profile_(profile),
      peak_flops_(topology.device.peak_tflops_of(model.dtype) * kTera) {}

const GroupSpans& Evaluator::spans_for(const ParallelConfig& c) const {
  const auto key = std::make_tuple(c.gpus, c.tp, c.ep, int(c.layout), c.expert_tp, c.pp, c.cp);
  auto it = spans_.find(key);
  if (it == spans_.end()) {
    const TedLayout layout(c.gpus, c.tp, c.ep, c.layout, c.expert_tp, c.pp, c.cp);
    it = spans_.emplace(key, compute_group_spans(layout, topology_)).first;
  }
  return it->second;
}

Workload Evaluator::workload_for(const ParallelConfig& c) const { return build_workload(model_, c, profile_, spans_for(c)); }

void Evaluator::build_workload_for(const ParallelConfig& c, Workload& w) const {
  build_workload_into(w, model_, c, profile_, spans_for(c));
}

Prediction Evaluator::evaluate(const ParallelConfig& c, TraceRecorder* trace) const {
  return evaluate(c, workload_for(c), trace, false, 0.0);
}

Prediction Evaluator::evaluate_if_fits(const ParallelConfig& c) const { return evaluate(c, workload_for(c), nullptr, true, 0.0); }

Prediction Evaluator::evaluate_bounded(const ParallelConfig& c, const Workload& w, double tokens_per_s_to_beat) const {
  return evaluate(c, w, nullptr, true, tokens_per_s_to_beat);
}

Prediction Evaluator::evaluate(const ParallelConfig& c, const Workload& w, TraceRecorder* trace, bool skip_unfit,
                               double tokens_per_s_to_beat) const {
  Prediction p;
  p.config = c;
  p.stage_map = build_stage_map(model_.layers, c.pp, c.vpp, c.pipeline_layout, model_.mtp_layers);
  p.memory = estimate_memory(model_, c, w, topology_, p.stage_map, skip_unfit ? nullptr : &p.stage_memory);
  if (skip_unfit && !p.memory.fits()) return p;
  if (tokens_per_s_to_beat > 0) {
    const double fastest = iteration_lower_bound(model_, w, p.stage_map, p.config.moe_a2a_overlap);
    if (fastest > 0 && double(c.global_batch) * w.shape.s / fastest < tokens_per_s_to_beat) return p;
  }
  p.sim = simulate_iteration(model_, c, w, p.stage_map, trace);
  const double t = p.sim.iteration_s;
  // The workload's FLOPs are a tensor rank's over all layers; P stages share them.
  const double microbatches_all_ranks = double(w.shape.ga) * c.gpus / c.pp;
  p.flops_per_iteration = w.flops_per_microbatch * microbatches_all_ranks;
  p.model_flops_per_iteration = w.model_flops_per_microbatch * microbatches_all_ranks;
  p.samples_per_s = c.global_batch / t;
  p.tokens_per_s = p.samples_per_s * w.shape.s;
  p.tflops_per_gpu = p.flops_per_iteration / t / c.gpus / kTera;
  p.mfu = peak_flops_ > 0 ? p.model_flops_per_iteration / (t * c.gpus * peak_flops_) : 0.0;
  return p;
}

}  // namespace tedsim
