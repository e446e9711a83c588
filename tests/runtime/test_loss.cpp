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
