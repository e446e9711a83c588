#pragma once
// MPI for the duration of a command: commands that need ranks (calibrate, validate) initialise MPI
// themselves, so the planning commands run without mpirun. Initialises only if nobody has, and
// finalises only what it initialised. With a watchdog (watchdog.hpp) it asks for
// MPI_THREAD_MULTIPLE, which the watchdog's census needs, and runs the watchdog until it ends.
#include <optional>

#include "tedsim/comm/watchdog.hpp"

namespace tedsim {

class MpiSession {
 public:
  // Throws RunError if MPI cannot start, InputError for a fault naming a rank the job lacks.
  explicit MpiSession(std::optional<WatchdogOptions> watchdog = std::nullopt);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owner_ = false;
};

}  // namespace tedsim
