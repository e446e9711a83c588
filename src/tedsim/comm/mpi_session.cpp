#include "tedsim/comm/mpi_session.hpp"

#include <mpi.h>

#include "tedsim/core/error.hpp"

namespace tedsim {

MpiSession::MpiSession() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw RunError("MPI_Init failed (run under mpirun, or as a single process)");
  owner_ = true;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owner_ && !finalized) MPI_Finalize();
}

}  // namespace tedsim
