#include "inputs.hpp"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "tedsim/core/error.hpp"
#include "tedsim/core/units.hpp"
#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/profile/far_masked_profile.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/core/atomic_file.hpp"
#include "tedsim/report/html_reports.hpp"
#include "tedsim/report/launch_export.hpp"
#include "tedsim/report/prediction_json.hpp"
#include "tedsim/report/text_table.hpp"
#include "tedsim/search/search.hpp"
#include "tedsim/spec/data_files.hpp"

namespace tedsim::cli {

void add_input_options(CLI::App& app, InputOptions& o) {
  app.add_option("--model", o.model, "shipped model name or path to a model YAML")->capture_default_str();
  app.add_option("--topology", o.topology, "shipped topology name or path to a topology YAML")->capture_default_str();
  app.add_option("--experts", o.experts, "override the expert count (0 = dense model)");
  app.add_option("--capacity-factor", o.capacity_factor, "override the MoE capacity factor (0: dropless routing)");
  app.add_option("--mtp-layers", o.mtp_layers,
                 "override the multi-token-prediction modules (0: none; DeepSeek-V3 trains with 1)");
  app.add_option("--imbalance", o.imbalance,
                 "dropless: the busiest expert's tokens over the mean (default: the model's, else " +
                     fixed(kDefaultImbalance, 1) + ")");
  app.add_option("--dtype", o.dtype, "override the training dtype (fp32, fp16, bf16)");
  app.add_option("--attention-kernel", o.attention_kernel,
                 "the attention core: unfused (batched GEMM, softmax, batched GEMM) or flash (fused); auto: flash "
                 "where the profile has measured flash rates (the analytic profiles of Ampere and later GPUs)")
      ->capture_default_str();
  app.add_option("--gpus", o.gpus, "devices in the cluster (need not fill whole nodes)")->capture_default_str();
  app.add_option("--gpus-per-node", o.gpus_per_node,
                 "devices the job takes on each node (default: all the topology's), e.g. 64 of a GB200 NVL72 rack's "
                 "72 when jobs are placed in 16-tray blocks; the node's links are the topology's either way");
  app.add_option("--global-batch", o.global_batch, "sequences per iteration")->capture_default_str();
  app.add_option("--seq", o.seq_len, "sequence length (default: the model's)")
      ->check(CLI::Validator(
          [](std::string& v) {
            return std::atoll(v.c_str()) > 0 ? std::string() : "expected a positive sequence length, got " + v;
          },
          "POSITIVE"));
  app.add_option("--profile", o.profile, "measured profile (JSON written by tedsim calibrate); default: analytic");
  app.add_option("--json", o.json, "write JSON to FILE, or - for stdout (tables then go to stderr)");
  app.add_option("--html", o.html, "write the result as one self-contained HTML report with plots (opens offline)");
}

void add_switch(CLI::App& app, const std::string& name, bool& value, const std::string& what, const std::string& note) {
  // Two flags, so that --help shows the real default (CLI11's "--x,!--no-x" shows "{false}").
  CLI::Option* on = app.add_flag_callback("--" + name, [&value] { value = true; },
                                          what + " (default: " + (value ? "on" : "off") + note + ")");
  app.add_flag_callback(
      "--no-" + name,
      [&value, on, name] {
        if (on->count() > 0) throw CLI::ValidationError("--no-" + name, "contradicts --" + name + ", given too");
        value = false;
      },
      "turn --" + name + " off");
}

bool switch_given(const CLI::App& app, const std::string& name) {
  return app.count("--" + name) > 0 || app.count("--no-" + name) > 0;
}

void add_config_options(CLI::App& app, ConfigOptions& o) {
  app.add_option("--pp", o.pp, "pipeline degree P (stages; pipeline outermost in the rank order)")->capture_default_str();
  app.add_option("--vpp", o.vpp, "model chunks per pipeline rank V (1: 1F1B, > 1: interleaved 1F1B)")->capture_default_str();
  app.add_option("--pipeline-layout", o.pipeline_layout,
                 "explicit split, Megatron-Core's layout string, e.g. 'Et|(tt|)*30tL' (E embedding, t layer, L loss)");
  app.add_option("--tp", o.tp, "tensor degree t")->capture_default_str();
  app.add_option("--cp", o.cp,
                 "context degree c: each sequence split over c ranks beside the tensor group, the attention "
                 "passing keys and values around them (Megatron-Core's --context-parallel-size; simulate and "
                 "search only)")
      ->capture_default_str();
  app.add_option("--ep", o.ep, "expert degree e (ignored for dense models)")->capture_default_str();
  app.add_option("--micro-batch", o.micro_batch, "sequences per data-parallel replica per micro-batch")->capture_default_str();
  app.add_option("--zero", o.zero, "ZeRO stage 0, 1, 2 or 3")->capture_default_str();
  add_switch(app, "dtd", o.dtd, "duplicate token dropping around the expert all-to-alls", "; off with --sequence-parallel unless given");
  add_switch(app, "cac", o.cac, "communication-aware checkpointing", "; off without full recompute unless given");
  add_switch(app, "checkpoint", o.checkpoint, "activation checkpointing: aliases of --recompute full / none");
  app.add_option("--recompute", o.recompute, "none, selective or full (default: as --checkpoint says)");
  app.add_option("--recompute-modules", o.recompute_modules,
                 "with --recompute selective: core_attn, layernorm, mlp, moe_act, moe, shared_experts, mla_up_proj")
      ->capture_default_str();
  add_switch(app, "sequence-parallel", o.sequence_parallel, "sequence parallelism with tensor parallelism");
  add_switch(app, "expert-tp", o.expert_tp, "split experts over the tensor group");
  add_switch(app, "tiled-optimizer", o.tiled, "tile the expert optimizer step");
  add_switch(app, "shared-expert-overlap", o.shared_expert_overlap,
             "run shared experts on a side stream during the dispatch/combine all-to-alls (Megatron-Core's "
             "--moe-shared-expert-overlap)");
  add_switch(app, "moe-a2a-overlap", o.moe_a2a_overlap,
             "merge each steady-state forward with the next backward so one micro-batch's expert all-to-alls "
             "run beside the other's compute (Megatron-Core's --overlap-moe-expert-parallel-comm; pipelines need "
             "--vpp > 1)");
  app.add_option("--moe-a2a-overlap-sms", o.moe_a2a_overlap_sms,
                 "SMs the overlapped all-to-all kernels hold (Megatron-Core's --moe-deepep-num-sms, default 20; "
                 "Megatron-Bridge runs HybridEP with 32); priced where the topology gives device.sms")
      ->capture_default_str();
  app.add_option("--moe-dispatcher", o.moe_dispatcher,
                 "how tokens reach their experts: alltoall (every token-expert pair, Megatron-Core's alltoall "
                 "dispatcher) or flex (DeepEP/HybridEP: once per destination GPU and node)")
      ->capture_default_str();
  app.add_option("--adam-moments", o.adam_moments,
                 "Adam's m and v in fp32 or bf16 (Megatron-Core's precision-aware optimizer with bf16 "
                 "--exp-avg-dtype and --exp-avg-sq-dtype; master weights stay fp32)")
      ->capture_default_str();
  app.add_option("--cuda-graph-scope", o.cuda_graph_scope,
                 "parts of each layer captured as CUDA graphs (Megatron-Core's --cuda-graph-impl transformer_engine "
                 "--cuda-graph-scope): none, or a list of attn, mlp, moe_router, moe_preprocess; or full_iteration "
                 "(--cuda-graph-impl full_iteration: the whole forward and backward, no host launches; dropless MoE "
                 "then needs --moe-dispatcher flex and --fused-grouped-mlp); priced on the host side where the "
                 "topology has a host section")
      ->capture_default_str();
  add_switch(app, "fused-grouped-mlp", o.fused_grouped_mlp,
             "the experts' MLP as Transformer Engine's fused grouped ops (Megatron-Bridge's cutedsl_fused_grouped_mlp: "
             "GLU, probabilities and quantization in the grouped GEMMs' epilogues; MXFP8 on Blackwell only)");
  add_switch(app, "fp8-attention", o.fp8_attention,
             "the fused attention core in FP8 (Megatron-Core's --fp8-dot-product-attention), priced from the "
             "topology's measured flash_fp8_* tables");
  app.add_option("--layout", o.layout,
                 "rank layout: ted (tensor, expert, data), data_before_expert, or folded (Megatron-Core's MoE parallel "
                 "folding: whole experts on their own grid over the stage, expert groups across tensor ranks; needs "
                 "--no-expert-tp, and --sequence-parallel with --tp > 1)")
      ->capture_default_str();
}

void note_defaulted_degrees(const CLI::App& app, ConfigOptions& o) {
  o.defaulted.clear();
  const std::pair<const char*, int> degrees[] = {{"--tp", o.tp}, {"--ep", o.ep}, {"--micro-batch", o.micro_batch}, {"--zero", o.zero}};
  for (const auto& [flag, value] : degrees) {
    if (app.count(flag) == 0) o.defaulted.push_back(std::string(flag) + " " + std::to_string(value));
  }
  o.cac_given = switch_given(app, "cac");
  o.dtd_given = switch_given(app, "dtd");
  o.checkpoint_given = switch_given(app, "checkpoint");
}

namespace {

// The --tp/--ep pairs search would consider for this model, cluster and batch (each valid with at
// least one micro-batch), for the message of a configuration that breaks a rule.
std::string valid_degrees(const ModelSpec& model, const ParallelConfig& c) {
  SearchSpace space;
  space.gpus = c.gpus;
  space.global_batch = c.global_batch;
  space.seq_len = c.seq_len;
  space.zero_stages = {c.zero >= 0 && c.zero <= 2 ? c.zero : 1};
  const int cp = std::max(1, c.cp);  // the pairs valid at the context degree asked for
  space.max_cp = cp;
  std::vector<std::pair<int, int>> pairs;
  if (c.gpus > 0 && c.global_batch > 0) {
    for (const ParallelConfig& v : enumerate_configs(model, space)) {
      if (v.cp != cp) continue;
      const std::pair<int, int> p{v.tp, v.ep};
      if (std::find(pairs.begin(), pairs.end(), p) == pairs.end()) pairs.push_back(p);
    }
  }
  const std::string where = "'" + model.name + "' on " + std::to_string(c.gpus) + " devices with global batch " +
                            std::to_string(c.global_batch) + (cp > 1 ? " and --cp " + std::to_string(cp) : std::string());
  if (pairs.empty()) return "no degrees are valid for " + where;
  std::string text = "valid for " + where + ": ";
  const std::size_t shown = std::min<std::size_t>(pairs.size(), 12);
  for (std::size_t i = 0; i < shown; ++i) {
    text += (i ? ", " : "") + std::string("--tp ") + std::to_string(pairs[i].first);
    if (model.is_moe()) text += " --ep " + std::to_string(pairs[i].second);
  }
  if (pairs.size() > shown) text += " and " + std::to_string(pairs.size() - shown) + " more";
  return text + " (`tedsim search` ranks them)";
}

}  // namespace

ParallelConfig resolve_config(const ConfigOptions& k, const InputOptions& in, const ModelSpec& model) {
  ParallelConfig c;
  c.gpus = in.gpus;
  c.global_batch = in.global_batch;
  c.seq_len = in.seq_len;
  c.pp = k.pp;
  c.vpp = k.vpp;
  c.pipeline_layout = k.pipeline_layout;
  c.tp = k.tp;
  c.cp = k.cp;
  c.ep = model.is_moe() ? k.ep : 1;
  c.micro_batch = k.micro_batch;
  c.zero = k.zero;
  c.sequence_parallel = k.sequence_parallel;
  c.recompute = k.checkpoint ? Recompute::full : Recompute::none;
  if (!k.recompute.empty()) {
    c.recompute = parse_recompute(k.recompute);
    if (k.checkpoint_given && (c.recompute == Recompute::full) != k.checkpoint)
      throw InputError(std::string(k.checkpoint ? "--checkpoint" : "--no-checkpoint") + " contradicts --recompute " +
                       k.recompute + " (--checkpoint means full, --no-checkpoint none)");
  }
  c.recompute_modules = parse_recompute_modules(k.recompute_modules);
  c.dtd = k.dtd_given ? k.dtd : k.dtd && !c.sequence_parallel;
  c.cac = k.cac_given ? k.cac : k.cac && c.full_recompute();
  c.expert_tp = k.expert_tp;
  c.tiled_optimizer = k.tiled;
  c.shared_expert_overlap = k.shared_expert_overlap;
  c.moe_a2a_overlap = k.moe_a2a_overlap;
  c.moe_a2a_overlap_sms = k.moe_a2a_overlap_sms;
  c.moe_dispatcher = parse_moe_dispatcher(k.moe_dispatcher);
  c.adam_moments = parse_adam_moments(k.adam_moments);
  c.cuda_graph_scopes = parse_cuda_graph_scopes(k.cuda_graph_scope);
  c.fused_grouped_mlp = k.fused_grouped_mlp;
  c.fp8_attention = k.fp8_attention;
  c.layout = parse_layout(k.layout);
  const std::string why = config_violation(c, model);
  if (!why.empty()) {
    std::string text = "invalid configuration for model '" + model.name + "': " + why;
    if (!k.defaulted.empty()) {
      text += " (not given, so defaults:";
      for (const std::string& d : k.defaulted) text += " " + d;
      text += ")";
    }
    throw InputError(text + "; " + valid_degrees(model, c));
  }
  return c;
}

void check_fused_grouped_mlp(bool fused, const TopologySpec& topology) {
  if (fused && topology.device.fp8_recipe != Fp8Recipe::mxfp8)
    throw InputError("--fused-grouped-mlp: topology '" + topology.name +
                     "' trains FP8 with per-tensor scaling; Transformer Engine fuses the grouped MLP for the MXFP8 "
                     "recipe only (Blackwell: device.fp8_recipe mxfp8)");
}

void check_fp8_attention(bool fp8, const TopologySpec& topology) {
  if (fp8 && !topology.attention.has_fp8())
    throw InputError("--fp8-attention: topology '" + topology.name +
                     "' has no measured FP8 attention rates (efficiency.attention.flash_fp8_forward_d64/_d128 and "
                     "flash_fp8_backward_*)");
}

void add_emit_option(CLI::App& app, std::vector<std::string>& emit) {
  app.add_option("--emit", emit,
                 "megatron FILE: Megatron-LM arguments of the plan; deepspeed FILE: its ds_config.json in FILE and "
                 "the Megatron-DeepSpeed arguments in FILE.args.sh")
      ->expected(2)
      ->type_name("KIND FILE");
}

void write_launch_files(const std::vector<std::string>& emit, const Inputs& in, const Prediction& plan, std::ostream& out) {
  if (emit.empty()) return;
  const std::string& kind = emit[0];
  const std::string& file = emit[1];
  if (kind == "megatron") {
    write_file_atomically(file, megatron_launch(in.model, in.topology, plan));
    out << "emitted Megatron-LM arguments: " << file << "\n";
  } else if (kind == "deepspeed") {
    write_file_atomically(file, deepspeed_config(in.model, plan));
    write_file_atomically(file + ".args.sh", megatron_deepspeed_launch(in.model, in.topology, plan, file));
    out << "emitted DeepSpeed config: " << file << ", Megatron-DeepSpeed arguments: " << file << ".args.sh\n";
  }
}

void write_json_with_inputs(const std::string& path, nlohmann::json doc, const Inputs& in) {
  doc["model"] = in.model.name;
  doc["topology"] = in.topology.name;
  doc["profile"] = in.profile->describe();
  write_json(path, doc);
}

void write_html_result(const std::string& path, const nlohmann::json& doc, const std::string& source, std::ostream& out) {
  write_html_report(path, {doc}, {source});
  out << "report: " << path << " (open it in a browser; it fetches nothing)\n";
}

void write_results(const InputOptions& o, nlohmann::json doc, const Inputs& in, std::ostream& out) {
  doc["model"] = in.model.name;
  doc["topology"] = in.topology.name;
  doc["profile"] = in.profile->describe();
  if (!o.html.empty()) write_html_result(o.html, doc, "tedsim " + doc.value("kind", std::string("result")), out);
  doc.erase("timeline");  // the page's; --trace FILE writes it for tools
  if (!o.json.empty()) write_json(o.json, doc);
}

namespace {

std::optional<std::pair<double, double>> print_profile_spread(std::ostream& out, const Inputs& inputs,
                                                              const ParallelConfig& config) {
  const auto* measured = dynamic_cast<const MeasuredProfile*>(inputs.profile.get());
  if (!measured) return std::nullopt;
  const auto iteration_at = [&](SpreadEnd end) {
    const MeasuredProfile at_end(at_spread_end(measured->data(), end), inputs.topology);
    return Evaluator(inputs.model, inputs.topology, at_end).evaluate(config).sim.iteration_s;
  };
  const double low = iteration_at(SpreadEnd::fastest), high = iteration_at(SpreadEnd::slowest);
  out << "profile spread: " << human_seconds(low) << " to " << human_seconds(high)
      << " per iteration when every measured point takes its fastest or its slowest repetition\n";
  return std::make_pair(low, high);
}

std::optional<std::pair<double, double>> print_published_range(std::ostream& out, const Inputs& inputs,
                                                               double predicted_s) {
  const PublishedError& e = inputs.topology.published;
  if (e.rows == 0 || predicted_s <= 0 || dynamic_cast<const MeasuredProfile*>(inputs.profile.get())) return std::nullopt;
  // Throughput error e = predicted / published - 1, so the measured time is (1 + e) x the predicted.
  const double low = predicted_s * (1 + e.min), high = predicted_s * (1 + e.max);
  const auto pct = [](double x) { return fixed(100 * std::fabs(x), 0) + "%"; };
  const std::string how = e.min >= 0   ? pct(e.min) + " to " + pct(e.max) + " more"
                          : e.max <= 0 ? pct(e.max) + " to " + pct(e.min) + " less"
                                       : "from " + pct(e.min) + " less to " + pct(e.max) + " more";
  out << "published error: on " << e.rows << " published measurements of " << inputs.topology.name
      << " the analytic profile predicted " << how
      << " throughput than measured (reports/published-results.md); erring alike, this plan takes "
      << human_seconds(low) << " to " << human_seconds(high) << " per iteration\n";
  return std::make_pair(low, high);
}

}  // namespace

std::optional<std::pair<double, double>> print_prediction_range(std::ostream& out, const Inputs& inputs,
                                                                const ParallelConfig& config, double predicted_s) {
  if (auto spread = print_profile_spread(out, inputs, config)) return spread;
  return print_published_range(out, inputs, predicted_s);
}

double print_far_lookup_share(std::ostream& out, const Inputs& inputs, const ParallelConfig& config, double predicted_s) {
  const auto* measured = dynamic_cast<const MeasuredProfile*>(inputs.profile.get());
  if (!measured || predicted_s <= 0) return -1;
  const FarMaskedProfile masked(*measured);
  const double without_s = Evaluator(inputs.model, inputs.topology, masked).evaluate(config).sim.iteration_s;
  const double share = std::max(0.0, (predicted_s - without_s) / predicted_s);
  if (share >= 0.01) {
    out << "profile: " << fixed(100 * share, 1) << "% of the predicted iteration (" << fixed(1e3 * (predicted_s - without_s), 3)
        << " of " << fixed(1e3 * predicted_s, 3) << " ms) rests on lookups more than "
        << fixed(MeasuredProfile::kFarFactor, 0) << "x outside the measured sizes (the lines marked far: above); "
        << "calibrate with sizes that cover the job (--max-bytes, the model's own shapes) to measure them\n";
  }
  return share;
}

std::ostream& human_stream(const InputOptions& o) { return o.json == "-" ? std::cerr : std::cout; }

void apply_routing_overrides(const InputOptions& o, ModelSpec& m) {
  if (o.mtp_layers) {
    if (*o.mtp_layers < 0 || *o.mtp_layers > 16)
      throw InputError("--mtp-layers: expected 0 to 16 multi-token-prediction modules, got " + std::to_string(*o.mtp_layers));
    m.mtp_layers = *o.mtp_layers;
  }
  if (o.capacity_factor) {
    if (!m.is_moe()) throw InputError("--capacity-factor: model '" + m.name + "' is dense (no experts)");
    if (!(*o.capacity_factor >= 0) || *o.capacity_factor > 1e3)
      throw InputError("--capacity-factor: expected a factor >= 0 (0: dropless), got " + fixed(*o.capacity_factor, 3));
    m.moe.capacity_factor = *o.capacity_factor;
  }
  if (o.imbalance) {
    if (!m.is_moe()) throw InputError("--imbalance: model '" + m.name + "' is dense (no experts)");
    if (!(*o.imbalance >= 1.0) || *o.imbalance > double(m.moe.experts))
      throw InputError("--imbalance: expected the busiest expert's load over the mean, from 1 to the expert count (" +
                       std::to_string(m.moe.experts) + "), got " + fixed(*o.imbalance, 3));
    if (!m.moe.dropless())
      throw InputError("--imbalance applies to dropless routing; model '" + m.name + "' has capacity factor " +
                       fixed(m.moe.capacity_factor, 2) + " (add --capacity-factor 0)");
    m.moe.imbalance = *o.imbalance;
    m.moe.imbalance_given = true;
  }
}

// Dropless routing that neither the model nor --imbalance states: the measured profile's count of
// the step's own router, where calibration measured this model's.
void adopt_measured_routing(Inputs& in) {
  MoeSpec& e = in.model.moe;
  if (!in.model.is_moe() || !e.dropless() || e.imbalance_given) return;
  const ExpertShares* shares = in.profile->expert_shares();
  if (!shares || shares->model != in.model.name || shares->experts() != e.experts) return;
  e.measured_shares = *shares;
  e.imbalance = shares->imbalance();
}

void resolve_attention_kernel(const InputOptions& o, Inputs& in) {
  const AttentionShape probe{1, 1024, 128, 128};
  const bool has_flash = in.profile->attention_seconds(AttentionKernel::flash, false, probe) >= 0;
  if (o.attention_kernel == "auto") {
    in.model.core_attention = has_flash ? AttentionKernel::flash : AttentionKernel::unfused;
    return;
  }
  in.model.core_attention = parse_attention_kernel(o.attention_kernel, "--attention-kernel");
  if (in.model.core_attention == AttentionKernel::flash && !has_flash)
    throw InputError("--attention-kernel flash: the profile (" + in.profile->describe() +
                     ") has no measured flash-attention rates to price it; use --attention-kernel unfused, or a "
                     "topology whose efficiency.attention block gives them");
}

Inputs load_inputs(const InputOptions& o) {
  Inputs in;
  in.model_file = resolve_data_file("models", o.model);
  in.topology_file = resolve_data_file("topologies", o.topology);
  in.model = load_model(in.model_file);
  if (o.experts) in.model.set_experts(*o.experts);
  apply_routing_overrides(o, in.model);
  if (!o.dtype.empty()) in.model.dtype = parse_dtype(o.dtype);
  in.topology = load_topology(in.topology_file);
  if (o.gpus_per_node != 0) {
    if (o.gpus_per_node < 0 || o.gpus_per_node > in.topology.devices_per_node)
      throw InputError("--gpus-per-node " + std::to_string(o.gpus_per_node) + ": expected 1 to the " +
                       std::to_string(in.topology.devices_per_node) + " devices a node of topology '" +
                       in.topology.name + "' has (" + in.topology_file + ": devices_per_node)");
    // Directly linked islands (Summit's triads) stay as they are where whole ones fit the job's
    // share of a node; otherwise the job's devices on a node count as one island.
    if (in.topology.island_size >= in.topology.devices_per_node || o.gpus_per_node % in.topology.island_size != 0)
      in.topology.island_size = o.gpus_per_node;
    in.topology.devices_per_node = o.gpus_per_node;
  }
  if (o.gpus <= 0) throw InputError("--gpus: expected a positive device count, got " + std::to_string(o.gpus));
  if (o.global_batch <= 0) throw InputError("--global-batch: expected a positive count, got " + std::to_string(o.global_batch));
  if (o.seq_len < 0) throw InputError("--seq: expected a positive length, got " + std::to_string(o.seq_len));
  // Every configuration needs the data degree to divide the batch: d <= B, and t <= heads, P <= layers.
  const double usable = double(o.global_batch) * in.model.heads * in.model.layers;
  if (double(o.gpus) > usable)
    throw InputError("--gpus " + std::to_string(o.gpus) + ": more devices than any configuration of '" + in.model.name +
                     "' can use with global batch " + std::to_string(o.global_batch) +
                     " (at most global batch x heads x layers = " + fixed(usable, 0) + ")");
  if (in.topology.device.peak_tflops_of(in.model.dtype) <= 0)
    throw InputError(in.topology_file + ": device " + in.topology.device.name + " has no " + to_string(in.model.dtype) +
                     " peak, which model '" + in.model.name + "' trains in (use --dtype with one of the device's dtypes)");
  in.profile = o.profile.empty() ? std::make_unique<AnalyticProfile>(in.topology) : load_profile(o.profile, in.topology);
  resolve_attention_kernel(o, in);
  adopt_measured_routing(in);
  return in;
}

namespace {

// 38.86 B, 1.21 M, 524 K: parameter counts at a glance.
std::string moe_text(const ModelSpec& m) {
  const MoeSpec& e = m.moe;
  std::string text = std::to_string(e.experts) + " of width " + std::to_string(m.expert_ffn()) + " on " +
                     std::to_string(m.moe_layers()) + " of " + std::to_string(m.layers) + " layers, top-" +
                     std::to_string(e.top_k) + " " + to_string(e.router);
  if (e.group_limited()) text += " within " + std::to_string(e.topk_groups) + "/" + std::to_string(e.groups) + " groups";
  if (e.shared_experts > 0) text += ", " + std::to_string(e.shared_experts) + " shared of width " + std::to_string(m.shared_ffn());
  if (e.dropless())
    text += ", dropless (busiest expert " + fixed(e.imbalance, 2) + "x the mean" +
            (e.measured_shares.empty() ? "" : ", as calibration routed the step's tokens") + ")";
  else text += ", capacity factor " + fixed(e.capacity_factor, 2) + ", min capacity " + std::to_string(e.min_capacity);
  return text;
}

std::string count_text(double n) {
  if (n >= 1e9) return fixed(n / 1e9, 2) + " B";
  if (n >= 1e6) return fixed(n / 1e6, 2) + " M";
  if (n >= 1e3) return fixed(n / 1e3, 1) + " K";
  return fixed(n, 0);
}

}  // namespace

std::vector<std::string> profile_mismatches(const Inputs& in, const InputOptions& o, const JobIdentity& job) {
  std::vector<std::string> out;
  const auto* measured = dynamic_cast<const MeasuredProfile*>(in.profile.get());
  if (!measured) return out;
  const ProfileData& d = measured->data();
  std::string calibrated_model;
  std::vector<std::string> completed_for;
  if (!d.calibration_json.empty()) {
    try {
      // calibrate stores its arguments under "arguments" (what a resume compares).
      const nlohmann::json calibration = nlohmann::json::parse(d.calibration_json);
      const nlohmann::json& args = calibration.contains("arguments") ? calibration["arguments"] : calibration;
      if (args.contains("model") && args["model"].is_string()) calibrated_model = args["model"].get<std::string>();
      // validate --calibrate measured what these models' jobs ask: not another model's profile for them.
      if (calibration.contains("completed_for") && calibration["completed_for"].is_array())
        for (const nlohmann::json& job : calibration["completed_for"])
          if (job.contains("model") && job["model"].is_string()) completed_for.push_back(job["model"].get<std::string>());
    } catch (const nlohmann::json::exception&) {
    }
  }
  // The calibrate argument may be a name or a path; compare names, and paths by their stem.
  const auto stem = [](std::string s) {
    if (const auto slash = s.find_last_of('/'); slash != std::string::npos) s = s.substr(slash + 1);
    if (const auto dot = s.rfind(".yaml"); dot != std::string::npos && dot + 5 == s.size()) s = s.substr(0, dot);
    return s;
  };
  const bool completed = std::any_of(completed_for.begin(), completed_for.end(), [&](const std::string& m) {
    return stem(m) == in.model.name || stem(m) == stem(o.model);
  });
  if (!completed && !calibrated_model.empty() && stem(calibrated_model) != in.model.name &&
      stem(calibrated_model) != stem(o.model))
    out.push_back("calibrated for model '" + calibrated_model + "', this job is '" + in.model.name +
                  "': its GEMM shapes and sizes are another model's, so lookups interpolate between them; calibrate "
                  "this model (tedsim calibrate --model " + o.model + " ...)");
  if (job.ranks > 0 && d.provenance.ranks != job.ranks)
    out.push_back("calibrated with " + std::to_string(d.provenance.ranks) + " MPI ranks, this job runs " +
                  std::to_string(job.ranks) + ": its collectives were timed on other group shapes");
  if (!job.backend.empty() && !d.provenance.backend.empty() && d.provenance.backend != job.backend)
    out.push_back("calibrated on the " + d.provenance.backend + " backend, this job runs " + job.backend);
  if (!job.host.empty() && !d.provenance.hosts.empty() &&
      std::find(d.provenance.hosts.begin(), d.provenance.hosts.end(), job.host) == d.provenance.hosts.end())
    out.push_back("calibrated on host " + d.provenance.hosts.front() + (d.provenance.hosts.size() > 1 ? " and others" : "") +
                  ", this job runs on " + job.host + ": another machine");
  return out;
}

void print_profile_mismatches(std::ostream& out, const Inputs& in, const InputOptions& o, const JobIdentity& job) {
  for (const std::string& line : profile_mismatches(in, o, job)) out << "profile mismatch: " << line << '\n';
}

void print_startup_table(std::ostream& out, const Inputs& in, const InputOptions& o) {
  const ModelSpec& m = in.model;
  const TopologySpec& t = in.topology;
  const int nodes = (o.gpus + t.devices_per_node - 1) / t.devices_per_node;
  TextTable table({"input", "resolved to"});
  table.align_left();
  table.add_row({"model", m.name + " (" + in.model_file + ")"});
  table.add_row({"  shape", std::to_string(m.layers) + " layers, hidden " + std::to_string(m.hidden) + ", " +
                                std::to_string(m.heads) + " heads (" + std::to_string(m.kv_heads) + " kv), ffn " +
                                std::to_string(m.ffn) + " " + to_string(m.activation) + ", vocab " +
                                std::to_string(m.vocab) + ", seq " + std::to_string(o.seq_len > 0 ? o.seq_len : m.seq_len) +
                                (o.seq_len == 0 && m.source.rfind("Hugging Face", 0) == 0
                                     ? " (a Hugging Face config has no training length; --seq sets it)"
                                     : "") +
                                ", " + to_string(m.dtype)});
  if (m.head_dim_given > 0 || m.is_mla() || m.norm == Norm::rmsnorm || m.sliding_window > 0)
    table.add_row({"  attention", std::string(to_string(m.attention)) +
                                      (m.is_mla() ? ", kv latent " + std::to_string(m.mla.kv_lora_rank) + ", q latent " +
                                                        std::to_string(m.mla.q_lora_rank)
                                                  : ", head_dim " + std::to_string(m.head_dim())) +
                                      ", " + to_string(m.norm) +
                                      (m.sliding_window > 0
                                           ? ", sliding window " + std::to_string(m.sliding_window) +
                                                 (m.full_attention_every > 0
                                                      ? " on all but one layer in " + std::to_string(m.full_attention_every)
                                                      : " on every layer")
                                           : "")});
  table.add_row({"  attention core", std::string(to_string(m.core_attention)) +
                                         (o.attention_kernel == "auto" ? " (auto: " +
                                                                             std::string(m.core_attention == AttentionKernel::flash
                                                                                             ? "the profile has measured flash rates"
                                                                                             : "the profile has no flash rates") +
                                                                             ")"
                                                                       : "")});
  for (const std::string& a : m.approximations) table.add_row({"  approximated", a});
  table.add_row({"  experts", m.is_moe() ? moe_text(m) : std::string("none (dense)")});
  table.add_row({"  parameters", count_text(m.total_params()) + " (" + count_text(m.nonexpert_params()) +
                                     " non-expert, " + count_text(m.expert_params()) + " expert)"});
  if (m.mtp_layers > 0)
    table.add_row({"  multi-token", std::to_string(m.mtp_layers) + (m.mtp_layers == 1 ? " module" : " modules") +
                                        " on the last stage, a layer of the last layer's kind each (" +
                                        count_text(m.mtp_nonexpert_params() + m.mtp_expert_params()) +
                                        " beside the parameters above)"});
  table.add_row({"topology", t.name + " (" + in.topology_file + ")"});
  table.add_row({"  device", t.device.name + ", " + fixed(t.device.memory_gib, 1) + " GiB, " +
                                 fixed(t.device.peak_tflops_of(m.dtype), 1) + " TFLOP/s " + to_string(m.dtype) + ", " +
                                 fixed(t.device.memory_bandwidth_gbs, 0) + " GB/s"});
  table.add_row({"  links", fixed(t.intra.bandwidth_gbs, 0) + " GB/s intra-node, " + fixed(t.inter.bandwidth_gbs, 0) +
                                " GB/s per node across nodes"});
  if (t.is_gpu())
    table.add_row({"  host", t.host.framework_op_us > 0
                                 ? t.host.cpu + ", " + fixed(t.host.framework_op_us, 1) +
                                       " us per framework call (eager launches priced: phase host_launch)"
                                 : std::string("not priced (the topology has no host section: launches never hold the "
                                               "GPU back)")});
  table.add_row({"cluster", std::to_string(o.gpus) + " devices on " + std::to_string(nodes) + " nodes of " +
                                std::to_string(t.devices_per_node) +
                                (o.gpus_per_node > 0 ? " (--gpus-per-node)" : "") +
                                (o.gpus % t.devices_per_node ? " (last node partly filled)" : "")});
  table.add_row({"global batch", std::to_string(o.global_batch) + " sequences"});
  table.add_row({"profile", in.profile->describe()});
  table.print(out);
  out << '\n';
}

}  // namespace tedsim::cli
