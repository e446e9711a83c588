// Megatron-Core's MoE parallel folding (RankLayout::folded): the experts number a stage's ranks on
// their own grid, whole (expert TP 1), so an expert group is e consecutive ranks across tensor
// ranks and e need only divide the stage; the attention keeps the tensor and data groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "test_helpers.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/search/search.hpp"

namespace tedsim {
namespace {

std::vector<int> range(int first, int count, int stride = 1) {
  std::vector<int> v;
  for (int i = 0; i < count; ++i) v.push_back(first + i * stride);
  return v;
}

TEST(MoeFolding, ExpertGroupsAreConsecutiveRanksAcrossTensorRanks) {
  const TedLayout l(16, 2, 8, RankLayout::folded, false);
  EXPECT_EQ(l.group_members(GroupKind::expert, 0), range(0, 8));
  EXPECT_EQ(l.group_members(GroupKind::expert, 9), range(8, 8));
  EXPECT_EQ(l.group_members(GroupKind::expert_data, 3), range(3, 2, 8));
  EXPECT_EQ(l.group_members(GroupKind::tensor, 5), range(4, 2));
  EXPECT_EQ(l.group_members(GroupKind::data, 5), range(1, 8, 2));  // the attention's replicas
  EXPECT_EQ(l.group_count(GroupKind::expert), 2);
  EXPECT_EQ(l.group_count(GroupKind::data), 2);
  // t x e may exceed the stage: one expert group holds every rank of it.
  const TedLayout wide(16, 2, 16, RankLayout::folded, false);
  EXPECT_EQ(wide.group_members(GroupKind::expert, 7), range(0, 16));
  EXPECT_EQ(wide.group_size(GroupKind::expert_data), 1);
  // Stages stay apart.
  const TedLayout staged(32, 2, 8, RankLayout::folded, false, 2);
  EXPECT_EQ(staged.group_members(GroupKind::expert, 20), range(16, 8));
  EXPECT_EQ(staged.group_members(GroupKind::data, 17), range(17, 8, 2));
  for (int r = 0; r < 32; ++r) EXPECT_EQ(staged.rank_of(staged.coords_of(r)), r);
  // Whole experts only, and e must divide the stage.
  EXPECT_THROW(TedLayout(16, 2, 8, RankLayout::folded, true), InputError);
  EXPECT_THROW(TedLayout(24, 2, 16, RankLayout::folded, false), InputError);
}

TEST(MoeFolding, ConfigurationRulesAreMegatronCores) {
  const ModelSpec m = test::model("qwen3-235b-a22b");
  ParallelConfig c = test::config(32, 2, 32, 1, 32);
  c.layout = RankLayout::folded;
  c.expert_tp = false;
  c.sequence_parallel = true;
  c.dtd = false;
  EXPECT_EQ(config_violation(c, m), "");
  c.layout = RankLayout::ted;  // tp x ep = 64 does not divide the 32 GPUs
  EXPECT_NE(config_violation(c, m).find("tp x ep"), std::string::npos);
  c.layout = RankLayout::folded;
  c.sequence_parallel = false;
  EXPECT_NE(config_violation(c, m).find("--sequence-parallel"), std::string::npos);
  c.sequence_parallel = true;
  c.expert_tp = true;
  EXPECT_NE(config_violation(c, m).find("--no-expert-tp"), std::string::npos);
  c.expert_tp = false;
  c.ep = 64;
  EXPECT_NE(config_violation(c, m).find("ep 64 does not divide the 32 gpus"), std::string::npos);
  EXPECT_NE(c.describe().find(" fold"), std::string::npos);
}

// Qwen3-235B on 32 H100s (4 nodes) at t = 2, e = 32, as Megatron-Bridge's H100 recipe runs it: each
// rank holds 4 whole experts and routes its own s/t tokens; the expert all-to-all spans the 4 nodes
// and no expert gradient needs syncing (one expert-data rank).
TEST(MoeFolding, TheWorkloadRunsWholeExpertsOnTheFoldedGroups) {
  const test::Bench bench(test::model("qwen3-235b-a22b"), "dgx-h100");
  ParallelConfig c = test::config(32, 2, 32, 1, 32);
  c.layout = RankLayout::folded;
  c.expert_tp = false;
  c.sequence_parallel = true;
  c.dtd = false;
  c.recompute = Recompute::none;
  c.seq_len = 4096;
  const Workload w = bench.workload(c);
  EXPECT_EQ(w.shape.local_experts, 4);
  EXPECT_EQ(w.shape.de, 1);
  EXPECT_EQ(w.spans.expert.widest().ranks, 32);
  EXPECT_EQ(w.spans.expert.widest().nodes, 4);
  EXPECT_EQ(w.spans.tensor.widest().nodes, 1);
  EXPECT_EQ(w.spans.data.widest().ranks, 16);
  EXPECT_TRUE(bench.evaluator.evaluate(c).sim.iteration_s > 0);

  // Where the TED grid also fits (e = 8), folding changes where groups sit, not what a rank computes.
  c.ep = 8;
  const Workload folded = bench.workload(c);
  c.layout = RankLayout::ted;
  const Workload ted = bench.workload(c);
  EXPECT_DOUBLE_EQ(folded.moe.forward.phase_seconds[int(Phase::compute)], ted.moe.forward.phase_seconds[int(Phase::compute)]);
  EXPECT_EQ(folded.shape.expert_rows, ted.shape.expert_rows);
}

TEST(MoeFolding, SearchTriesItForExpertsWithTensorParallelism) {
  const ModelSpec m = test::model("qwen3-235b-a22b");
  SearchSpace space;
  space.gpus = 32;
  space.global_batch = 32;
  space.max_pp = 1;
  const auto configs = enumerate_configs(m, space);
  const auto folded = std::count_if(configs.begin(), configs.end(), [](const ParallelConfig& c) { return c.layout == RankLayout::folded; });
  EXPECT_GT(folded, 0);
  EXPECT_TRUE(std::any_of(configs.begin(), configs.end(), [](const ParallelConfig& c) {
    return c.layout == RankLayout::folded && c.tp * c.ep > c.stage_gpus();
  }));
  for (const ParallelConfig& c : configs)
    if (c.layout == RankLayout::folded) {
      EXPECT_FALSE(c.expert_tp);
      EXPECT_TRUE(c.sequence_parallel);
      EXPECT_GT(c.tp, 1);
    }
}

}  // namespace
}  // namespace tedsim
