// tedsim simulate: predict one configuration.
#include <memory>

#include "commands.hpp"
#include "inputs.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "prediction_tables.hpp"
#include "tedsim/report/prediction_json.hpp"
#include "tedsim/sim/trace.hpp"

namespace tedsim::cli {
namespace {

struct SimulateOptions {
  InputOptions in;
  int tp = 2, ep = 16, micro_batch = 1, zero = 2;
  bool dtd = true, cac = true, checkpoint = true, expert_tp = true, tiled = true;
  std::string layout = "ted";
  std::string trace;
};

int run_simulate(const SimulateOptions& o) {
  Inputs in = load_inputs(o.in);
  std::ostream& out = human_stream(o.in);
  print_startup_table(out, in, o.in);
  ParallelConfig c;
  c.gpus = o.in.gpus;
  c.global_batch = o.in.global_batch;
  c.seq_len = o.in.seq_len;
  c.tp = o.tp;
  c.ep = in.model.is_moe() ? o.ep : 1;
  c.micro_batch = o.micro_batch;
  c.zero = o.zero;
  c.dtd = o.dtd;
  c.cac = o.cac;
  c.checkpoint = o.checkpoint;
  c.expert_tp = o.expert_tp;
  c.tiled_optimizer = o.tiled;
  c.layout = parse_layout(o.layout);
  validate_config(c, in.model);
  const Evaluator evaluator(in.model, in.topology, *in.profile);
  TraceRecorder trace;
  const Prediction p = evaluator.evaluate(c, o.trace.empty() ? nullptr : &trace);
  print_prediction(out, p);
  print_profile_warnings(out, *in.profile);
  if (!o.trace.empty()) {
    trace.write_chrome_trace(o.trace, in.model.name + " " + c.describe());
    out << "trace: " << o.trace << " (" << trace.events().size() << " events; open in ui.perfetto.dev or chrome://tracing)\n";
  }
  if (!o.in.json.empty()) {
    nlohmann::json doc = prediction_json(p, in.model);
    doc["model"] = in.model.name;
    doc["topology"] = in.topology.name;
    doc["profile"] = in.profile->describe();
    write_json(o.in.json, doc);
  }
  return 0;
}

}  // namespace

void register_simulate(CLI::App& app, Action& action) {
  auto o = std::make_shared<SimulateOptions>();
  CLI::App* cmd = app.add_subcommand("simulate", "predict one configuration: iteration time, phase breakdown, memory");
  add_input_options(*cmd, o->in);
  cmd->add_option("--tp", o->tp, "tensor degree t")->capture_default_str();
  cmd->add_option("--ep", o->ep, "expert degree e (ignored for dense models)")->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "sequences per data-parallel replica per micro-batch")->capture_default_str();
  cmd->add_option("--zero", o->zero, "ZeRO stage 0, 1 or 2")->capture_default_str();
  cmd->add_flag("--dtd,!--no-dtd", o->dtd, "duplicate token dropping around the expert all-to-alls (default on)");
  cmd->add_flag("--cac,!--no-cac", o->cac, "communication-aware checkpointing (default on)");
  cmd->add_flag("--checkpoint,!--no-checkpoint", o->checkpoint, "activation checkpointing (default on)");
  cmd->add_flag("--expert-tp,!--no-expert-tp", o->expert_tp, "split experts over the tensor group (default on)");
  cmd->add_flag("--tiled-optimizer,!--no-tiled-optimizer", o->tiled, "tile the expert optimizer step (default on)");
  cmd->add_option("--layout", o->layout, "rank layout: ted (tensor, expert, data) or data_before_expert")->capture_default_str();
  cmd->add_option("--trace", o->trace, "write the simulated timeline as a Chrome/Perfetto trace");
  cmd->callback([o, &action] { action = [o] { return run_simulate(*o); }; });
}

}  // namespace tedsim::cli
