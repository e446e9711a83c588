#include "tedsim/report/prediction_json.hpp"

#include <iostream>

#include "tedsim/core/atomic_file.hpp"
#include "tedsim/model/workload.hpp"

namespace tedsim {

nlohmann::json config_json(const ParallelConfig& c, const ModelSpec& m) {
  return {{"gpus", c.gpus},
          {"pp", c.pp},
          {"vpp", c.vpp},
          {"pipeline_layout", c.pipeline_layout},
          {"tp", c.tp},
          {"cp", c.cp},
          {"ep", c.ep},
          {"dp", c.dp()},
          {"dp_expert", c.dp_expert()},
          {"micro_batch", c.micro_batch},
          {"global_batch", c.global_batch},
          {"grad_accum", c.grad_accum()},
          {"seq_len", c.seq_len > 0 ? c.seq_len : m.seq_len},
          {"dtd", c.dtd},
          {"cac", c.cac},
          {"checkpoint", c.full_recompute()},
          {"recompute", to_string(c.recompute)},
          {"recompute_modules", c.recompute == Recompute::selective ? recompute_modules_text(c.recompute_modules) : ""},
          {"sequence_parallel", c.sequence_parallel},
          {"attention_kernel", to_string(m.core_attention)},
          {"zero", c.zero},
          {"expert_tp", c.expert_tp},
          {"tiled_optimizer", c.tiled_optimizer},
          {"moe_dispatcher", to_string(c.moe_dispatcher)},
          {"adam_moments", to_string(c.adam_moments)},
          {"cuda_graph_scope", cuda_graph_scopes_text(c.cuda_graph_scopes)},
          {"fused_grouped_mlp", c.fused_grouped_mlp},
          {"fp8_attention", c.fp8_attention},
          {"moe_a2a_overlap", c.moe_a2a_overlap},
          {"moe_a2a_overlap_sms", c.moe_a2a_overlap ? nlohmann::json(c.moe_a2a_overlap_sms) : nlohmann::json(nullptr)},
          {"layout", to_string(c.layout)}};
}

nlohmann::json phase_times_json(const PhaseTimes& t) {
  nlohmann::json j = nlohmann::json::object();
  for (int p = 0; p < kPhaseCount; ++p) j[to_string(Phase(p))] = t[p];
  return j;
}

nlohmann::json memory_json(const MemoryBreakdown& mem) {
  return {{"peak_gib", mem.peak / kGiB},
          {"capacity_gib", mem.capacity / kGiB},
          {"weights_gib", mem.weights / kGiB},
          {"grads_gib", mem.grads / kGiB},
          {"optimizer_gib", mem.optimizer / kGiB},
          {"activations_gib", mem.activations / kGiB},
          {"moe_buffers_gib", mem.moe_buffers / kGiB},
          {"cac_stash_gib", mem.cac_stash / kGiB},
          {"pipeline_buffers_gib", mem.pipeline_buffers / kGiB},
          {"optimizer_spike_gib", mem.optimizer_spike / kGiB}};
}

nlohmann::json stages_json(const Prediction& p) {
  nlohmann::json stages = nlohmann::json::array();
  for (int s = 0; s < p.stage_map.pp; ++s) {
    nlohmann::json chunks = nlohmann::json::array();
    for (int v = 0; v < p.stage_map.vpp; ++v) {
      const ModelChunk& c = p.stage_map.chunk(s, v);
      chunks.push_back({{"first_layer", c.first_layer}, {"layers", c.layers}, {"embedding", c.embedding}, {"head", c.head}});
    }
    nlohmann::json stage = {{"stage", s}, {"layers", p.stage_map.stage_layers(s)}, {"chunks", chunks}};
    if (std::size_t(s) < p.stage_memory.size()) stage["memory"] = memory_json(p.stage_memory[std::size_t(s)]);
    if (std::size_t(s) < p.sim.stages.size()) {
      const StageTimes& t = p.sim.stages[std::size_t(s)];
      stage["busy_s"] = t.busy_s;
      stage["bubble_s"] = t.bubble_s;
      stage["p2p_wait_s"] = t.p2p_s;
      stage["end_s"] = t.end_s;
    }
    stages.push_back(stage);
  }
  return stages;
}

// Dropless routing: the load the prediction assumed, and where it came from (the model file or
// --imbalance, a measured profile's routing of the step's tokens, or tedsim's default).
nlohmann::json routing_json(const Prediction& p, const ModelSpec& m) {
  const MoeSpec& e = m.moe;
  const char* from = !e.measured_shares.empty() ? "calibration" : e.imbalance_given ? "stated" : "default";
  return {{"imbalance", e.imbalance}, {"busiest_rank_load", resolve_shape(m, p.config).load_factor}, {"from", from}};
}

nlohmann::json prediction_json(const Prediction& p, const ModelSpec& m) {
  const MemoryBreakdown& mem = p.memory;
  nlohmann::json doc = {{"iteration_time_s", p.sim.iteration_s},
          {"tokens_per_s", p.tokens_per_s},
          {"samples_per_s", p.samples_per_s},
          {"tflops_per_gpu", p.tflops_per_gpu},
          {"mfu", p.mfu},
          {"fits", p.fits()},
          {"flops_per_iteration", p.flops_per_iteration},
          {"model_flops_per_iteration", p.model_flops_per_iteration},
          {"grad_buckets", p.sim.grad_buckets},
          {"memory", memory_json(mem)},
          {"critical_stage", p.sim.critical_stage},
          {"stages", stages_json(p)},
          {"breakdown_s", phase_times_json(p.sim.exposed)},
          {"busy_s", phase_times_json(p.sim.busy)},
          {"config", config_json(p.config, m)}};
  if (m.is_moe() && m.moe.dropless()) doc["routing"] = routing_json(p, m);
  return doc;
}

nlohmann::json search_json(const SearchResult& r, const ModelSpec& m) {
  nlohmann::json results = nlohmann::json::array();
  std::size_t shown = 0;  // the last plan a folded ranking shows as a row
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    results.push_back(prediction_json(r.top[i], m));
    if (i > 0 && predicts_the_same(r.top[shown], r.top[i]))
      results.back()["folded_into_rank"] = shown + 1;
    else
      shown = i;
  }
  nlohmann::json doc = {{"kind", "search"}, {"evaluated", r.evaluated}, {"feasible", r.feasible}, {"seconds", r.seconds},
                        {"results", results}};
  if (!r.points.empty()) {
    nlohmann::json points = nlohmann::json::array();
    for (const PlanPoint& p : r.points) {
      const ParallelConfig& c = p.config;
      points.push_back({{"plan", c.describe()}, {"tokens_per_s", p.tokens_per_s}, {"iteration_time_s", p.iteration_s},
                        {"peak_gib", p.peak_bytes / kGiB}, {"pp", c.pp}, {"vpp", c.vpp}, {"tp", c.tp}, {"cp", c.cp}, {"ep", c.ep},
                        {"micro_batch", c.micro_batch}, {"zero", c.zero}, {"recompute", to_string(c.recompute)},
                        {"dtd", c.dtd}, {"cac", c.cac}, {"sequence_parallel", c.sequence_parallel},
                        {"expert_tp", c.expert_tp}, {"layout", to_string(c.layout)}});
    }
    doc["points"] = points;
  }
  return doc;
}

nlohmann::json timeline_json(const TraceRecorder& trace) {
  static const char* const streams[] = {"compute", "data-parallel", "p2p"};
  nlohmann::json events = nlohmann::json::array();
  for (const TraceEvent& e : trace.events())
    events.push_back({{"lane", "stage " + std::to_string(e.stage) + " " + streams[int(e.stream)]},
                      {"name", e.name},
                      {"phase", to_string(e.phase)},
                      {"start_s", e.start_s},
                      {"duration_s", e.duration_s},
                      {"where", e.context}});
  return events;
}

void write_json(const std::string& path, const nlohmann::json& doc) {
  if (path == "-") {
    std::cout << doc.dump(2) << std::endl;
    return;
  }
  write_file_atomically(path, doc.dump(2) + "\n");
}

}  // namespace tedsim
