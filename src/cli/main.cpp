// tedsim: plan Mixture-of-Experts training under tensor-expert-data parallelism.
// main() is the only place errors become messages and exit codes: 2 for bad input, 1 for failures.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "commands.hpp"
#if TEDSIM_CALIBRATION_AVAILABLE
#include "calibration_commands.hpp"
#endif
#if TEDSIM_RUNTIME_AVAILABLE
#include "validate_command.hpp"
#endif
#include "tedsim/core/build_info.hpp"
#include "tedsim/core/error.hpp"

namespace {

// Under mpirun/srun every rank sees the same bad input; one message is enough. Failures of the
// run itself stay on every rank (they can differ per host and rank).
bool is_secondary_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* value = std::getenv(var); value && std::atoi(value) > 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tedsim;
  CLI::App app{"tedsim: plan MoE training under tensor-expert-data parallelism"};
  app.set_version_flag("--version", std::string("tedsim ") + build_info::version);
  app.require_subcommand(1);
  cli::Action action;
  cli::register_simulate(app, action);
  cli::register_search(app, action);
  cli::register_model(app, action);
  cli::register_scale(app, action);
  cli::register_report(app, action);
#if TEDSIM_CALIBRATION_AVAILABLE
  cli::register_calibrate(app, action);
  cli::register_profile(app, action);
#endif
#if TEDSIM_RUNTIME_AVAILABLE
  cli::register_validate(app, action);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : int(ExitCode::bad_input);
  }
  try {
    return action ? action() : 0;
  } catch (const Error& e) {
    if (e.code() != ExitCode::bad_input || !is_secondary_rank()) std::cerr << "tedsim: error: " << e.what() << std::endl;
    return int(e.code());
  } catch (const std::exception& e) {
    std::cerr << "tedsim: internal error: " << e.what() << std::endl;
    return int(ExitCode::failure);
  }
}
