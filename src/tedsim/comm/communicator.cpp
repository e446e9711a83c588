#include "tedsim/comm/communicator.hpp"

#include <mpi.h>
#include <unistd.h>

#include "tedsim/core/error.hpp"

namespace tedsim {

const char* to_string(Backend backend) { return backend == Backend::cpu ? "cpu" : "cuda"; }

Backend parse_backend(const std::string& text) {
  if (text == "cpu") return Backend::cpu;
  if (text == "cuda") return Backend::cuda;
  throw InputError("unknown backend '" + text + "' (expected cpu or cuda)");
}

const char* to_string(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "max"; }

namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

int world_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rank = -1;
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

std::string process_location() {
  static const std::string host = host_name();
  return "host " + host + " world rank " + std::to_string(world_rank());
}

std::string Communicator::where() const {
  // Host and world rank locate the process in a shared log; the group rank says which member of
  // which group it was.
  return process_location() + ", " + name() +
         " rank " + std::to_string(rank()) + "/" + std::to_string(size()) + " (" +
         backend_name() + ")";
}

}  // namespace tedsim
