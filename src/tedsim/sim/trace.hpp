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
  TraceRecorder() = default;
  // every_microbatch: draw every micro-batch op by op (validate --kernel-times sums the ops of
  // the whole iteration); else the first ones and the last, the others one slice per pass, which
  // keeps a trace of many micro-batches readable.
  explicit TraceRecorder(bool every_microbatch) : every_microbatch_(every_microbatch) {}
  bool every_microbatch() const { return every_microbatch_; }
  void add(TraceEvent event) { events_.push_back(std::move(event)); }
  // Names the process of `stage` ("stage 1: layers 8-15").
  void name_stage(int stage, std::string name);
  const std::vector<TraceEvent>& events() const { return events_; }
  // Writes the trace atomically; throws RunError if the file cannot be written.
  void write_chrome_trace(const std::string& path, const std::string& title) const;

 private:
  std::vector<TraceEvent> events_;
  bool every_microbatch_ = false;
  std::vector<std::string> stage_names_;
};

}  // namespace tedsim
