#include "tedsim/comm/mpi_session.hpp"

#include <mpi.h>

#include "tedsim/core/error.hpp"

namespace tedsim {

MpiSession::MpiSession(std::optional<WatchdogOptions> watchdog) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    const int wanted = watchdog && watchdog->timeout_s > 0 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, wanted, &provided) != MPI_SUCCESS)
      throw RunError("MPI_Init failed (run under mpirun, or as a single process)");
    owner_ = true;
  }
  if (watchdog) {
    try {
      watchdog::start(*watchdog);
    } catch (...) {
      if (owner_) MPI_Finalize();
      throw;
    }
  }
}

MpiSession::~MpiSession() {
  watchdog::stop();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owner_ && !finalized) MPI_Finalize();
}

}  // namespace tedsim
