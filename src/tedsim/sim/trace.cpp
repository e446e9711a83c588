#include "tedsim/sim/trace.hpp"

#include <nlohmann/json.hpp>

#include "tedsim/core/atomic_file.hpp"

namespace tedsim {

void TraceRecorder::write_chrome_trace(const std::string& path, const std::string& title) const {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", title}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "compute stream"}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", 1}, {"args", {{"name", "data-parallel stream"}}}});
  for (const TraceEvent& e : events_) {
    events.push_back({{"name", e.name},
                      {"cat", to_string(e.phase)},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", int(e.stream)},
                      {"ts", e.start_s * 1e6},
                      {"dur", e.duration_s * 1e6},
                      {"args", {{"where", e.context}, {"phase", to_string(e.phase)}}}});
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  write_file_atomically(path, doc.dump() + "\n");
}

}  // namespace tedsim
