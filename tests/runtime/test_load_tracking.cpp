// What validate reports for dropless routing: per MoE layer pass, the busiest expert's rows over the
// mean expert's and the busiest expert rank's rows over the mean rank's, both over the expert group.
#include <gtest/gtest.h>

#include <algorithm>

#include "runtime_test_world.hpp"
#include "tedsim/runtime/trainer.hpp"

namespace tedsim::test {
namespace {

TEST(LoadTracking, TwoRanksSampleTheBusiestExpertAndTheBusiestRank) {
  Communicator& world = runtime_world();
  if (world.size() != 2) GTEST_SKIP() << "runs on two ranks";
  const ModelSpec m = small_todays_moe(kDroplessShared);  // 8 experts, top-4, dropless, 3 MoE layers
  ParallelConfig c;
  c.gpus = 2;
  c.ep = 2;
  c.micro_batch = 2;
  c.global_batch = 4;
  c.recompute = Recompute::full;  // the recompute's passes must not be sampled twice
  runtime::TrainerOptions o;
  o.track_imbalance = true;
  runtime::Trainer trainer(world, m, c, o);
  trainer.step();
  const std::vector<double>& experts = trainer.imbalance_samples();
  const std::vector<double>& ranks = trainer.rank_load_samples();
  const int moe_layers = m.layers - m.moe.first_dense;
  const int passes = moe_layers * c.global_batch / (c.micro_batch * c.gpus / c.ep);  // forward passes only
  ASSERT_EQ(int(experts.size()), passes);
  ASSERT_EQ(ranks.size(), experts.size());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    // The busiest rank holds at least the mean, at most every row (2 ranks), and at most its 4
    // local experts at the busiest expert's load: rank load <= imbalance.
    EXPECT_GE(experts[i], 1.0) << "pass " << i;
    EXPECT_GE(ranks[i], 1.0) << "pass " << i;
    EXPECT_LE(ranks[i], std::min(2.0, experts[i]) + 1e-12) << "pass " << i;
  }
  // Untrained routing is far from uniform: somewhere a rank carries more than the mean.
  EXPECT_GT(*std::max_element(ranks.begin(), ranks.end()), 1.0);
}

}  // namespace
}  // namespace tedsim::test
