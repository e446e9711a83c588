// The cuda backend on a machine without a usable device must fail with a clear RunError, on
// every rank alike, not crash in the CUDA runtime. With devices (one per rank) it runs the NCCL
// collectives through the same checker instead. Compiled only when CUDA is found.
#include <gtest/gtest.h>

#include <string>

#include "mpi_world.hpp"
#include "tedsim/comm/collective_check.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim {
namespace {

TEST(CudaBackend, NoDeviceGivesClearRunError) {
  std::string why;
  if (cuda_device_count(&why) > 0) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_world_communicator(Backend::cuda);
    ADD_FAILURE() << "expected RunError";
  } catch (const RunError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
    EXPECT_NE(msg.find("world rank " + std::to_string(test::world().rank())), std::string::npos)
        << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
  }
}

TEST(CudaBackend, NcclCollectivesAreCorrect) {
  Communicator& w = test::world();
  // One device per rank on this node: NCCL refuses two ranks on one GPU. Every rank sees the
  // same count on a one-node run, so all skip or none does.
  if (cuda_device_count() < w.size()) GTEST_SKIP() << "needs one CUDA device per rank";
  auto nccl = make_world_communicator(Backend::cuda);
  EXPECT_STREQ(nccl->backend_name(), "nccl");
  for (CollectiveOp op : {CollectiveOp::all_reduce, CollectiveOp::all_gather, CollectiveOp::reduce_scatter,
                          CollectiveOp::all_to_all, CollectiveOp::send_recv})
    for (Dtype dtype : {Dtype::fp32, Dtype::fp16, Dtype::bf16}) {
      CollectiveCase c;
      c.op = op;
      c.dtype = dtype;
      c.count = 1 << 20;
      const CollectiveResult r = check_and_time(*nccl, c);
      EXPECT_EQ(r.wrong, 0) << to_string(op) << " " << to_string(dtype);
      if (w.rank() == 0) std::printf("%s", format_nccl_table({r}).c_str());
    }
}

}  // namespace
}  // namespace tedsim
