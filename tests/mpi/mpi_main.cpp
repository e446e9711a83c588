// main() for tedsim_mpi_tests, run under real mpirun by ctest. Every rank runs every test (the
// collectives need all of them); only rank 0 prints the GoogleTest report, other ranks print just
// their failures, tagged with host and rank. The exit status is agreed by all ranks: a failure on
// any rank fails the run everywhere, so mpirun and ctest see it whichever rank it was.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "mpi_world.hpp"

namespace tedsim::test {

namespace {
std::unique_ptr<Communicator> g_world;
}

Communicator& world() { return *g_world; }

}  // namespace tedsim::test

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) { gethostname(host_, sizeof host_ - 1); }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[host %s rank %d] %s:%d: Failure\n%s\n", host_, rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
  char host_[256] = {};
};

// Every rank runs the same tests in the same order, so each test's end is a safe point to agree:
// rank 0 then names a test that failed elsewhere even where it passed locally.
class FailureAgreement : public ::testing::EmptyTestEventListener {
 public:
  FailureAgreement(int rank, int size) : rank_(rank), size_(size) {}
  void OnTestEnd(const ::testing::TestInfo& info) override {
    int failed = info.result()->Failed() ? 1 : 0, total = 0;
    MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank_ == 0 && total > 0)
      std::printf("[  FAILED  ] %s.%s failed on %d of %d ranks\n", info.test_suite_name(),
                  info.name(), total, size_);
  }

 private:
  int rank_, size_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  listeners.Append(new FailureAgreement(rank, size));
  int failed = 0;
  {
    tedsim::test::g_world = tedsim::make_world_communicator(tedsim::Backend::cpu);
    failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    tedsim::test::g_world.reset();
  }
  int failed_ranks = 0;
  MPI_Allreduce(&failed, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    std::printf("tedsim_mpi_tests: %d ranks, %d failed\n", size, failed_ranks);
  MPI_Finalize();
  return failed_ranks ? 1 : 0;
}
