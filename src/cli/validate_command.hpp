#pragma once
// tedsim validate: run the real TED training step for one configuration under MPI and compare the
// measured iteration time (per phase) and memory with the cost model's prediction.
//
// Wiring (main.cpp):
//   #ifdef TEDSIM_RUNTIME_AVAILABLE
//   #include "validate_command.hpp"
//   #endif
//   ...
//   #ifdef TEDSIM_RUNTIME_AVAILABLE
//   cli::register_validate(app, action);
//   #endif
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "commands.hpp"

namespace tedsim::cli {

void register_validate(CLI::App& app, Action& action);

}  // namespace tedsim::cli
