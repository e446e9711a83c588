#include "tedsim/comm/mpi_session.hpp"

#include <mpi.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "tedsim/core/error.hpp"

namespace tedsim {
namespace {

// Large blocks mapped anew, whatever the process freed before. glibc serves a block above its
// mmap threshold with mmap and unmaps it on free, but raises that threshold to the size of what
// the process frees, after which such blocks come from its heap instead. MPI's collectives
// allocate a temporary buffer per call (a reduce-scatter's reduction buffer), so the cost of each
// call depended on the process's history: on a 2-rank shared-memory reduce-scatter of 8 MiB,
// 2.1 ms with the buffer from the heap, 3.5-4.2 ms mapped anew each call; a calibration that had
// freed large blocks before measured the first, the training step the second. Pinning glibc's
// default threshold (128 KiB) makes both map anew, as a fresh process does; the step's own
// tensors, allocated once, stay where a fresh process puts them (with them in the heap, its Adam
// step ran 35% slower).
void pin_allocator_policy() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
}

}  // namespace

MpiSession::MpiSession(std::optional<WatchdogOptions> watchdog) {
  pin_allocator_policy();
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
