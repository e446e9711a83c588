// make_world_communicator: the one place that decides which backend a run gets.
#include <mpi.h>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/comm/cuda_device.hpp"
#include "tedsim/comm/mpi_communicator.hpp"
#include "tedsim/core/error.hpp"
#if TEDSIM_COMM_HAVE_NCCL
#include "tedsim/comm/nccl_communicator.hpp"
#endif

namespace tedsim {

namespace {

// Rank among the processes on this node: devices are shared out by it.
int local_rank(const MpiCommunicator& world) {
  MPI_Comm node = MPI_COMM_NULL;
  world.check(MPI_Comm_split_type(world.handle(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL,
                                  &node),
              "MPI_Comm_split_type (node-local ranks)");
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_free(&node);
  return rank;
}

}  // namespace

std::unique_ptr<Communicator> make_world_communicator(Backend backend) {
  auto world = MpiCommunicator::world();
  if (backend == Backend::cpu) return world;
  // Device selection comes first and fails on every rank alike when there is no device, so no
  // rank is left waiting in the NCCL bootstrap.
  select_cuda_device(local_rank(*world), world->where());
#if TEDSIM_COMM_HAVE_NCCL
  return std::make_unique<NcclCommunicator>(std::move(world));
#else
  throw RunError(world->where() + ": the cuda backend needs NCCL, and tedsim was built without it");
#endif
}

}  // namespace tedsim
