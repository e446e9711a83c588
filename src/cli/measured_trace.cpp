#include "measured_trace.hpp"

#include <nlohmann/json.hpp>

#include "tedsim/core/atomic_file.hpp"

namespace tedsim::cli {

void write_measured_trace(const std::string& path, const runtime::MeasuredRun& run, const std::string& title) {
  nlohmann::json events = nlohmann::json::array();
  for (std::size_t r = 0; r < run.rank_slices.size(); ++r) {
    const int pid = int(r);
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid},
                      {"args", {{"name", title + " | rank " + std::to_string(r) + " (measured iteration " +
                                             std::to_string(run.traced_iteration) + ")"}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "training step"}}}});
    for (const runtime::StepSlice& s : run.rank_slices[r])
      events.push_back({{"name", s.name},
                        {"cat", runtime::phase_key(s.phase)},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", 0},
                        {"ts", s.start_s * 1e6},
                        {"dur", (s.end_s - s.start_s) * 1e6},
                        {"args", {{"phase", runtime::phase_key(s.phase)}}}});
  }
  const nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  write_file_atomically(path, doc.dump() + "\n");
}

}  // namespace tedsim::cli
