#pragma once
// The world communicator the MPI tests share: made once in main() after MPI_Init and destroyed
// before MPI_Finalize (freeing an MPI communicator after finalize is an error).
#include "tedsim/comm/communicator.hpp"

namespace tedsim::test {

Communicator& world();

}  // namespace tedsim::test
