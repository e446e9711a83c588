#pragma once
// Each subcommand registers its options and returns the action main() runs after parsing, so
// errors from every command meet one handler and one set of exit codes.
#include <CLI/CLI.hpp>
#include <functional>

namespace tedsim::cli {

using Action = std::function<int()>;

void register_simulate(CLI::App& app, Action& action);
void register_search(CLI::App& app, Action& action);
void register_model(CLI::App& app, Action& action);
void register_scale(CLI::App& app, Action& action);
void register_report(CLI::App& app, Action& action);

}  // namespace tedsim::cli
