// tedsim: plan Mixture-of-Experts training under tensor-expert-data parallelism.
#include <CLI/CLI.hpp>
#include <iostream>

#include "tedsim/core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"tedsim: plan MoE training under tensor-expert-data parallelism"};
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return 0;
}
