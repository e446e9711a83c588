// The weights' bf16 copies (runtime/weight_copies.hpp): made once per version of the parameters,
// and a step that uses them gives the same bits as one that rounds every GEMM's weight anew.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime_test_world.hpp"
#include "tedsim/runtime/trainer.hpp"
#include "tedsim/runtime/weight_copies.hpp"

namespace tedsim::test {
namespace {

TEST(RuntimeTraining, WeightCopiesAreRemadeOnlyAfterParametersChange) {
  const long long live_before = runtime::MemoryCounter::live().load();
  std::vector<float> w(6 * 8, 1.0f);
  {
    runtime::WeightCopies copies(runtime::host_memory(), sizeof(float));
    bool stale = false;
    void* first = copies.find(w.data(), 6, 4, 8, stale);
    EXPECT_TRUE(stale) << "a new copy must be filled";
    EXPECT_EQ(copies.bytes(), 6u * 4u * sizeof(float));
    EXPECT_EQ(runtime::MemoryCounter::live().load() - live_before, static_cast<long long>(copies.bytes()));
    EXPECT_EQ(copies.find(w.data(), 6, 4, 8, stale), first);
    EXPECT_FALSE(stale) << "the same block within one version is reused";
    // Another block of the same parameter (an expert's slice, another leading dimension) is another copy.
    EXPECT_NE(copies.find(w.data() + 4, 6, 4, 8, stale), first);
    EXPECT_TRUE(stale);
    EXPECT_NE(copies.find(w.data(), 6, 4, 4, stale), first);
    EXPECT_TRUE(stale);
    copies.invalidate();
    EXPECT_EQ(copies.find(w.data(), 6, 4, 8, stale), first) << "a stale copy is refilled in place";
    EXPECT_TRUE(stale);
    EXPECT_EQ(copies.find(w.data(), 6, 4, 8, stale), first);
    EXPECT_FALSE(stale);
    EXPECT_EQ(copies.fills(), 4u);
    EXPECT_EQ(copies.reuses(), 2u);
  }
  EXPECT_EQ(runtime::MemoryCounter::live().load(), live_before) << "the copies' memory is given back";
}

struct Training {
  std::vector<double> losses;
  std::vector<float> params;  // every parameter after the steps, concatenated
};

// Three steps on the bf16-rounding CPU step, then one parameter scaled through params() and the
// loss evaluated again: the copies must follow both the optimizer and the caller's write.
Training train(bool weight_copies, int zero) {
  runtime::TrainerOptions o;
  o.cpu_bf16_gemm_operands = true;
  o.bf16_weight_copies = weight_copies;
  o.lr = 1e-2f;
  ParallelConfig c;
  c.gpus = 1;
  c.micro_batch = 2;
  c.global_batch = 4;  // two micro-batches: the second reads the copies the first made
  c.zero = zero;
  auto self = runtime_world().split(std::vector<int>{runtime_world().rank()}, "weight-copies");
  runtime::Trainer tr(*self, small_moe(2, Activation::swiglu, false), c, o);
  Training run;
  for (int i = 0; i < 3; ++i) run.losses.push_back(tr.step().loss);
  int fc1 = -1;  // the first dense or expert fc1: a weight the GEMMs read through their copies
  for (std::size_t id = 0; id < tr.params().infos().size() && fc1 < 0; ++id)
    if (tr.params().info(static_cast<int>(id)).kind.find("fc1") != std::string::npos) fc1 = static_cast<int>(id);
  EXPECT_GE(fc1, 0);
  if (fc1 < 0) return run;
  float* w = tr.params().param(fc1);
  for (std::size_t i = 0; i < tr.params().info(fc1).numel; ++i) w[i] *= 1.5f;
  run.losses.push_back(tr.loss_only(tr.iteration()));
  for (std::size_t id = 0; id < tr.params().infos().size(); ++id)
    for (float x : tr.param_to_host(static_cast<int>(id))) run.params.push_back(x);
  return run;
}

TEST(RuntimeTraining, WeightCopiesChangeNoBitOfTheStep) {
  for (int zero : {1, 3}) {
    const Training copied = train(true, zero), rounded = train(false, zero);
    ASSERT_EQ(copied.losses.size(), rounded.losses.size());
    for (std::size_t i = 0; i < copied.losses.size(); ++i)
      EXPECT_EQ(copied.losses[i], rounded.losses[i]) << "zero " << zero << ", loss " << i;
    EXPECT_NE(copied.losses[3], copied.losses[2]) << "the scaled parameter changed nothing";
    ASSERT_EQ(copied.params.size(), rounded.params.size());
    EXPECT_EQ(std::memcmp(copied.params.data(), rounded.params.data(), copied.params.size() * sizeof(float)), 0)
        << "zero " << zero << ": parameters differ after three steps";
  }
}

}  // namespace
}  // namespace tedsim::test
