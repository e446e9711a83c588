// The CLI's argument parsing (simulate, search, model show, scale, report): the input, split at newlines, is the
// argument list; parsing runs every option's checks and callbacks, but no command runs.
#include <CLI/CLI.hpp>

#include <vector>

#include "commands.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tedsim;
  std::vector<std::string> args{"tedsim"};
  std::string current;
  for (std::size_t i = 0; i < size && args.size() < 64; ++i) {
    const char c = char(data[i]);
    if (c == '\n') {
      args.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) args.push_back(current);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  // One app for the whole run, cleared between inputs as CLI11 allows (building it anew costs
  // more than parsing).
  static cli::Action action;
  static CLI::App& app = [] () -> CLI::App& {
    static CLI::App a{"tedsim"};
    a.require_subcommand(1);
    cli::register_simulate(a, action);
    cli::register_search(a, action);
    cli::register_model(a, action);
    cli::register_scale(a, action);
    cli::register_report(a, action);
    return a;
  }();
  app.clear();
  fuzz::expect_only_input_errors([&] {
    try {
      app.parse(int(argv.size()), argv.data());
    } catch (const CLI::ParseError&) {
      // CLI11's answer to a bad command line: main() prints it and exits 2.
    }
  });
  return 0;
}
