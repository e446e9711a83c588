#include "validation_config.hpp"

#include <climits>

#include "tedsim/core/error.hpp"

namespace tedsim::cli {

namespace {
bool given(const CLI::App* cmd, const char* option) { return cmd->count(option) > 0; }
}  // namespace

void apply_validation_config(const YamlMap& y, InputOptions& in, ConfigOptions& knobs, const CLI::App& app) {
  const CLI::App* cmd = &app;
  auto need = [&](const char* key) {
    if (!y.has(key)) throw InputError(y.file() + ": missing key '" + key + "'");
  };
  for (const char* key : {"model", "topology", "gpus", "tp", "ep", "micro_batch", "global_batch", "dtd", "cac",
                          "checkpoint", "zero", "expert_tp", "layout"})
    need(key);
  auto text = [&](const char* key, const char* opt, std::string& dst) {
    const std::string v = y.text(key);
    if (!given(cmd, opt)) dst = v;
  };
  auto integer = [&](const char* key, const char* opt, int& dst) {
    const std::int64_t v = y.integer(key);
    // A value past int would wrap silently into another configuration.
    if (v < INT_MIN || v > INT_MAX)
      throw InputError(y.file() + ": key '" + key + "': " + std::to_string(v) + " is out of range (at most " +
                       std::to_string(INT_MAX) + ")");
    if (!given(cmd, opt)) dst = static_cast<int>(v);
  };
  auto flag = [&](const char* key, const char* on, const char* off, bool& dst) {
    const bool v = y.boolean(key, dst);
    if (!given(cmd, on) && !given(cmd, off)) dst = v;
  };
  text("model", "--model", in.model);
  text("topology", "--topology", in.topology);
  integer("gpus", "--gpus", in.gpus);
  integer("tp", "--tp", knobs.tp);
  integer("ep", "--ep", knobs.ep);
  integer("micro_batch", "--micro-batch", knobs.micro_batch);
  integer("global_batch", "--global-batch", in.global_batch);
  flag("dtd", "--dtd", "--no-dtd", knobs.dtd);
  flag("cac", "--cac", "--no-cac", knobs.cac);
  flag("checkpoint", "--checkpoint", "--no-checkpoint", knobs.checkpoint);
  integer("zero", "--zero", knobs.zero);
  flag("expert_tp", "--expert-tp", "--no-expert-tp", knobs.expert_tp);
  text("layout", "--layout", knobs.layout);
  if (y.has("seq")) integer("seq", "--seq", in.seq_len);
  if (y.has("tiled_optimizer")) flag("tiled_optimizer", "--tiled-optimizer", "--no-tiled-optimizer", knobs.tiled);
  // The pipeline, recompute and sequence-parallel keys are optional: absent, they are off.
  if (y.has("pp")) integer("pp", "--pp", knobs.pp);
  if (y.has("vpp")) integer("vpp", "--vpp", knobs.vpp);
  if (y.has("pipeline_layout")) text("pipeline_layout", "--pipeline-layout", knobs.pipeline_layout);
  if (y.has("recompute")) text("recompute", "--recompute", knobs.recompute);
  if (y.has("recompute_modules")) text("recompute_modules", "--recompute-modules", knobs.recompute_modules);
  if (y.has("sequence_parallel"))
    flag("sequence_parallel", "--sequence-parallel", "--no-sequence-parallel", knobs.sequence_parallel);
  // Routing overrides of the model, as --capacity-factor and --imbalance.
  if (y.has("capacity_factor") && !given(cmd, "--capacity-factor")) in.capacity_factor = y.nonnegative_number("capacity_factor", 0.0);
  if (y.has("imbalance") && !given(cmd, "--imbalance")) in.imbalance = y.positive_number("imbalance");
  knobs.cac_given = true;  // a config file states cac, dtd and checkpoint
  knobs.dtd_given = true;
  knobs.checkpoint_given = switch_given(*cmd, "checkpoint");
  y.reject_unknown_keys();
}

}  // namespace tedsim::cli
