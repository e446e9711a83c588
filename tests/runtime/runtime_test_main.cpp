// main() for the runtime tests, run under real mpirun by ctest (1 rank for the gradient check and
// the loss test, 2/4/8 ranks for parallel equivalence). Every rank runs every selected test; a
// failure on any rank fails the run on all of them (and rank 0 names it).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <memory>

#include "runtime_test_world.hpp"

namespace tedsim::test {
namespace {
std::unique_ptr<Communicator> g_world;
}
Communicator& runtime_world() { return *g_world; }
}  // namespace tedsim::test

namespace {
class FailureAgreement : public ::testing::EmptyTestEventListener {
 public:
  explicit FailureAgreement(int rank) : rank_(rank) {}
  void OnTestEnd(const ::testing::TestInfo& info) override {
    int failed = info.result()->Failed() ? 1 : 0, total = 0;
    MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank_ == 0 && total > 0)
      std::printf("[  FAILED  ] %s.%s failed on %d ranks\n", info.test_suite_name(), info.name(), total);
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new FailureAgreement(rank));
  int failed = 0;
  {
    tedsim::test::g_world = tedsim::make_world_communicator(tedsim::Backend::cpu);
    failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    tedsim::test::g_world.reset();
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
