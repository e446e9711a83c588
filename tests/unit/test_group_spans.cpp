// Rank layout and where groups land on nodes, including partly filled nodes (Summit's 6 GPUs).
#include <gtest/gtest.h>

#include "test_helpers.hpp"
#include "tedsim/model/group_spans.hpp"

namespace tedsim {
namespace {

TEST(RankLayout, TedPutsTensorInnermostThenExpertThenData) {
  const TedLayout l(16, 2, 4, RankLayout::ted);
  EXPECT_EQ(l.group_members(GroupKind::tensor, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.group_members(GroupKind::expert, 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(l.group_members(GroupKind::expert_data, 0), (std::vector<int>{0, 8}));
  EXPECT_EQ(l.group_members(GroupKind::data, 1), (std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15}));
  for (int r = 0; r < 16; ++r) EXPECT_EQ(l.rank_of(l.coords_of(r)), r);
}

TEST(RankLayout, DataBeforeExpertSwapsExpertAndDataDigits) {
  const TedLayout l(16, 2, 4, RankLayout::data_before_expert);
  EXPECT_EQ(l.group_members(GroupKind::expert, 0), (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(l.group_members(GroupKind::expert_data, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(l.group_members(GroupKind::tensor, 5), (std::vector<int>{4, 5}));
  for (int r = 0; r < 16; ++r) EXPECT_EQ(l.rank_of(l.coords_of(r)), r);
}

TEST(RankLayout, WithoutExpertTensorParallelismTensorRanksShareExperts) {
  const TedLayout l(8, 2, 2, RankLayout::ted, /*expert_tp=*/false);
  EXPECT_EQ(l.group_size(GroupKind::expert_data), 4);
  EXPECT_EQ(l.group_members(GroupKind::expert_data, 0), (std::vector<int>{0, 1, 4, 5}));
}

TEST(GroupSpans, TensorGroupsOfFourStraddleSixGpuNodes) {
  const TopologySpec summit = test::topology("summit");
  const GroupSpans s = compute_group_spans(TedLayout(12, 4, 1, RankLayout::ted), summit);
  // Ranks 0-3 on node 0, 4-7 straddle nodes 0 and 1, 8-11 on node 1: the slowest spans 2 nodes.
  EXPECT_EQ(s.tensor.widest().nodes, 2);
  EXPECT_EQ(s.tensor.widest().max_ranks_per_node, 2);
  EXPECT_EQ(s.tensor.count, 2);  // one straddling shape, one inside a node (crossing triads)
}

TEST(GroupSpans, TriadsAreIslandsInsideASummitNode) {
  const TopologySpec summit = test::topology("summit");
  const GroupSpans three = compute_group_spans(TedLayout(6, 3, 1, RankLayout::ted), summit);
  EXPECT_FALSE(three.tensor.widest().crosses_islands);
  const GroupSpans six = compute_group_spans(TedLayout(6, 6, 1, RankLayout::ted), summit);
  EXPECT_TRUE(six.tensor.widest().crosses_islands);
  AnalyticProfile profile(summit);
  EXPECT_GT(profile.collective_seconds(CollectiveOp::all_reduce, six.tensor.widest(), 64e6),
            profile.collective_seconds(CollectiveOp::all_reduce, three.tensor.widest(), 64e6));
}

TEST(GroupSpans, PartlyFilledLastNode) {
  const TopologySpec summit = test::topology("summit");
  // 128 ranks on 22 nodes, the last holding 2: data groups of t=1 span every node.
  const GroupSpans s = compute_group_spans(TedLayout(128, 1, 1, RankLayout::ted), summit);
  EXPECT_EQ(s.data.widest().ranks, 128);
  EXPECT_EQ(s.data.widest().nodes, 22);
  EXPECT_EQ(s.data.widest().max_ranks_per_node, 6);
}

TEST(GroupSpans, NicsAreSharedByTheGroupsOfANode) {
  const TopologySpec theta = test::topology("thetagpu");
  // t = 8 fills a node; the 8 data groups each have one member per node, all 8 share its NICs.
  const GroupSpans s = compute_group_spans(TedLayout(32, 8, 1, RankLayout::ted), theta);
  EXPECT_EQ(s.data.widest().nodes, 4);
  EXPECT_EQ(s.data.widest().groups_per_node, 8);
  EXPECT_EQ(s.tensor.widest().nodes, 1);
}

TEST(AnalyticProfile, CollectivesGrowWithBytesAndCrossingNodes) {
  const TopologySpec theta = test::topology("thetagpu");
  AnalyticProfile p(theta);
  GroupSpan inside{8, 1, 8, 1, false};
  GroupSpan across{16, 2, 8, 1, false};
  for (auto op : {CollectiveOp::all_reduce, CollectiveOp::all_gather, CollectiveOp::reduce_scatter,
                  CollectiveOp::all_to_all}) {
    EXPECT_LT(p.collective_seconds(op, inside, 1e6), p.collective_seconds(op, inside, 1e8)) << to_string(op);
    EXPECT_LT(p.collective_seconds(op, inside, 1e8), p.collective_seconds(op, across, 1e8)) << to_string(op);
  }
  GroupSpan single{1, 1, 1, 1, false};
  EXPECT_EQ(p.collective_seconds(CollectiveOp::all_reduce, single, 1e8), 0.0);
}

}  // namespace
}  // namespace tedsim
