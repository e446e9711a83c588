#pragma once
// Options every planning command shares (model, topology, cluster size, profile) and the startup
// table that prints what they resolved to.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "tedsim/profile/profile.hpp"
#include "tedsim/search/evaluator.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/parallel_config.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace tedsim::cli {

struct InputOptions {
  std::string model = "ted-6.7b";
  std::string topology = "summit";
  std::optional<int> experts;  // unset: the model's
  std::optional<double> capacity_factor;  // unset: the model's (0: dropless)
  std::optional<int> mtp_layers;          // unset: the model's
  std::optional<double> imbalance;        // unset: the model's
  std::string dtype;       // empty: the model's
  std::string attention_kernel = "auto";  // unfused, flash, or auto: flash where the profile has its rates
  int gpus = 128;
  int gpus_per_node = 0;   // 0: the topology's devices_per_node
  int global_batch = 1024;
  int seq_len = 0;         // 0: the model's
  std::string profile;     // empty: analytic profile from the topology
  std::string json;        // --json FILE or "-"
  std::string html;        // --html FILE: the result as a self-contained HTML report
};

struct Inputs {
  ModelSpec model;
  TopologySpec topology;
  std::unique_ptr<Profile> profile;
  std::string model_file, topology_file;
};

// The knobs of one configuration, shared by simulate and validate (each sets its own defaults).
struct ConfigOptions {
  int pp = 1, vpp = 1, tp = 1, cp = 1, ep = 1, micro_batch = 1, zero = 1;
  bool dtd = true, cac = true, checkpoint = true, expert_tp = true, tiled = true, sequence_parallel = false;
  bool shared_expert_overlap = false;
  bool moe_a2a_overlap = false;
  int moe_a2a_overlap_sms = 20;
  std::string moe_dispatcher = "alltoall";
  std::string adam_moments = "fp32";
  std::string cuda_graph_scope = "none";
  bool fused_grouped_mlp = false;
  bool fp8_attention = false;
  std::string recompute;  // none|selective|full; empty: --checkpoint/--no-checkpoint decide (full/none)
  std::string recompute_modules = "core_attn";
  std::string pipeline_layout;
  std::string layout = "ted";
  // Degrees the user did not give (e.g. "--ep 16"), named when the configuration is invalid.
  std::vector<std::string> defaulted;
  // Defaults that follow other choices unless given: CAC is off without full recompute, DTD off
  // with sequence parallelism (which already splits the tokens before the router).
  bool cac_given = false, dtd_given = false, checkpoint_given = false;
};

void add_input_options(CLI::App& app, InputOptions& options);
// --NAME and --no-NAME setting `value`; the help names the default `value` holds now (+ `note`).
void add_switch(CLI::App& app, const std::string& name, bool& value, const std::string& what,
                const std::string& note = "");
bool switch_given(const CLI::App& app, const std::string& name);  // --NAME or --no-NAME
void add_config_options(CLI::App& app, ConfigOptions& options);
// After parsing: records which of --tp, --ep, --micro-batch, --zero kept their defaults, and which
// of the flags whose defaults follow other choices were given.
void note_defaulted_degrees(const CLI::App& app, ConfigOptions& options);
// The configuration these options describe for `model`; throws InputError naming the broken rule,
// the degrees that were defaults, and the --tp/--ep pairs that are valid for this model, cluster
// and batch.
ParallelConfig resolve_config(const ConfigOptions& knobs, const InputOptions& inputs, const ModelSpec& model);
// Transformer Engine fuses the grouped MLP for the MXFP8 recipe only (Blackwell): InputError on a
// topology whose FP8 recipe is another.
void check_fused_grouped_mlp(bool fused, const TopologySpec& topology);
// InputError on a topology without measured FP8 attention tables.
void check_fp8_attention(bool fp8, const TopologySpec& topology);
Inputs load_inputs(const InputOptions& options);
// --capacity-factor and --imbalance onto the model, checked.
void apply_routing_overrides(const InputOptions& options, ModelSpec& model);
// Dropless routing that neither the model nor --imbalance states: the measured profile's count of
// the step's own router, where calibration counted this model's (load_inputs calls it; again after
// a profile is reloaded).
void adopt_measured_routing(Inputs& inputs);

// What a measured profile was calibrated for, against this job: another model (its shapes and sizes
// differ), and, where given (validate), another rank count, backend or host. One line each, empty
// when the profile is analytic or matches; printed as "profile mismatch: ..." after the prediction.
struct JobIdentity {
  int ranks = 0;        // 0: not compared (simulate and search plan clusters a profile never saw)
  std::string backend;  // "": not compared
  std::string host;     // "": not compared
};
std::vector<std::string> profile_mismatches(const Inputs& inputs, const InputOptions& options, const JobIdentity& job);
void print_profile_mismatches(std::ostream& out, const Inputs& inputs, const InputOptions& options, const JobIdentity& job);
// With a measured profile: the share of `predicted_s` (the iteration of `config`) that rests on
// lookups far outside the measured sizes, i.e. how much faster the prediction would be if they
// cost nothing; printed with what they are when above 1%. Returns -1 for an analytic profile.
double print_far_lookup_share(std::ostream& out, const Inputs& inputs, const ParallelConfig& config, double predicted_s);
// How sure the prediction of `config` (predicted_s per iteration) is, printed and returned as
// (low, high) for the JSON's iteration_time_s_range:
//  - a measured profile: the iteration when every measured point takes its fastest, then its
//    slowest repetition ("profile spread: ...");
//  - the analytic profile of a topology with a `published_error`: the iteration time the plan
//    takes if it errs as this machine's published measurements did ("published error: ...");
//  - otherwise nothing, and no line.
std::optional<std::pair<double, double>> print_prediction_range(std::ostream& out, const Inputs& inputs,
                                                                const ParallelConfig& config, double predicted_s);
// Human-readable output goes to stderr when JSON goes to stdout.
std::ostream& human_stream(const InputOptions& options);
void print_startup_table(std::ostream& out, const Inputs& inputs, const InputOptions& options);
// --emit megatron|deepspeed FILE: the launch files of `plan` (megatron: FILE, Megatron-LM's
// arguments; deepspeed: FILE the ds_config.json and FILE.args.sh Megatron-DeepSpeed's arguments).
void add_emit_option(CLI::App& app, std::vector<std::string>& emit);
void write_launch_files(const std::vector<std::string>& emit, const Inputs& inputs, const Prediction& plan,
                        std::ostream& out);
// Writes `doc` (to a file, or stdout for "-") with the model, topology and profile it came from.
void write_json_with_inputs(const std::string& path, nlohmann::json doc, const Inputs& inputs);
// --json and --html: `doc` (its "kind" set) with its inputs as JSON, and as an HTML report
// (html_reports.hpp), saying where the report went on `out`.
void write_results(const InputOptions& options, nlohmann::json doc, const Inputs& inputs, std::ostream& out);
// The HTML report of `doc` to `path`, said on `out` (what write_results does for --html).
void write_html_result(const std::string& path, const nlohmann::json& doc, const std::string& source, std::ostream& out);

}  // namespace tedsim::cli
