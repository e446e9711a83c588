// tedsim validate: predict one configuration, run the real training step for it under MPI (warm-up,
// then N measured iterations), and print predicted vs measured per phase, for the iteration and
// for memory. MPI is initialized here, so the other commands run without mpirun.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <fstream>
#include <memory>

#include "inputs.hpp"
#include "measured_trace.hpp"
#include "tedsim/calibration/job_calibration.hpp"
#include "tedsim/comm/mpi_session.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/comm/communicator.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/core/yaml_reader.hpp"
#include "tedsim/model/workload.hpp"
#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/report/prediction_json.hpp"
#include "tedsim/report/text_table.hpp"
#include "tedsim/runtime/measure.hpp"
#include "tedsim/search/evaluator.hpp"
#include "validate_command.hpp"
#include "validation_config.hpp"
#include "watchdog_options.hpp"
#include "kernel_times.hpp"
#include "tedsim/calibration/machine_speed.hpp"
#include "tedsim/runtime/kernel_census.hpp"

namespace tedsim::cli {


namespace {

// The sentinel's change since calibration, and a warning beyond kSpeedChangeLimit.
void print_machine_speed(std::ostream& out, const calibration::SpeedCheck& speed) {
  const double change = speed.change();
  out << "machine speed: the profile's sentinel GEMM " << speed.gemm.m << "x" << speed.gemm.n << "x" << speed.gemm.k
      << (speed.gemm.batch > 1 ? " x" + std::to_string(speed.gemm.batch) : std::string()) << " took "
      << fixed(speed.calibrated_s * 1e6, 1) << " us when calibrated and " << fixed(speed.now_s * 1e6, 1)
      << " us around this run (" << (change >= 0 ? "+" : "") << fixed(100 * change, 0) << "%)\n";
  if (std::fabs(change) > calibration::kSpeedChangeLimit)
    out << "WARNING: this machine runs " << fixed(100 * std::fabs(change), 0) << "% "
        << (change > 0 ? "slower" : "faster")
        << " than when the profile was measured: the prediction is for the machine as it was then; calibrate again "
           "and validate in the same quiet minutes\n";
}

struct ValidateOptions {
  InputOptions in;
  std::string config;
  ConfigOptions knobs;
  std::string backend = "cpu";
  int warmup = 2, iters = 10;
  std::uint64_t seed = 1234;
  std::string data;
  float lr = 1e-3f;
  double tolerance = 0.25;
  bool calibrate = false;
  std::string trace, trace_predicted;
  bool kernel_times = false;
  WatchdogCliOptions watchdog;
};


bool given(const CLI::App* cmd, const char* option) { return cmd->count(option) > 0; }

std::string ms(double s) { return fixed(s * 1e3, 3); }
std::string rel_error(double predicted, double measured) {
  if (measured < 1e-7 && predicted < 1e-7) return "-";  // a phase neither side has (group of one)
  if (measured <= 0) return "n/a";
  return (predicted >= measured ? "+" : "") + fixed(100.0 * (predicted - measured) / measured, 1) + "%";
}
nlohmann::json rel_error_json(double predicted, double measured) {
  if (measured <= 0) return nullptr;
  return (predicted - measured) / measured;
}

// What the host can give each rank of this run: MemAvailable over the ranks on this host (OpenMPI's
// and Slurm's local counts; the whole world where neither says), in bytes; 0 where unknown.
double host_memory_per_rank(int world_size) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key) {
    if (key == "MemAvailable:") {
      in >> kib;
      break;
    }
    in.ignore(1 << 10, '\n');
  }
  int ranks = world_size;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) {
      ranks = std::atoi(v);
      break;
    }
  return kib * 1024.0 / std::max(1, ranks);
}

// What the training step runs: the decoder with layernorm or RMSNorm, no biases, rotary embeddings
// without frequency scaling, multi-head or grouped-query attention with Qwen3's per-head q/k norms
// and head_dim apart from hidden/heads, multi-head latent attention (value heads apart from the
// query/key heads), routed experts of any width, shared experts, dense and MoE layers in any pattern, DeepSpeed's
// gating and every router of kernels/cpu/router.hpp (kernels/cuda/router.cu on the CUDA backend),
// with a capacity or dropless over all-to-all-v (MPI_Alltoallv; NCCL's grouped send/receive), with
// expert TP and without DTD when t > 1. The first feature of `m` under `c` outside that, in words;
// empty if none.
std::string model_the_step_cannot_run(const ModelSpec& m, const ParallelConfig& c, Backend backend) {
  if (m.mtp_layers > 0 && m.mtp_layers >= (c.seq_len > 0 ? c.seq_len : m.seq_len) - 1)
    return "multi-token prediction deeper than its sequences (mtp_layers >= seq - 1)";
  if (m.linear_bias || m.qkv_bias) return "linear-layer biases";
  if (m.qk_norm == QkNorm::projection) return "OLMoE's norm of the whole query and key projections (Qwen3's per head runs)";
  if (m.sliding_window > 0) return "sliding-window attention";
  if (!m.is_moe()) return {};
  const MoeSpec& e = m.moe;
  if (e.shared_gate) return "Qwen2-MoE's sigmoid gate on the shared experts";
  if (backend == Backend::cuda && e.groups > 64) return "more than 64 router groups on the CUDA backend";
  if (e.dropless() && c.tp > 1 && (c.dtd || !c.expert_tp))
    return "dropless routing with DTD or without expert tensor parallelism (give --no-dtd and --expert-tp)";
  return {};
}

int run_validate(ValidateOptions o, const CLI::App* cmd) {
  const Backend backend = parse_backend(o.backend);
  MpiSession mpi(watchdog_options(o.watchdog));
  if (!o.config.empty()) apply_validation_config(YamlMap::load_file(o.config), o.in, o.knobs, *cmd);
  // A knob the step cannot run is refused before anything else about the run is checked.
  if (o.knobs.moe_a2a_overlap)
    throw InputError("--moe-a2a-overlap: validate's training step runs its passes one at a time on one stream (simulate and "
                     "search model the overlap)");
  if (o.knobs.layout == "folded")
    throw InputError("--layout folded: validate's training step runs the TED layouts, experts inside the tensor x expert "
                     "x data grid (simulate, search and calibrate take the folded one)");
  if (o.knobs.cp != 1)
    throw InputError("--cp " + std::to_string(o.knobs.cp) +
                     ": validate's training step runs no context parallelism yet (simulate and search model it)");
  int world_size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (!given(cmd, "--gpus") && (o.config.empty())) o.in.gpus = world_size;
  if (o.in.gpus != world_size)
    throw InputError("--gpus " + std::to_string(o.in.gpus) + ": validate runs one rank per device, but MPI runs " +
                     std::to_string(world_size) + " ranks (launch with mpirun -np " + std::to_string(o.in.gpus) + ")");
  runtime::require_step_backend(backend);
  if (o.calibrate && o.in.profile.empty())
    throw InputError("--calibrate: give the profile to complete with --profile FILE (a missing file is created)");
  // --calibrate on a profile not yet written: plan on the analytic one until it is measured.
  InputOptions load = o.in;
  if (o.calibrate && !std::ifstream(o.in.profile)) load.profile.clear();
  // The training step runs the unfused core on both backends: predict that, so like meets like.
  if (load.attention_kernel == "flash")
    throw InputError("--attention-kernel flash: the training step runs the unfused attention core (batched GEMM, "
                     "softmax, batched GEMM), so validate predicts that (simulate and search price flash attention)");
  if (load.attention_kernel == "auto") load.attention_kernel = "unfused";
  Inputs in = load_inputs(load);
  ParallelConfig c = resolve_config(o.knobs, o.in, in.model);
  c.moe_weights_at_combine = true;  // the runtime's combine weights the expert outputs
  // The training step gathers each ZeRO-3 unit with a blocking all-gather right before its use
  // (runtime/optimizer/zero3.cpp): predict that, not DeepSpeed's prefetch, so like meets like.
  c.zero3_prefetch = false;
  // The training step implements ZeRO 0, 1 and 3; a ZeRO-2 prediction would be compared with a run
  // that is not ZeRO-2.
  if (c.zero == 2) throw InputError("--zero 2: validate runs ZeRO stages 0, 1 and 3");
  if (c.zero == 3 && backend == Backend::cuda)
    throw InputError("--zero 3: validate runs ZeRO-3 on the CPU backend only yet (simulate and search model it)");
  // The training step does not run these yet; a prediction would be compared with another run.
  if (c.sequence_parallel && backend == Backend::cuda)
    throw InputError("--sequence-parallel: validate runs sequence parallelism on the CPU backend only yet (simulate and search model it)");
  if (c.recompute == Recompute::selective && c.recompute_modules != kRecomputeCoreAttn)
    throw InputError("--recompute-modules " + recompute_modules_text(c.recompute_modules) +
                     ": validate runs selective recompute of core_attn only yet (simulate and search model the others)");
  if (in.model.dtype == Dtype::fp8)
    throw InputError("--dtype fp8: validate cannot run FP8 training yet (simulate and search model it)");
  if (c.adam_moments != Dtype::fp32)
    throw InputError("--adam-moments bf16: validate's training step keeps Adam's moments in fp32 (simulate and search "
                     "model bf16 moments)");
  if (c.cuda_graph_scopes != 0)
    throw InputError("--cuda-graph-scope " + cuda_graph_scopes_text(c.cuda_graph_scopes) +
                     ": validate's training step launches its kernels from C++, with no graphs to capture (simulate and "
                     "search price CUDA graphs on the host side)");
  if (c.moe_dispatcher == MoeDispatcher::flex)
    throw InputError("--moe-dispatcher flex: validate's training step dispatches as alltoall does, every token-expert "
                     "pair (simulate and search model flex)");
  if (const std::string why = model_the_step_cannot_run(in.model, c, backend); !why.empty())
    throw InputError("model '" + in.model.name + "': validate cannot run " + why +
                     " yet (simulate and search model it)");
  for (int p = 0; p < runtime::kPhaseCount; ++p)
    if (std::strcmp(runtime::phase_key(p), to_string(Phase(p))) != 0)
      throw RunError("validate: runtime phase " + std::string(runtime::phase_key(p)) + " does not match cost-model phase " +
                     to_string(Phase(p)));

  auto world = make_world_communicator(backend);
  const bool root = world->rank() == 0;
  if (o.calibrate) {
    const calibration::JobCalibration done =
        calibration::calibrate_job(*world, backend, in.model, o.in.model, in.topology, c, o.in.profile, 2, 10);
    in.profile = load_profile(o.in.profile, in.topology);
    adopt_measured_routing(in);
    if (root) {
      std::cout << "validate --calibrate: measured " << done.gemms << " GEMM, " << done.kernels << " kernel and "
                << done.collectives << " collective points, " << done.skews << " arrival-skew group shapes"
                << (done.routing_counted ? " and the step's routing" : "") << " into " << o.in.profile
                << (done.created ? " (new profile)" : "")
                << (done.unmeasurable ? "; " + std::to_string(done.unmeasurable) + " lookups this backend cannot measure" : "")
                << "\n";
      if (!done.routing_skipped.empty())
        std::cout << "validate --calibrate: routing not counted: " << done.routing_skipped << "\n";
    }
  }
  std::ostream& out = human_stream(o.in);
  if (root) {
    print_startup_table(out, in, o.in);
    out << "configuration: " << c.describe() << " (" << world->size() << " MPI ranks, backend " << to_string(backend)
        << ")\n";
  }
  const Evaluator evaluator(in.model, in.topology, *in.profile);
  TraceRecorder predicted_trace(o.kernel_times);  // the kernel table sums every micro-batch's ops
  const bool record_prediction = !o.trace_predicted.empty() || o.kernel_times;
  const Prediction pred = evaluator.evaluate(c, record_prediction ? &predicted_trace : nullptr);
  if (backend == Backend::cpu) {
    // The CPU step keeps every tensor in fp32: a model planned for a cluster would end in
    // bad_alloc (or the OOM killer) minutes in. Every rank decides alike, or some would wait for
    // the others in the step's first collective.
    const double need = pred.memory.peak * 4.0 / bytes_of(storage_dtype(in.model.dtype));
    const double have = host_memory_per_rank(world->size());
    std::vector<double> short_of{have > 0 && need > have ? 1.0 : 0.0};
    world->host_max(short_of);
    if (short_of[0] > 0)
      throw InputError("model '" + in.model.name + "' under " + c.describe() + ": the CPU step would hold about " +
                       fixed(need / 1073741824.0, 1) + " GiB per rank (the predicted peak, in fp32), more than the " +
                       (have > 0 ? fixed(have / 1073741824.0, 1) : std::string("?")) +
                       " GiB this host has free per rank: validate a smaller model (cpu-moe, cpu-moe-fine) or more ranks");
  }

  runtime::TrainerOptions topt;
  topt.record_slices = !o.trace.empty();
  topt.seed = o.seed;
  topt.data_file = o.data;
  topt.lr = o.lr;
  runtime::KernelCensus census;
  if (o.kernel_times) {
    census.fence_each_call = backend == Backend::cuda;
    topt.census = &census;
  }
  // The profile's sentinel GEMM again, right before the step and right after it: has the
  // machine's speed moved since the profile was measured? (Every rank: the timing is collective.)
  std::unique_ptr<calibration::MachineSpeedProbe> probe;
  if (!o.in.profile.empty()) probe = calibration::MachineSpeedProbe::for_profile(backend, load_profile_data(o.in.profile));
  if (probe) probe->time_now(*world);
  runtime::MeasuredRun run;
  try {
    run = runtime::measure_training(*world, in.model, c, topt, o.warmup, o.iters);
    if (probe) probe->time_now(*world);
  } catch (const RunError& e) {
    // One rank's failure (a non-finite step) would leave the others in their next collective:
    // say it here and end every rank.
    if (world->size() == 1) throw;
    std::cerr << "tedsim: error: " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, int(ExitCode::failure));
  }

  double far_share = -1;  // of the predicted iteration, on far extrapolations of a measured profile
  std::optional<std::pair<double, double>> spread;  // the prediction over the profile's spread
  if (root) {
    out << run.description << "\n"
        << "measured " << run.iterations << " iterations after " << run.warmup << " warm-up; iteration time is the "
        << "slowest rank's, phases are the mean over ranks (medians over iterations; predicted: the mean over "
        << "stages)\n";
    if (c.zero >= 3)
      out << "ZeRO-3: predicted as the step runs it, each layer's parameter all-gathers exposed and its gradient "
             "reduce-scatter blocking (simulate and search price them prefetched and overlapped)\n";
    out << "\n";
    TextTable table({"phase", "predicted ms", "measured ms", "error"});
    for (int p = 0; p < runtime::kPhaseCount; ++p)
      table.add_row({runtime::phase_key(p), ms(pred.sim.mean_exposed[p]), ms(run.phase_median[p]),
                     rel_error(pred.sim.mean_exposed[p], run.phase_median[p])});
    table.add_row({"iteration", ms(pred.sim.iteration_s), ms(run.iteration.median),
                   rel_error(pred.sim.iteration_s, run.iteration.median)});
    table.add_row({"memory MiB (tensors)", fixed(pred.memory.peak / 1048576.0, 2), fixed(run.tensor_peak_bytes / 1048576.0, 2),
                   rel_error(pred.memory.peak, run.tensor_peak_bytes)});
    table.print(out);
    print_profile_warnings(out, *in.profile);
    const std::optional<calibration::SpeedCheck> speed = probe ? probe->check() : std::nullopt;
    if (speed) print_machine_speed(out, *speed);
    far_share = print_far_lookup_share(out, in, c, pred.sim.iteration_s);
    spread = print_prediction_range(out, in, c, pred.sim.iteration_s);
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    print_profile_mismatches(out, in, o.in, JobIdentity{world->size(), to_string(backend), host});
    out << "iteration spread: min " << ms(run.iteration.min) << " ms, p10 " << ms(run.iteration.p10) << " ms, median "
        << ms(run.iteration.median) << " ms, p90 " << ms(run.iteration.p90) << " ms, max " << ms(run.iteration.max)
        << " ms\n";
    out << "memory measured: peak of the step's own tensors (fp32 weights"
        << (backend == Backend::cuda ? " and their bf16 copies" : "") << ", grads, Adam state, activations, buffers); "
        << "process max RSS " << fixed(run.max_rss_bytes / 1048576.0, 1) << " MiB\n";
    if (backend == Backend::cuda && bytes_of(in.model.dtype) < 4)
      out << "note: the CUDA step keeps fp32 tensors (GEMMs multiply in bf16 on tensor cores) and communicates fp32, "
          << "while the prediction assumes " << to_string(in.model.dtype)
          << " activations and messages: expect measured memory and collective times above the prediction\n";
    out << "loss: " << fixed(run.losses.front(), 4) << " (first step) -> " << fixed(run.losses.back(), 4) << " (last)\n";
    if (std::isfinite(run.held_out_before))
      out << "loss on a held-out batch (step " << run.held_out_batch + 1 << "'s samples, never trained on): "
          << fixed(run.held_out_before, 4) << " before the first step -> " << fixed(run.held_out_after, 4)
          << " after the last\n";
    if (run.held_out_after > run.held_out_before)
      out << "note: the model lost ground on the held-out batch. Adam without warm-up moves every weight by about "
          << "--lr (" << o.lr << ") a step, which wide and deep models do not take: try a lower --lr (gpu-moe, "
          << "12 layers of width 2048, learns at 1e-5 and not at 3e-5: reports/device/README.md)\n";
    // Dropless: the load imbalance the step saw beside the one the prediction assumed, and the
    // prediction again with the measured load. What sets the pace is the busiest expert rank's
    // rows; the prediction derives them from the busiest expert's (busiest_rank_load), so it is
    // re-run with the imbalance that gives the measured rank load.
    double measured_imbalance = 0, measured_rank_load = 0, repredicted_s = 0;
    const int ep = in.model.is_moe() ? c.ep : 1;
    const bool routing_measured = !in.model.moe.measured_shares.empty();
    const double assumed_rank_load = in.model.is_moe() && in.model.moe.dropless() ? resolve_shape(in.model, c).load_factor : 1.0;
    double measured_rank_load_mean = 0;
    if (!run.imbalance.empty()) {
      measured_imbalance = runtime::spread_of(run.imbalance).median;
      measured_rank_load = runtime::spread_of(run.rank_load).median;
      for (double x : run.rank_load) measured_rank_load_mean += x / double(run.rank_load.size());
      ModelSpec remodel = in.model;
      remodel.moe.measured_shares = {};  // the measured load alone
      remodel.moe.imbalance = ep > 1 ? imbalance_for_rank_load(in.model.moe.experts, ep, measured_rank_load)
                                     : std::max(1.0, measured_imbalance);
      const Evaluator reevaluator(remodel, in.topology, *in.profile);
      repredicted_s = reevaluator.evaluate(c).sim.iteration_s;
      out << "load imbalance (busiest expert / mean): measured " << fixed(measured_imbalance, 3) << " (median of "
          << run.imbalance.size() << " MoE layer passes on rank 0's expert group), assumed "
          << fixed(in.model.moe.imbalance, 3)
          << (routing_measured ? " (the mean over calibration's passes of the step's routing)" : "") << "\n";
      if (ep > 1)
        out << "busiest expert rank (its expert rows / the mean rank's): measured " << fixed(measured_rank_load, 3)
            << " (median; mean " << fixed(measured_rank_load_mean, 3) << "), assumed " << fixed(assumed_rank_load, 3)
            << (routing_measured ? " (the mean over calibration's passes of the step's routing)"
                                 : " (the busiest expert's rank, the others sharing the rest)")
            << "\n";
      out << "prediction with the measured load: " << ms(repredicted_s) << " ms per iteration, error "
          << rel_error(repredicted_s, run.iteration.median) << "\n";
    }
    const double err = run.iteration.median > 0 ? (pred.sim.iteration_s - run.iteration.median) / run.iteration.median : 0;
    if (std::fabs(err) <= o.tolerance)
      out << "verdict: prediction within " << fixed(100 * o.tolerance, 0) << "% of the measured iteration time\n";
    else
      out << "verdict: PREDICTION OFF by " << fixed(100 * err, 1) << "% (tolerance " << fixed(100 * o.tolerance, 0)
          << "%): the profile does not describe this machine well; calibrate it (tedsim calibrate) and pass --profile\n";

    if (o.kernel_times)
      print_kernel_times(out, census, double(run.iterations + run.warmup), predicted_trace,
                         build_workload(in.model, c, *in.profile, evaluator.spans_for(c)));
    const std::string title = in.model.name + " " + c.describe();
    if (!o.trace.empty()) {
      write_measured_trace(o.trace, run, title);
      out << "trace: " << o.trace << " (measured iteration " << run.traced_iteration << ", the one nearest the median, "
          << world->size() << " ranks; open in ui.perfetto.dev)\n";
    }
    if (!o.trace_predicted.empty()) {
      predicted_trace.write_chrome_trace(o.trace_predicted, title);
      out << "trace: " << o.trace_predicted << " (the prediction, " << predicted_trace.events().size() << " events)\n";
    }
    if (!o.in.json.empty() || !o.in.html.empty()) {
      nlohmann::json doc;
      doc["kind"] = "validate";
      PhaseTimes measured{};
      for (int p = 0; p < runtime::kPhaseCount; ++p) measured[p] = run.phase_median[p];
      nlohmann::json errors = nlohmann::json::object();
      for (int p = 0; p < runtime::kPhaseCount; ++p)
        errors[runtime::phase_key(p)] = rel_error_json(pred.sim.mean_exposed[p], run.phase_median[p]);
      errors["iteration"] = rel_error_json(pred.sim.iteration_s, run.iteration.median);
      errors["memory"] = rel_error_json(pred.memory.peak, run.tensor_peak_bytes);
      doc["predicted"] = {{"iteration_time_s", pred.sim.iteration_s},
                          {"iteration_time_s_range", spread ? nlohmann::json{spread->first, spread->second} : nlohmann::json()},
                          // Like the measured phases, the mean over ranks (stages).
                          {"breakdown_s", phase_times_json(pred.sim.mean_exposed)},
                          {"critical_stage_breakdown_s", phase_times_json(pred.sim.exposed)},
                          {"memory_peak_bytes", pred.memory.peak}};
      doc["measured"] = {{"iteration_time_s", run.iteration.median},
                         {"breakdown_s", phase_times_json(measured)},
                         {"spread",
                          {{"min", run.iteration.min},
                           {"p10", run.iteration.p10},
                           {"median", run.iteration.median},
                           {"p90", run.iteration.p90},
                           {"max", run.iteration.max},
                           {"iterations", run.iterations},
                           {"warmup", run.warmup},
                           {"iteration_times_s", run.iteration_s}}},
                         {"memory_peak_bytes", run.tensor_peak_bytes},
                         {"memory_method", "peak bytes of the step's tensors (tracking allocator), max over ranks"},
                         {"max_rss_bytes", run.max_rss_bytes}};
      doc["error"] = errors;
      if (!run.imbalance.empty())
        doc["imbalance"] = {{"assumed", in.model.moe.imbalance},
                            {"measured_median", measured_imbalance},
                            {"samples", run.imbalance.size()},
                            {"assumed_from", routing_measured ? "calibration" : "model"},
                            {"rank_load_assumed", assumed_rank_load},
                            {"rank_load_measured_median", measured_rank_load},
                            {"rank_load_measured_mean", measured_rank_load_mean},
                            {"iteration_time_s_with_measured", repredicted_s},
                            {"error_with_measured", rel_error_json(repredicted_s, run.iteration.median)}};
      doc["config"] = config_json(c, in.model);
      doc["losses"] = run.losses;
      if (std::isfinite(run.held_out_before))
        doc["held_out_loss"] = {{"batch", run.held_out_batch + 1},
                                {"before", run.held_out_before},
                                {"after", run.held_out_after}};
      doc["model"] = in.model.name;
      doc["topology"] = in.topology.name;
      doc["profile"] = in.profile->describe();
      if (far_share >= 0) doc["profile_far_share"] = far_share;
      if (speed)
        doc["machine_speed"] = {{"gemm", {speed->gemm.m, speed->gemm.n, speed->gemm.k, speed->gemm.batch}},
                                {"calibrated_s", speed->calibrated_s},
                                {"now_s", speed->now_s},
                                {"change", speed->change()}};
      doc["backend"] = to_string(backend);
      doc["ranks"] = world->size();
      if (!o.in.json.empty()) write_json(o.in.json, doc);
      if (!o.in.html.empty()) write_html_result(o.in.html, doc, "tedsim validate", out);
    }
  }
  world->barrier();
  return 0;
}

}  // namespace

void register_validate(CLI::App& app, Action& action) {
  auto o = std::make_shared<ValidateOptions>();
  o->in.model = "tiny-moe";
  o->in.topology = "local-cpu";
  o->in.global_batch = 8;
  CLI::App* cmd = app.add_subcommand(
      "validate", "run the real training step for one configuration under MPI and compare it with the prediction");
  add_input_options(*cmd, o->in);
  CLI::Option* gpus = cmd->get_option("--gpus");
  gpus->default_str("the MPI world size");
  gpus->description("devices, one MPI rank each");
  cmd->add_option("--config", o->config, "validation config YAML (model, topology, gpus, tp, ep, micro_batch, ...)");
  add_config_options(*cmd, o->knobs);
  cmd->add_option("--backend", o->backend,
                  "cpu (fp32, Eigen, MPI) or cuda (fp32 tensors, bf16 tensor-core GEMMs, NCCL; one rank per GPU)")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "warm-up iterations (not timed)")->capture_default_str();
  cmd->add_option("--iters", o->iters, "measured iterations")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the parameters and the synthetic data")->capture_default_str();
  cmd->add_option("--data", o->data, "token file (int32 .bin or whitespace-separated ids); default: synthetic");
  cmd->add_option("--lr", o->lr,
                  "Adam learning rate, without warm-up: the timing does not depend on it, the held-out loss does "
                  "(wide, deep models need less: gpu-moe learns at 1e-5)")
      ->capture_default_str();
  cmd->add_option("--tolerance", o->tolerance, "relative error the verdict accepts")->capture_default_str();
  cmd->add_flag("--calibrate", o->calibrate,
                "before running, measure every point the prediction needs that --profile FILE lacks (on this world's "
                "own groups) and add them to FILE");
  cmd->add_option("--trace", o->trace,
                  "write the measured iteration (nearest the median) as a Chrome/Perfetto trace: a process per rank");
  cmd->add_option("--trace-predicted", o->trace_predicted,
                  "write the prediction of the same configuration as a trace with the same slice names");
  cmd->add_flag("--kernel-times", o->kernel_times,
                "time every kernel call of the step on rank 0 and print each kind's time per iteration beside the "
                "prediction's (CUDA: each call fenced, which slows the measured iteration)");
  add_watchdog_options(*cmd, o->watchdog);
  cmd->callback([o, cmd, &action] { action = [o, cmd] { return run_validate(*o, cmd); }; });
}

}  // namespace tedsim::cli
