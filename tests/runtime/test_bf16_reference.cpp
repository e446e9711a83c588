// The CPU step's bf16 GEMM-operand rounding (TrainerOptions::cpu_bf16_gemm_operands), the
// reference the CUDA step is compared against: it must change the numbers (or the GPU tests would
// compare against plain fp32 without saying so) and only by bf16 rounding (or it is wrong).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime_test_world.hpp"
#include "tedsim/runtime/trainer.hpp"

namespace tedsim::test {
namespace {

struct Gradients {
  double loss = 0;
  std::vector<double> all;  // every parameter's gradient, concatenated
};

Gradients one_step(bool bf16_operands) {
  runtime::TrainerOptions o;
  o.init_std = 0.2f;
  o.gate_init_std = 1.0f;  // decisive routing: no choice within rounding of a tie
  o.cpu_bf16_gemm_operands = bf16_operands;
  ParallelConfig c;
  c.gpus = 1;
  c.micro_batch = 2;
  c.global_batch = 4;
  auto self = runtime_world().split(std::vector<int>{runtime_world().rank()}, "bf16-reference");
  runtime::Trainer tr(*self, small_moe(2, Activation::swiglu, false), c, o);
  Gradients g;
  g.loss = tr.loss_and_grads(0);
  for (std::size_t id = 0; id < tr.params().infos().size(); ++id)
    for (float x : tr.grad_to_host(static_cast<int>(id))) g.all.push_back(x);
  return g;
}

TEST(RuntimeTraining, Bf16GemmOperandsMoveTheCpuStepByRoundingOnly) {
  const Gradients fp32 = one_step(false), bf16 = one_step(true);
  ASSERT_EQ(fp32.all.size(), bf16.all.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < fp32.all.size(); ++i) {
    diff += (fp32.all[i] - bf16.all[i]) * (fp32.all[i] - bf16.all[i]);
    norm += fp32.all[i] * fp32.all[i];
  }
  ASSERT_GT(norm, 0.0);
  const double rel = std::sqrt(diff / norm);
  // bf16 keeps 8 significant bits: each operand moves by up to 2^-9 relative, so the gradients
  // move by a few 1e-3, far above fp32's 1e-7 and far below a wrong term's order 1.
  EXPECT_GT(rel, 1e-4) << "the option changed nothing";
  EXPECT_LT(rel, 2e-2);
  EXPECT_NEAR(bf16.loss, fp32.loss, 1e-2 * std::fabs(fp32.loss));
  EXPECT_NE(bf16.loss, fp32.loss);
}

}  // namespace
}  // namespace tedsim::test
