#pragma once
// Chrome / Perfetto trace of a simulated iteration (the JSON "traceEvents" format: complete events
// with microsecond timestamps, a process per pipeline stage, a thread per stream).
#include <string>
#include <vector>

#include "tedsim/model/phase.hpp"

namespace tedsim {

enum class Stream { compute = 0, data_parallel = 1, p2p = 2 };

struct TraceEvent {
  std::string name;
  std::string context;  // "microbatch 0 forward layer 3 (moe)"
  Phase phase;
  Stream stream;
  double start_s, duration_s;
  int stage = 0;  // pipeline stage: the trace's process
};

class TraceRecorder {
 public:
  void add(TraceEvent event) { events_.push_back(std::move(event)); }
  // Names the process of `stage` ("stage 1: layers 8-15").
  void name_stage(int stage, std::string name);
  const std::vector<TraceEvent>& events() const { return events_; }
  // Writes the trace atomically; throws RunError if the file cannot be written.
  void write_chrome_trace(const std::string& path, const std::string& title) const;

 private:
  std::vector<TraceEvent> events_;
  std::vector<std::string> stage_names_;
};

}  // namespace tedsim
