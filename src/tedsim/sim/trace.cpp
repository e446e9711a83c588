#include "tedsim/sim/trace.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "tedsim/core/atomic_file.hpp"

namespace tedsim {

void TraceRecorder::name_stage(int stage, std::string name) {
  if (stage_names_.size() <= std::size_t(stage)) stage_names_.resize(std::size_t(stage) + 1);
  stage_names_[std::size_t(stage)] = std::move(name);
}

void TraceRecorder::write_chrome_trace(const std::string& path, const std::string& title) const {
  nlohmann::json events = nlohmann::json::array();
  const std::size_t stages = std::max<std::size_t>(stage_names_.size(), 1);
  for (std::size_t p = 0; p < stages; ++p) {
    const int pid = int(p);
    const std::string name = p < stage_names_.size() && !stage_names_[p].empty() ? title + " | " + stage_names_[p] : title;
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "compute stream"}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "data-parallel stream"}}}});
    if (stages > 1)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 2}, {"args", {{"name", "p2p sends"}}}});
  }
  for (const TraceEvent& e : events_) {
    events.push_back({{"name", e.name},
                      {"cat", to_string(e.phase)},
                      {"ph", "X"},
                      {"pid", e.stage},
                      {"tid", int(e.stream)},
                      {"ts", e.start_s * 1e6},
                      {"dur", e.duration_s * 1e6},
                      {"args", {{"where", e.context}, {"phase", to_string(e.phase)}}}});
  }
  nlohmann::json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  write_file_atomically(path, doc.dump() + "\n");
}

}  // namespace tedsim
