// The CUDA training step against the CPU one (registered only where a GPU is present; skips
// without one). Same model, same data, same configuration: 3 steps on one rank must give the same
// losses and parameter checksums within the rounding of bf16 GEMM inputs (fp32 everywhere else),
// and checkpointing with CAC must not change the CUDA step's numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "runtime_test_world.hpp"
#include "tedsim/comm/communicator.hpp"
#include "tedsim/runtime/trainer.hpp"

namespace tedsim::test {
namespace {

struct StepRun {
  std::vector<double> losses;
  std::vector<runtime::Checksum> sums;
};

StepRun train(Communicator& world, const ModelSpec& m, const ParallelConfig& c, int steps) {
  runtime::TrainerOptions o;
  o.lr = 3e-3f;
  runtime::Trainer tr(world, m, c, o);
  StepRun r;
  for (int i = 0; i < steps; ++i) r.losses.push_back(tr.step().loss);
  r.sums = tr.checksums();
  return r;
}

ParallelConfig one_rank(bool checkpoint) {
  ParallelConfig c;
  c.gpus = 1;
  c.micro_batch = 2;
  c.global_batch = 4;  // two micro-batches: gradient accumulation on the device
  c.checkpoint = checkpoint;
  c.cac = checkpoint;
  return c;
}

void expect_close(const StepRun& a, const StepRun& b, double tol, const char* what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_NEAR(a.losses[i], b.losses[i], tol * std::fabs(a.losses[i])) << what << ": loss of step " << i;
  ASSERT_EQ(a.sums.size(), b.sums.size());
  for (std::size_t i = 0; i < a.sums.size(); ++i)
    EXPECT_NEAR(a.sums[i].weighted, b.sums[i].weighted, tol * a.sums[i].abs) << what << ": checksum " << a.sums[i].kind;
}

class GpuStep : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
    if (runtime_world().size() != 1) GTEST_SKIP() << "runs on one rank";
  }
};

TEST_F(GpuStep, MatchesCpuStepWithinBf16Rounding) {
  for (Activation act : {Activation::gelu, Activation::swiglu}) {
    const ModelSpec m = small_moe(2, act, act == Activation::gelu);
    const StepRun cpu = train(runtime_world(), m, one_rank(false), 3);
    auto gpu_world = make_world_communicator(Backend::cuda);
    const StepRun gpu = train(*gpu_world, m, one_rank(false), 3);
    expect_close(cpu, gpu, 2e-2, act == Activation::gelu ? "gelu" : "swiglu");
    EXPECT_LT(gpu.losses.back(), gpu.losses.front());
  }
}

TEST_F(GpuStep, CheckpointingWithCacChangesNothing) {
  const ModelSpec m = small_moe(2);
  auto gpu_world = make_world_communicator(Backend::cuda);
  const StepRun plain = train(*gpu_world, m, one_rank(false), 3);
  const StepRun ckpt = train(*gpu_world, m, one_rank(true), 3);
  expect_close(plain, ckpt, 1e-4, "checkpoint + CAC");
}

}  // namespace
}  // namespace tedsim::test
