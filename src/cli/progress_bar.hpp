#pragma once
// A progress bar for long runs on a terminal: shown once a run has taken a second, with its rate
// and the time left; silent when stdout or stderr is not a terminal (logs, pipes, CI).
#include <chrono>
#include <string>

namespace tedsim::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string what);
  ~ProgressBar();  // clears the bar's line
  void update(long long done, long long total);

 private:
  std::string what_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace tedsim::cli
