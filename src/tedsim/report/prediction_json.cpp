#include "tedsim/report/prediction_json.hpp"

#include <iostream>

#include "tedsim/core/atomic_file.hpp"

namespace tedsim {

nlohmann::json config_json(const ParallelConfig& c, const ModelSpec& m) {
  return {{"gpus", c.gpus},
          {"tp", c.tp},
          {"ep", c.ep},
          {"dp", c.dp()},
          {"dp_expert", c.dp_expert()},
          {"micro_batch", c.micro_batch},
          {"global_batch", c.global_batch},
          {"grad_accum", c.grad_accum()},
          {"seq_len", c.seq_len > 0 ? c.seq_len : m.seq_len},
          {"dtd", c.dtd},
          {"cac", c.cac},
          {"checkpoint", c.checkpoint},
          {"zero", c.zero},
          {"expert_tp", c.expert_tp},
          {"tiled_optimizer", c.tiled_optimizer},
          {"layout", to_string(c.layout)}};
}

nlohmann::json phase_times_json(const PhaseTimes& t) {
  nlohmann::json j = nlohmann::json::object();
  for (int p = 0; p < kPhaseCount; ++p) j[to_string(Phase(p))] = t[p];
  return j;
}

nlohmann::json prediction_json(const Prediction& p, const ModelSpec& m) {
  const MemoryBreakdown& mem = p.memory;
  return {{"iteration_time_s", p.sim.iteration_s},
          {"tokens_per_s", p.tokens_per_s},
          {"samples_per_s", p.samples_per_s},
          {"tflops_per_gpu", p.tflops_per_gpu},
          {"mfu", p.mfu},
          {"fits", p.fits()},
          {"flops_per_iteration", p.flops_per_iteration},
          {"model_flops_per_iteration", p.model_flops_per_iteration},
          {"grad_buckets", p.sim.grad_buckets},
          {"memory",
           {{"peak_gib", mem.peak / kGiB},
            {"capacity_gib", mem.capacity / kGiB},
            {"weights_gib", mem.weights / kGiB},
            {"grads_gib", mem.grads / kGiB},
            {"optimizer_gib", mem.optimizer / kGiB},
            {"activations_gib", mem.activations / kGiB},
            {"moe_buffers_gib", mem.moe_buffers / kGiB},
            {"cac_stash_gib", mem.cac_stash / kGiB},
            {"optimizer_spike_gib", mem.optimizer_spike / kGiB}}},
          {"breakdown_s", phase_times_json(p.sim.exposed)},
          {"busy_s", phase_times_json(p.sim.busy)},
          {"config", config_json(p.config, m)}};
}

nlohmann::json search_json(const SearchResult& r, const ModelSpec& m) {
  nlohmann::json results = nlohmann::json::array();
  for (const Prediction& p : r.top) results.push_back(prediction_json(p, m));
  return {{"evaluated", r.evaluated}, {"feasible", r.feasible}, {"seconds", r.seconds}, {"results", results}};
}

void write_json(const std::string& path, const nlohmann::json& doc) {
  if (path == "-") {
    std::cout << doc.dump(2) << std::endl;
    return;
  }
  write_file_atomically(path, doc.dump(2) + "\n");
}

}  // namespace tedsim
