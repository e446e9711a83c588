#pragma once
// Commands that work with measured profiles: `tedsim calibrate` (needs tedsim_calibration: MPI,
// kernels, communicators) and `tedsim profile show|diff` (cost model only). Same pattern as
// commands.hpp: each registers its options and sets the action main() runs.
#include <CLI/CLI.hpp>
#include <functional>

namespace tedsim::cli {

using Action = std::function<int()>;

void register_calibrate(CLI::App& app, Action& action);
void register_profile(CLI::App& app, Action& action);
// `tedsim profile collective` (cmd_profile_collective.cpp), under the profile command.
void register_profile_collective(CLI::App& profile_cmd, Action& action);

}  // namespace tedsim::cli
