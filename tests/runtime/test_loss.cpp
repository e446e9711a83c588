// Training works: 50 steps of tiny-moe (models/tiny-moe.yaml) on the synthetic stream lower the
// loss well below its starting value (ln 512 = 6.24 at a uniform prediction).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>

#include "runtime_test_world.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/runtime/trainer.hpp"
#include "tedsim/spec/data_files.hpp"

namespace tedsim::test {
namespace {

// tiny-moe on one rank, two micro-batches of 2.
ParallelConfig one_rank(Recompute recompute) {
  ParallelConfig c;
  c.gpus = 1;
  c.micro_batch = 2;
  c.global_batch = 4;
  c.recompute = recompute;
  return c;
}

TEST(RuntimeTraining, TinyMoeLossFallsOver50Steps) {
  Communicator& world = runtime_world();
  if (world.size() != 1) GTEST_SKIP() << "runs on one rank";
  const ModelSpec m = load_model(resolve_data_file("models", "tiny-moe"));
  ParallelConfig c = one_rank(Recompute::full);
  c.cac = true;
  runtime::TrainerOptions o;
  o.lr = 3e-3f;
  runtime::Trainer tr(world, m, c, o);
  std::vector<double> losses;
  for (int i = 0; i < 50; ++i) losses.push_back(tr.step().loss);
  const double first = std::accumulate(losses.begin(), losses.begin() + 5, 0.0) / 5;
  const double last = std::accumulate(losses.end() - 5, losses.end(), 0.0) / 5;
  std::printf("tiny-moe loss: first 5 steps %.3f, last 5 steps %.3f\n", first, last);
  EXPECT_GT(first, 5.5);
  EXPECT_LT(last, first - 1.5) << "loss did not fall enough";
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
}

// The tiled expert optimizer step (TED's, one Adam call per tile of the expert parameters) moves
// every weight exactly as one call over all of them: Adam is element-wise.
TEST(RuntimeTraining, TiledExpertOptimizerMatchesOneCall) {
  Communicator& world = runtime_world();
  if (world.size() != 1) GTEST_SKIP() << "runs on one rank";
  const ModelSpec m = load_model(resolve_data_file("models", "tiny-moe"));
  const auto params_after_two_steps = [&](std::size_t tile) {
    ParallelConfig c = one_rank(Recompute::none);
    c.tiled_optimizer = true;
    runtime::TrainerOptions o;
    o.optimizer_tile = tile;
    runtime::Trainer tr(world, m, c, o);
    tr.step();
    tr.step();
    std::vector<float> all;
    for (std::size_t id = 0; id < tr.params().infos().size(); ++id) {
      const std::vector<float> p = tr.param_to_host(static_cast<int>(id));
      all.insert(all.end(), p.begin(), p.end());
    }
    return all;
  };
  const std::vector<float> one_call = params_after_two_steps(std::size_t{1} << 40);
  const std::vector<float> tiled = params_after_two_steps(1000);  // many tiles, the last one short
  ASSERT_EQ(one_call.size(), tiled.size());
  for (std::size_t i = 0; i < tiled.size(); ++i) ASSERT_EQ(tiled[i], one_call[i]) << "parameter element " << i;
}

// A step that goes non-finite stops with the step, the parameter kind and its name.
TEST(RuntimeTraining, NonFiniteLossOrGradientStopsTheStepNamingIt) {
  Communicator& world = runtime_world();
  if (world.size() != 1) GTEST_SKIP() << "runs on one rank";
  const ModelSpec m = load_model(resolve_data_file("models", "tiny-moe"));
  const ParallelConfig c = one_rank(Recompute::none);
  runtime::TrainerOptions o;
  o.lr = 1e38f;  // Adam moves every weight by about lr: the next forward overflows
  runtime::Trainer tr(world, m, c, o);
  std::string message;
  int steps = 0;
  try {
    for (; steps < 5; ++steps) tr.step();
  } catch (const RunError& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "five steps at lr 1e38 stayed finite";
  EXPECT_LT(steps, 5);
  EXPECT_NE(message.find("step " + std::to_string(steps) + ": non-finite"), std::string::npos) << message;
  EXPECT_NE(message.find("lower the learning rate"), std::string::npos) << message;
}

}  // namespace
}  // namespace tedsim::test
