#pragma once
// --timeout and --inject-fault, shared by the commands that run ranks (calibrate, validate).
// Header-only: included only where the comm library is linked.
#include <CLI/CLI.hpp>
#include <string>

#include "tedsim/comm/fault_injection.hpp"
#include "tedsim/comm/watchdog.hpp"

namespace tedsim::cli {

struct WatchdogCliOptions {
  double timeout_s = kDefaultCollectiveTimeoutS;
  std::string inject_fault;
};

inline void add_watchdog_options(CLI::App& cmd, WatchdogCliOptions& o) {
  cmd.add_option("--timeout", o.timeout_s,
                 "seconds any collective or point-to-point call may take before every rank is ended with a message "
                 "naming the call, its group and the ranks that did not arrive (exit code 1); 0: no watchdog")
      ->capture_default_str();
  cmd.add_option("--inject-fault", o.inject_fault,
                 "testing aid: hang:RANK[:STEP] makes world rank RANK hang outside any collective at step STEP "
                 "(default 1), exit:RANK[:STEP] makes it exit as a crash would")
      ->group("Testing aids");
}

// Throws InputError for a malformed fault or a negative timeout.
inline WatchdogOptions watchdog_options(const WatchdogCliOptions& o) {
  if (!(o.timeout_s >= 0)) throw InputError("--timeout: expected seconds >= 0 (0: no watchdog)");
  WatchdogOptions w;
  w.timeout_s = o.timeout_s;
  if (!o.inject_fault.empty()) w.fault = parse_fault_injection(o.inject_fault);
  return w;
}

}  // namespace tedsim::cli
