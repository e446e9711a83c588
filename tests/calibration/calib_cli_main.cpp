// Test driver: `calibrate` and `profile` with main()'s error handling (exit 2 bad input, 1 failure).
#include <CLI/CLI.hpp>
#include <iostream>

#include "calibration_commands.hpp"
#include "tedsim/core/error.hpp"

int main(int argc, char** argv) {
  using namespace tedsim;
  CLI::App app{"tedsim calibration commands (test driver)"};
  app.require_subcommand(1);
  cli::Action action;
  cli::register_calibrate(app, action);
  cli::register_profile(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : int(ExitCode::bad_input);
  }
  try {
    return action ? action() : 0;
  } catch (const Error& e) {
    std::cerr << "tedsim: error: " << e.what() << std::endl;
    return int(e.code());
  } catch (const std::exception& e) {
    std::cerr << "tedsim: internal error: " << e.what() << std::endl;
    return int(ExitCode::failure);
  }
}
