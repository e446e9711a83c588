// tedsim calibrate: measure GEMMs, kernels and collectives on this cluster and write a profile.
// MPI is initialised here, only when the command runs, so every other command runs without mpirun.
#include <memory>
#include <optional>
#include <string>

#include "calibration_commands.hpp"
#include "tedsim/core/error.hpp"

#if TEDSIM_CALIBRATION_AVAILABLE

#include "tedsim/calibration/calibrate.hpp"
#include "tedsim/comm/communicator.hpp"
#include "tedsim/comm/mpi_session.hpp"
#include "tedsim/kernels/device.hpp"
#include "tedsim/spec/data_files.hpp"
#include "watchdog_options.hpp"
#endif

namespace tedsim::cli {

#if TEDSIM_CALIBRATION_AVAILABLE
namespace {

struct CalibrateOptions {
  std::string backend = "cpu", model = "tiny-moe", topology = "local-cpu", out;
  int gpus = 0, global_batch = 0, seq = 0, reps = 0, stop_after = 0;
  std::optional<int> warmup;  // unset: 2, or 1 with --quick
  bool quick = false, grid = false;
  std::int64_t min_bytes = 0, max_bytes = 0;
  double step_factor = 0;
  WatchdogCliOptions watchdog;
};


int run_calibrate(const CalibrateOptions& o) {
  calibration::CalibrationOptions c;
  c.backend = parse_backend(o.backend);
  // No device: say so before touching MPI or the CUDA runtime any further.
  if (c.backend == Backend::cuda && kernels::cuda_device_count() <= 0)
  {
    std::string why = kernels::describe_cuda_unavailable();
    if (why.rfind("no CUDA device", 0) != 0) why = "no CUDA device: " + why;
    throw RunError(why + " (use --backend cpu)");
  }
  if (o.out.empty()) throw InputError("--out: the profile file to write is required");
  if (o.gpus < 0) throw InputError("--gpus: expected a positive device count");
  if (o.reps < 0) throw InputError("--reps: expected a positive count");
  if (o.warmup && *o.warmup < 0) throw InputError("--warmup: expected a count >= 0, got " + std::to_string(*o.warmup));
  if (o.global_batch < 0) throw InputError("--global-batch: expected a positive count, got " + std::to_string(o.global_batch));
  if (o.seq < 0) throw InputError("--seq: expected a positive length, got " + std::to_string(o.seq));
  if (o.stop_after < 0) throw InputError("--stop-after: expected a count >= 0, got " + std::to_string(o.stop_after));
  if (o.min_bytes < 0 || o.max_bytes < 0) throw InputError("--min-bytes/--max-bytes: expected positive sizes");
  if (o.step_factor != 0 && o.step_factor <= 1) throw InputError("--step-factor: expected a factor > 1");
  c.model_name = o.model;
  c.topology_name = o.topology;
  c.model = load_model(resolve_data_file("models", o.model));
  c.topology = load_topology(resolve_data_file("topologies", o.topology));
  if (c.model.dtype == Dtype::fp8 && c.backend == Backend::cpu)
    throw InputError("model '" + c.model.name + "' trains in fp8: the CPU backend has no FP8 GEMMs; calibrate on a GPU "
                     "with FP8 tensor cores (--backend cuda, compute capability 8.9+) or predict fp8 with the analytic "
                     "profile");
  if (std::string why; c.model.dtype == Dtype::fp8 && !kernels::cuda_fp8_gemm_supported(&why))
    throw InputError("model '" + c.model.name + "' trains in fp8: " + why);
  c.gpus = o.gpus;
  c.global_batch = o.global_batch;
  c.seq_len = o.seq;
  c.quick = o.quick;
  c.grid = o.grid;
  c.min_bytes = o.min_bytes;
  c.max_bytes = o.max_bytes;
  c.step_factor = o.step_factor;
  c.reps = o.reps;
  c.warmup = o.warmup.value_or(-1);
  c.out = o.out;
  c.stop_after = o.stop_after;
  MpiSession mpi(watchdog_options(o.watchdog));
  return calibration::run_calibration(c);
}

}  // namespace

void register_calibrate(CLI::App& app, Action& action) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* cmd = app.add_subcommand("calibrate",
                                     "measure GEMMs, kernels and collectives over TED groups (under mpirun) and write a profile");
  cmd->add_option("--backend", o->backend, "cpu (Eigen, MPI) or cuda (cuBLAS, CUDA kernels, NCCL)")->capture_default_str();
  cmd->add_option("--model", o->model, "shipped model name or path: the shapes to measure")->capture_default_str();
  cmd->add_option("--topology", o->topology, "shipped topology name or path: fallback for anything not measured")->capture_default_str();
  cmd->add_option("--gpus", o->gpus, "cluster size the GEMM/kernel shapes are derived for (default: MPI world size)");
  cmd->add_option("--global-batch", o->global_batch, "sequences per iteration (default: 8 per device)");
  cmd->add_option("--seq", o->seq, "sequence length (default: the model's)");
  cmd->add_flag("--quick", o->quick, "the same shapes and sizes, fewer repetitions (collectives up to twice the model's largest message)");
  cmd->add_flag("--grid", o->grid, "measure a generic grid of GEMM shapes and kernel sizes instead of the model's (collectives still follow the TED groups of this world)");
  cmd->add_option("--out", o->out, "profile file to write (JSON); progress is kept in FILE.partial")->required();
  cmd->add_option("--min-bytes", o->min_bytes, "smallest collective size (default 1024)");
  cmd->add_option("--max-bytes", o->max_bytes, "largest collective size (default 64 MiB; quick: twice the model's largest message)");
  cmd->add_option("--step-factor", o->step_factor, "collective size multiplier per step (default 2)");
  cmd->add_option("--reps", o->reps, "timed repetitions per point (default 20, quick 5)");
  cmd->add_option("--warmup", o->warmup, "untimed repetitions first (default 2, quick 1)");
  add_watchdog_options(*cmd, o->watchdog);
  cmd->add_option("--stop-after", o->stop_after, "testing: stop after N points (resume by re-running)")->group("");
  cmd->callback([o, &action] { action = [o] { return run_calibrate(*o); }; });
}

#else

void register_calibrate(CLI::App& app, Action& action) {
  CLI::App* cmd = app.add_subcommand("calibrate", "measure kernels and collectives (not in this build)");
  cmd->allow_extras();
  cmd->callback([&action] {
    action = [] () -> int { throw RunError("calibrate: this tedsim was built without tedsim_calibration"); };
  });
}

#endif

}  // namespace tedsim::cli
