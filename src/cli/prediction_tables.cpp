#include "prediction_tables.hpp"

#include "tedsim/report/text_table.hpp"

namespace tedsim::cli {

void print_prediction(std::ostream& out, const Prediction& p) {
  out << "configuration: " << p.config.describe() << "\n";
  out << "iteration " << human_seconds(p.sim.iteration_s) << ", " << fixed(p.tokens_per_s, 0) << " tokens/s, "
      << fixed(p.samples_per_s, 2) << " samples/s, " << fixed(p.tflops_per_gpu, 1) << " TFLOP/s per device, MFU "
      << fixed(100 * p.mfu, 1) << "%\n\n";
  TextTable phases({"phase", "exposed", "share", "busy"});
  for (int i = 0; i < kPhaseCount; ++i) {
    const double exposed = p.sim.exposed[i];
    phases.add_row({to_string(Phase(i)), human_seconds(exposed), fixed(100 * exposed / p.sim.iteration_s, 1) + "%",
                    human_seconds(p.sim.busy[i])});
  }
  phases.add_row({"iteration", human_seconds(p.sim.iteration_s), "100.0%", ""});
  phases.print(out);
  out << '\n';
  if (p.config.pp > 1) {
    out << "pipeline: " << p.stage_map.describe() << (p.stage_map.uneven ? " (layers do not divide pp x vpp: the middle stages take one more)" : "")
        << "\n";
    TextTable stages({"stage", "layers", "busy", "bubble", "p2p wait", "ends", "peak GiB"});
    for (int s = 0; s < p.config.pp; ++s) {
      const StageTimes& t = p.sim.stages[std::size_t(s)];
      const double peak = std::size_t(s) < p.stage_memory.size() ? p.stage_memory[std::size_t(s)].peak : 0.0;
      stages.add_row({std::to_string(s) + (s == p.sim.critical_stage ? " (last to end)" : ""),
                      std::to_string(p.stage_map.stage_layers(s)), human_seconds(t.busy_s), human_seconds(t.bubble_s),
                      human_seconds(t.p2p_s), human_seconds(t.end_s), fixed(peak / kGiB, 2)});
    }
    stages.print(out);
    out << '\n';
  }
  const MemoryBreakdown& m = p.memory;
  TextTable memory({p.config.pp > 1 ? "memory per device (largest stage)" : "memory per device", "GiB"});
  memory.add_row({"weights", fixed(m.weights / kGiB, 2)});
  memory.add_row({"gradients", fixed(m.grads / kGiB, 2)});
  memory.add_row({"optimizer state", fixed(m.optimizer / kGiB, 2)});
  memory.add_row({"activations", fixed(m.activations / kGiB, 2)});
  memory.add_row({"MoE buffers", fixed(m.moe_buffers / kGiB, 2)});
  memory.add_row({"CAC stash", fixed(m.cac_stash / kGiB, 2)});
  if (p.config.pp > 1) memory.add_row({"pipeline p2p buffers", fixed(m.pipeline_buffers / kGiB, 2)});
  memory.add_row({"optimizer upcast spike", fixed(m.optimizer_spike / kGiB, 2)});
  memory.add_row({"peak", fixed(m.peak / kGiB, 2)});
  memory.add_row({"available", fixed(m.capacity / kGiB, 2)});
  memory.print(out);
  out << (p.fits() ? "fits in device memory\n" : "DOES NOT FIT in device memory\n");
}

}  // namespace tedsim::cli
