// The routing calibration measures (spec/expert_shares.hpp) and what the cost model takes from it:
// the busiest expert rank's load, per pass and then averaged, for any expert degree.
#include <gtest/gtest.h>

#include "test_helpers.hpp"
#include "tedsim/model/workload.hpp"
#include "tedsim/spec/expert_shares.hpp"

namespace tedsim {
namespace {

ExpertShares two_passes() {
  ExpertShares s;
  s.model = "test";
  s.rows_per_pass = 64;
  // Pass 0: experts 0-1 (rank 0 of two) take 0.6; pass 1: experts 2-3 (rank 1) take 0.7.
  s.passes = {{0.4, 0.2, 0.25, 0.15}, {0.1, 0.2, 0.3, 0.4}};
  return s;
}

TEST(ExpertShares, TheBusiestRankOfEachPassThenTheMean) {
  const ExpertShares s = two_passes();
  EXPECT_DOUBLE_EQ(s.busiest_rank_load(1), 1.0);  // one rank holds every expert
  // Two ranks: 0.6 x 2 and 0.7 x 2, whichever rank it is.
  EXPECT_NEAR(s.busiest_rank_load(2), (1.2 + 1.4) / 2, 1e-12);
  // Four ranks, one expert each: the busiest expert's share times 4.
  EXPECT_NEAR(s.busiest_rank_load(4), (1.6 + 1.6) / 2, 1e-12);
  EXPECT_NEAR(s.imbalance(), 1.6, 1e-12);
  EXPECT_DOUBLE_EQ(s.busiest_rank_load(3), 1.0);  // no such layout
  EXPECT_DOUBLE_EQ(ExpertShares{}.busiest_rank_load(2), 1.0);
}

TEST(ExpertShares, SharesOfCountsAndTheirChecks) {
  EXPECT_EQ(shares_of({3, 1, 0, 4}), (std::vector<double>{0.375, 0.125, 0.0, 0.5}));
  EXPECT_TRUE(shares_of({0, 0}).empty());
  EXPECT_EQ(expert_shares_problem(two_passes(), 4), "");
  EXPECT_NE(expert_shares_problem(two_passes(), 8).find("4 shares for a model of 8 routed experts"), std::string::npos);
  ExpertShares off = two_passes();
  off.passes[0][0] = 0.5;
  EXPECT_NE(expert_shares_problem(off, 4).find("sum to"), std::string::npos);
}

TEST(ExpertShares, MeasuredRoutingSetsTheBusiestRanksLoad) {
  ModelSpec m = test::model("cpu-moe-fine");  // 16 routed experts, dropless
  ASSERT_TRUE(m.moe.dropless());
  ParallelConfig c = test::config(2, 1, 2, 1, 2);
  const double assumed = resolve_shape(m, c).load_factor;  // from the model's imbalance
  EXPECT_DOUBLE_EQ(assumed, busiest_rank_load(16, 2, m.moe.imbalance));
  // Rank 0's eight experts take 60% of the rows in every pass.
  std::vector<double> pass(16, 0.4 / 8);
  for (int e = 0; e < 8; ++e) pass[std::size_t(e)] = 0.6 / 8;
  m.moe.measured_shares.model = m.name;
  m.moe.measured_shares.rows_per_pass = 1024;
  m.moe.measured_shares.passes = {pass, pass};
  const StepShape s = resolve_shape(m, c);
  EXPECT_NEAR(s.load_factor, 1.2, 1e-12);
  // The busiest rank's rows set the capacity, hence the expert GEMMs and the all-to-all.
  const StepShape even = [&] {
    ModelSpec flat = m;
    flat.moe.measured_shares.passes = {std::vector<double>(16, 1.0 / 16)};
    return resolve_shape(flat, c);
  }();
  EXPECT_DOUBLE_EQ(even.load_factor, 1.0);
  EXPECT_NEAR(double(s.capacity) / double(even.capacity), 1.2, 0.02);
}

}  // namespace
}  // namespace tedsim
