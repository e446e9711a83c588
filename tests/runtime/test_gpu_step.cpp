// The CUDA training step against the CPU one (registered only where a GPU is present; skips
// without one). Same model, same data, same configuration, one rank:
//  - the gradients of every parameter kind after one forward/backward (two micro-batches, so
//    accumulation is included) agree (relative L2 error). The CPU reference rounds every GEMM's
//    operands to bf16 as the CUDA step does (TrainerOptions::cpu_bf16_gemm_operands), so what is
//    left is the order of fp32 sums, the attention core's TF32 and the device's exp and rsqrt;
//  - 3 training steps give the same losses and move the parameters the same way;
//  - checkpointing with CAC does not change the CUDA step's numbers;
//  - on two GPUs (NCCL), tensor, expert and data parallel steps give the CPU golden run's losses.
// The model is the gradient check's (large initial weights, decisive routing) so that every
// gradient is far from zero and no routing decision sits on a tie.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime_test_world.hpp"
#include "tedsim/comm/communicator.hpp"
#include "tedsim/runtime/trainer.hpp"

namespace tedsim::test {
namespace {

runtime::TrainerOptions decisive_options() {
  runtime::TrainerOptions o;
  o.init_std = 0.2f;
  o.gate_init_std = 1.0f;
  o.ln_init_noise = 0.2f;
  o.aux_loss_coef = 0.5f;
  o.lr = 3e-3f;
  o.cpu_bf16_gemm_operands = true;  // the CPU reference rounds GEMM operands as the device does
  return o;
}

ParallelConfig one_rank(bool checkpoint) {
  ParallelConfig c;
  c.gpus = 1;
  c.micro_batch = 2;
  c.global_batch = 4;  // two micro-batches: gradient accumulation on the device
  c.recompute = checkpoint ? Recompute::full : Recompute::none;
  c.cac = checkpoint;
  c.zero = 0;
  return c;
}

// Per parameter kind: the concatenation of its tensors (gradients, or changes of the values).
using ByKind = std::map<std::string, std::vector<double>>;

// routing: where given, the step's routing signature (every MoE layer's choices).
ByKind gradients(Communicator& world, const ModelSpec& m, const ParallelConfig& c,
                 std::uint64_t* routing = nullptr) {
  runtime::Trainer tr(world, m, c, decisive_options());
  tr.loss_and_grads(0);
  if (routing) *routing = tr.routing_signature();
  ByKind out;
  for (std::size_t id = 0; id < tr.params().infos().size(); ++id) {
    const std::vector<float> g = tr.grad_to_host(static_cast<int>(id));
    auto& v = out[tr.params().info(static_cast<int>(id)).kind];
    v.insert(v.end(), g.begin(), g.end());
  }
  return out;
}

struct Trained {
  std::vector<double> losses;
  ByKind updates;  // value after the steps minus initial value
};

Trained train(Communicator& world, const ModelSpec& m, const ParallelConfig& c, int steps) {
  runtime::Trainer tr(world, m, c, decisive_options());
  const std::size_t n = tr.params().infos().size();
  std::vector<std::vector<float>> initial;
  for (std::size_t id = 0; id < n; ++id) initial.push_back(tr.param_to_host(static_cast<int>(id)));
  Trained r;
  for (int i = 0; i < steps; ++i) r.losses.push_back(tr.step().loss);
  for (std::size_t id = 0; id < n; ++id) {
    const std::vector<float> w = tr.param_to_host(static_cast<int>(id));
    auto& v = r.updates[tr.params().info(static_cast<int>(id)).kind];
    for (std::size_t i = 0; i < w.size(); ++i) v.push_back(static_cast<double>(w[i]) - initial[id][i]);
  }
  return r;
}

// ||a - b|| / ||a|| for each kind, which must exist in both with the same length.
void expect_close_by_kind(const ByKind& a, const ByKind& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0.0;
  std::string worst_kind;
  for (const auto& [kind, va] : a) {
    const auto it = b.find(kind);
    ASSERT_NE(it, b.end()) << what << ": kind " << kind;
    const std::vector<double>& vb = it->second;
    ASSERT_EQ(va.size(), vb.size()) << what << ": kind " << kind;
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < va.size(); ++i) {
      diff += (va[i] - vb[i]) * (va[i] - vb[i]);
      norm += va[i] * va[i];
    }
    ASSERT_GT(norm, 0.0) << what << ": kind " << kind << " is all zero (vacuous comparison)";
    EXPECT_LT(std::sqrt(diff / norm), tol) << what << ": kind " << kind;
    if (std::sqrt(diff / norm) > worst) {
      worst = std::sqrt(diff / norm);
      worst_kind = kind;
    }
  }
  std::printf("%s: largest relative L2 difference %.2e, kind %s (tolerance %.0e)\n", what.c_str(), worst,
              worst_kind.c_str(), tol);
}

class GpuStep : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
    if (runtime_world().size() != 1) GTEST_SKIP() << "runs on one rank";
    gpu_world_ = make_world_communicator(Backend::cuda);
  }
  std::unique_ptr<Communicator> gpu_world_;
};

// With the GEMM operands rounded alike, the two steps differ by fp32 summation order, the
// attention core's TF32 (10 significant bits) and the device's exp/rsqrt; 2% relative L2 is loose
// for correct code and tight for wrong code (a missing term, a wrong scale or a transposed index
// gives errors of order 1).
constexpr double kBf16Tolerance = 2e-2;
constexpr double kFlippedRoutingTolerance = 1e-1;

TEST_F(GpuStep, GradientsOfEveryKindMatchCpu) {
  for (Activation act : {Activation::gelu, Activation::swiglu}) {
    const bool tied = act == Activation::gelu;
    const ModelSpec m = small_moe(2, act, tied);
    const std::string what = tied ? "gelu, tied" : "swiglu, untied";
    expect_close_by_kind(gradients(runtime_world(), m, one_rank(true)), gradients(*gpu_world_, m, one_rank(true)),
                         kBf16Tolerance, what);
  }
}

// Today's routers on the device (cuda/router.cu): dropless softmax-top-k with a shared expert,
// RMSNorm and RoPE; DeepSeek-V3's group-limited sigmoid, dropless; Mixtral's top-k-softmax with a
// capacity and head_dim apart from hidden / heads, Qwen3's q/k norms; DeepSeek's multi-head latent
// attention (value heads apart from the query/key heads), with and without the query latent;
// DeepSeek-V3's multi-token prediction (the masked loss's zeroed rows, eh_proj, the embedding reused).
TEST_F(GpuStep, TodaysRoutersGradientsMatchCpu) {
  for (TodaysMoe kind : {kDroplessShared, kSigmoidGroups, kTopkSoftmax, kMla, kMlaDirectQ, kMtp}) {
    const ModelSpec m = small_todays_moe(kind);
    std::uint64_t cpu_routing = 0, gpu_routing = 0;
    const ByKind cpu = gradients(runtime_world(), m, one_rank(false), &cpu_routing);
    const ByKind gpu = gradients(*gpu_world_, m, one_rank(false), &gpu_routing);
    // A routing choice within rounding of a tie can flip. The flipped token's expert, and through
    // the balance loss (coefficient 0.5 here) every router gradient, then move by more than
    // rounding. Against an fp32 CPU reference, an H200 flipped some token in every one of these
    // models and the gradients moved by up to 21% (reports/device/); the reference now rounds
    // GEMM operands as the device does, which leaves far less to flip a tie. A flip is reported,
    // and the comparison allows 10% then: still far below the order-1 errors of a wrong term.
    const bool same_routing = cpu_routing == gpu_routing;
    if (!same_routing)
      std::printf("today's model %d: the GPU routed some token differently from the CPU (a tie within bf16 "
                  "rounding); gradients compared within %.0f%%\n",
                  int(kind), 100 * kFlippedRoutingTolerance);
    expect_close_by_kind(cpu, gpu, same_routing ? kBf16Tolerance : kFlippedRoutingTolerance,
                         "today's model " + std::to_string(int(kind)));
  }
}

TEST_F(GpuStep, ThreeStepsMatchCpu) {
  const ModelSpec m = small_moe(2);
  const Trained cpu = train(runtime_world(), m, one_rank(false), 3);
  const Trained gpu = train(*gpu_world_, m, one_rank(false), 3);
  for (std::size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_NEAR(cpu.losses[i], gpu.losses[i], 5e-3 * std::fabs(cpu.losses[i])) << "loss of step " << i;
  // Adam's first steps move each weight by about lr * sign(gradient): weights whose gradient is
  // within bf16 rounding of zero may move the other way, so updates compare loosely; this catches
  // a missing or misapplied update, the gradient test above catches wrong gradients.
  expect_close_by_kind(cpu.updates, gpu.updates, 0.3, "parameter updates after 3 steps");
  EXPECT_LT(gpu.losses.back(), gpu.losses.front());
}

TEST_F(GpuStep, CheckpointingWithCacChangesNothing) {
  const ModelSpec m = small_moe(2);
  const Trained plain = train(*gpu_world_, m, one_rank(false), 3);
  const Trained ckpt = train(*gpu_world_, m, one_rank(true), 3);
  for (std::size_t i = 0; i < plain.losses.size(); ++i)
    EXPECT_NEAR(plain.losses[i], ckpt.losses[i], 1e-4 * std::fabs(plain.losses[i])) << "loss of step " << i;
  // Not bit-exact: the embedding gradient is summed with atomics, in any order.
  expect_close_by_kind(plain.updates, ckpt.updates, 1e-2, "checkpoint + CAC");
}

// Two ranks, one GPU each: the NCCL collectives of the step (TP all-reduces, expert all-to-alls,
// DTD all-gathers, data-parallel gradient sync) against a 1-rank CPU run made by rank 0.
class GpuStepNp2 : public ::testing::TestWithParam<std::array<int, 2>> {};

TEST_P(GpuStepNp2, LossesMatchCpuGolden) {
  Communicator& world = runtime_world();
  std::string why;
  if (cuda_device_count(&why) < world.size()) GTEST_SKIP() << "needs one CUDA device per rank: " << why;
  if (world.size() != 2) GTEST_SKIP() << "runs on two ranks";
  const ModelSpec m = small_moe(2);
  std::vector<double> golden(3, 0.0);
  {
    auto self = world.split(std::vector<int>{world.rank()}, "golden");
    if (world.rank() == 0) golden = train(*self, m, one_rank(false), 3).losses;
  }
  std::vector<double> shared = golden;  // rank 0's golden losses to every rank
  world.host_max(shared);
  auto gpu_world = make_world_communicator(Backend::cuda);
  ParallelConfig c = one_rank(true);
  c.gpus = 2;
  c.tp = GetParam()[0];
  c.ep = GetParam()[1];
  c.dtd = true;
  const Trained gpu = train(*gpu_world, m, c, 3);
  for (std::size_t i = 0; i < shared.size(); ++i)
    EXPECT_NEAR(shared[i], gpu.losses[i], 5e-3 * std::fabs(shared[i])) << "loss of step " << i;
}

// Dropless routing over two GPUs: the rows cross NCCL's grouped send/receive (all-to-all-v) with
// uneven counts, against the 1-rank CPU golden run.
TEST(GpuDroplessNp2, LossesMatchCpuGolden) {
  Communicator& world = runtime_world();
  std::string why;
  if (cuda_device_count(&why) < world.size()) GTEST_SKIP() << "needs one CUDA device per rank: " << why;
  if (world.size() != 2) GTEST_SKIP() << "runs on two ranks";
  for (TodaysMoe kind : {kDroplessShared, kSigmoidGroups}) {
    const ModelSpec m = small_todays_moe(kind);
    std::vector<double> golden(3, 0.0);
    {
      auto self = world.split(std::vector<int>{world.rank()}, "golden");
      if (world.rank() == 0) golden = train(*self, m, one_rank(false), 3).losses;
    }
    world.host_max(golden);
    auto gpu_world = make_world_communicator(Backend::cuda);
    ParallelConfig c = one_rank(false);
    c.gpus = 2;
    c.ep = 2;
    const Trained gpu = train(*gpu_world, m, c, 3);
    for (std::size_t i = 0; i < golden.size(); ++i)
      EXPECT_NEAR(golden[i], gpu.losses[i], 5e-3 * std::fabs(golden[i])) << "model " << int(kind) << ", loss of step " << i;
  }
}

// Two pipeline stages, one GPU each: activations and their gradients cross over NCCL's
// point-to-point lanes, 1F1B and interleaved, against the same 1-rank CPU golden.
TEST(GpuPipelineNp2, LossesMatchCpuGolden) {
  Communicator& world = runtime_world();
  std::string why;
  if (cuda_device_count(&why) < world.size()) GTEST_SKIP() << "needs one CUDA device per rank: " << why;
  if (world.size() != 2) GTEST_SKIP() << "runs on two ranks";
  const ModelSpec m = small_moe(4);  // a layer for each of the 2 x 2 interleaved chunks
  std::vector<double> golden(3, 0.0);
  {
    auto self = world.split(std::vector<int>{world.rank()}, "golden");
    if (world.rank() == 0) golden = train(*self, m, one_rank(false), 3).losses;
  }
  world.host_max(golden);
  auto gpu_world = make_world_communicator(Backend::cuda);
  for (int chunks : {1, 2}) {
    ParallelConfig c = one_rank(false);
    c.gpus = 2;
    c.pp = 2;
    c.vpp = chunks;
    const Trained gpu = train(*gpu_world, m, c, 3);
    for (std::size_t i = 0; i < golden.size(); ++i)
      EXPECT_NEAR(golden[i], gpu.losses[i], 5e-3 * std::fabs(golden[i])) << "vpp " << chunks << ", loss of step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(TensorExpertData, GpuStepNp2,
                         ::testing::Values(std::array<int, 2>{2, 1}, std::array<int, 2>{1, 2},
                                           std::array<int, 2>{1, 1}),
                         [](const auto& info) {
                           return "t" + std::to_string(info.param[0]) + "e" + std::to_string(info.param[1]);
                         });

}  // namespace
}  // namespace tedsim::test
