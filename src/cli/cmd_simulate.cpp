// tedsim simulate: predict one configuration.
#include <memory>

#include "commands.hpp"
#include "tedsim/core/error.hpp"
#include "inputs.hpp"
#include "op_breakdown.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "prediction_tables.hpp"
#include "tedsim/report/prediction_json.hpp"
#include "tedsim/sim/trace.hpp"

namespace tedsim::cli {
namespace {

// t=2, e=16, b=1, ZeRO-2: a configuration of the default problem that fits.
ConfigOptions default_knobs() {
  ConfigOptions k;
  k.tp = 2;
  k.ep = 16;
  k.micro_batch = 1;
  k.zero = 2;
  return k;
}

struct SimulateOptions {
  InputOptions in;
  ConfigOptions knobs = default_knobs();
  std::string trace;
  bool ops = false;
  std::vector<std::string> emit;
};

void check_emit_kind(const std::vector<std::string>& emit) {
  if (!emit.empty() && emit[0] != "megatron" && emit[0] != "deepspeed")
    throw InputError("--emit: expected megatron or deepspeed, got '" + emit[0] + "'");
}

int run_simulate(const SimulateOptions& o) {
  check_emit_kind(o.emit);
  Inputs in = load_inputs(o.in);
  std::ostream& out = human_stream(o.in);
  print_startup_table(out, in, o.in);
  const ParallelConfig c = resolve_config(o.knobs, o.in, in.model);
  check_fused_grouped_mlp(c.fused_grouped_mlp, in.topology);
  check_fp8_attention(c.fp8_attention, in.topology);
  const Evaluator evaluator(in.model, in.topology, *in.profile);
  TraceRecorder trace;
  const bool record = !o.trace.empty() || !o.in.html.empty();
  const Prediction p = evaluator.evaluate(c, record ? &trace : nullptr);
  print_prediction(out, p);
  if (o.ops) print_op_breakdown(out, evaluator.workload_for(c), in.model);
  print_profile_warnings(out, *in.profile);
  const double far_share = print_far_lookup_share(out, in, c, p.sim.iteration_s);
  const auto spread = print_prediction_range(out, in, c, p.sim.iteration_s);
  print_profile_mismatches(out, in, o.in, JobIdentity{});
  if (!o.trace.empty()) {
    trace.write_chrome_trace(o.trace, in.model.name + " " + c.describe());
    out << "trace: " << o.trace << " (" << trace.events().size() << " events; open in ui.perfetto.dev or chrome://tracing)\n";
  }
  write_launch_files(o.emit, in, p, out);
  if (!o.in.json.empty() || !o.in.html.empty()) {
    nlohmann::json doc = prediction_json(p, in.model);
    doc["kind"] = "simulate";
    if (far_share >= 0) doc["profile_far_share"] = far_share;  // of the iteration, on far extrapolations
    if (spread) doc["iteration_time_s_range"] = {spread->first, spread->second};
    if (o.ops || !o.in.html.empty()) doc["ops"] = op_breakdown_json(evaluator.workload_for(c), in.model);
    // The timeline is for the HTML page (thousands of events); --trace FILE writes it for tools.
    if (!o.in.html.empty()) doc["timeline"] = timeline_json(trace);
    write_results(o.in, doc, in, out);
  }
  return 0;
}

}  // namespace

void register_simulate(CLI::App& app, Action& action) {
  auto o = std::make_shared<SimulateOptions>();
  CLI::App* cmd = app.add_subcommand("simulate", "predict one configuration: iteration time, phase breakdown, memory");
  add_input_options(*cmd, o->in);
  add_config_options(*cmd, o->knobs);
  cmd->add_option("--trace", o->trace, "write the simulated timeline as a Chrome/Perfetto trace");
  cmd->add_flag("--ops", o->ops,
                "list every op of each layer kind (forward, recompute, backward) with its time, FLOPs or bytes and "
                "the rate that implies (JSON: ops; --html draws them too)");
  add_emit_option(*cmd, o->emit);
  cmd->callback([o, cmd, &action] {
    note_defaulted_degrees(*cmd, o->knobs);
    action = [o] { return run_simulate(*o); };
  });
}

}  // namespace tedsim::cli
