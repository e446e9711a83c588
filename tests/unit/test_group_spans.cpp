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

// Summit (6 GPUs per node), t=2, e=8 on 64 GPUs: the widest expert group has 3 members on one
// node and 4 expert groups share some node; 3 x 4 = 12 senders is more than the node's 6 GPUs.
// A node's all-to-all egress is at most its 6 devices' outgoing shares, (n-1)/n of the bytes each.
TEST(AnalyticProfile, AllToAllNeverChargesANodeForMoreSendersThanDevices) {
  const TopologySpec summit = test::topology("summit");
  const GroupSpan expert = compute_group_spans(TedLayout(64, 2, 8, RankLayout::ted), summit).expert.widest();
  EXPECT_EQ(expert.ranks, 8);
  EXPECT_GT(expert.max_ranks_per_node * expert.groups_per_node, summit.devices_per_node);
  AnalyticProfile p(summit);
  const double bytes = 4.0 * 1048576;
  const double node_bw = summit.inter.bandwidth_gbs * kGB * summit.inter.efficiency;
  const double bound = bytes * 7.0 / 8.0 * summit.devices_per_node / node_bw + 7 * summit.inter.latency_us * kMicro;
  EXPECT_LE(p.collective_seconds(CollectiveOp::all_to_all, expert, bytes), bound * (1 + 1e-12));
  // Where groups do fit the node (8 GPUs per node, one group member each), the cap changes nothing.
  const TopologySpec theta = test::topology("thetagpu");
  const GroupSpan spread = compute_group_spans(TedLayout(64, 8, 8, RankLayout::ted), theta).expert.widest();
  ASSERT_LE(spread.max_ranks_per_node * spread.groups_per_node, theta.devices_per_node);
  const double theta_bw = theta.inter.bandwidth_gbs * kGB * theta.inter.efficiency;
  const double k = spread.max_ranks_per_node, n = spread.ranks;
  EXPECT_NEAR(AnalyticProfile(theta).collective_seconds(CollectiveOp::all_to_all, spread, bytes),
              bytes * (n - k) / n * k * spread.groups_per_node / theta_bw + (n - 1) * theta.inter.latency_us * kMicro,
              1e-12);
}

}  // namespace
}  // namespace tedsim
