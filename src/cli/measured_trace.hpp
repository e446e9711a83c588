#pragma once
// validate --trace: the measured iteration as a Chrome / Perfetto trace (the JSON "traceEvents"
// format the prediction's trace uses too): a process per rank, each timed region a slice named as
// the prediction names the same operation, and "compute" slices for the time between them.
#include <string>

#include "tedsim/runtime/measure.hpp"

namespace tedsim::cli {

// Writes the trace atomically; `title` names the run in each process name.
void write_measured_trace(const std::string& path, const runtime::MeasuredRun& run, const std::string& title);

}  // namespace tedsim::cli
