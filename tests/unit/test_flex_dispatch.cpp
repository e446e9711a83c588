// The flex dispatcher (DeepEP/HybridEP): the chance a token's experts miss a GPU's or a node's block
// of experts, checked against brute-force enumeration of the routing model it states; expected
// destinations; and the all-to-all it prices, leg by leg, against the alltoall dispatcher's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "test_helpers.hpp"
#include "tedsim/model/flex_dispatch.hpp"
#include "tedsim/model/workload.hpp"

namespace tedsim {
namespace {

// Every k-subset of {0..n-1}, each given to `visit` as a vector.
void for_each_subset(int n, int k, const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> pick(static_cast<std::size_t>(k), 0);
  std::function<void(int, int)> rec = [&](int start, int depth) {
    if (depth == k) {
      visit(pick);
      return;
    }
    for (int i = start; i < n; ++i) {
      pick[std::size_t(depth)] = i;
      rec(i + 1, depth + 1);
    }
  };
  rec(0, 0);
}

// The routing model, enumerated: groups chosen uniformly, then k experts uniformly among the
// chosen groups' experts; the share of outcomes with no expert in [first, first + members).
double brute_force_miss(int E, int k, int G, int g, int first, int members) {
  const int per_group = E / G;
  double miss = 0, total = 0;
  for_each_subset(G, g, [&](const std::vector<int>& groups) {
    std::vector<int> pool;
    for (int grp : groups)
      for (int e = grp * per_group; e < (grp + 1) * per_group; ++e) pool.push_back(e);
    double m = 0, n = 0;
    for_each_subset(int(pool.size()), k, [&](const std::vector<int>& idx) {
      bool hit = false;
      for (int i : idx) hit = hit || (pool[std::size_t(i)] >= first && pool[std::size_t(i)] < first + members);
      m += hit ? 0 : 1;
      n += 1;
    });
    miss += m / n;
    total += 1;
  });
  return miss / total;
}

MoeSpec moe(int experts, int top_k, int groups = 1, int topk_groups = 1) {
  MoeSpec m;
  m.experts = experts;
  m.top_k = top_k;
  m.groups = groups;
  m.topk_groups = topk_groups;
  return m;
}

TEST(FlexDispatch, MissProbabilityIsTheRoutingModelEnumerated) {
  // Uniform routing: C(E - members, k) / C(E, k); 8 experts, top-2, a block of 4: 6 / 28.
  EXPECT_NEAR(routing_miss_probability(moe(8, 2), 4), 6.0 / 28.0, 1e-12);
  EXPECT_NEAR(routing_miss_probability(moe(12, 3), 3), brute_force_miss(12, 3, 1, 1, 0, 3), 1e-12);
  // Group-limited: a block inside one group (12 experts in 4 groups of 3, 2 groups chosen, top-2).
  EXPECT_NEAR(routing_miss_probability(moe(12, 2, 4, 2), 1), brute_force_miss(12, 2, 4, 2, 0, 1), 1e-12);
  EXPECT_NEAR(routing_miss_probability(moe(12, 2, 4, 2), 3), brute_force_miss(12, 2, 4, 2, 0, 3), 1e-12);
  // A block of two whole groups (8 experts in 4 groups of 2, 2 chosen, top-2): 10 / 36 by hand.
  EXPECT_NEAR(routing_miss_probability(moe(8, 2, 4, 2), 4), 10.0 / 36.0, 1e-12);
  EXPECT_NEAR(routing_miss_probability(moe(8, 2, 4, 2), 4), brute_force_miss(8, 2, 4, 2, 0, 4), 1e-12);
  // A block holding every expert is never missed.
  EXPECT_EQ(routing_miss_probability(moe(8, 2), 8), 0.0);
}

TEST(FlexDispatch, OneExpertPerGpuReachesExactlyTopKGpus) {
  EXPECT_NEAR(expected_destinations(moe(64, 6), 64), 6.0, 1e-9);
  EXPECT_NEAR(expected_destinations(moe(256, 8, 8, 4), 256), 8.0, 1e-9);
  // Fewer, larger blocks: fewer destinations than k, never more than the blocks.
  const double nodes = expected_destinations(moe(128, 8), 2);
  EXPECT_LT(nodes, 2.0);
  EXPECT_GT(nodes, 1.99);  // 1 - C(64, 8) / C(128, 8) = 0.9965 of each node
  EXPECT_EQ(expected_destinations(moe(128, 8), 1), 1.0);
}

double dispatch_seconds(const Workload& w) {
  for (int i = 0; i < w.moe.forward.count; ++i)
    if (std::strcmp(w.moe.forward.ops[i].name, "ep_alltoall_dispatch") == 0) return w.moe.forward.ops[i].seconds;
  return -1;
}

// Qwen3-30B-A3B (128 experts, top-8) on one DGX B200, EP8: the flex all-to-all is the alltoall
// dispatcher's send buffer cut to one copy per destination GPU, priced by the same link model.
TEST(FlexDispatch, InsideANodeEachTokenGoesOncePerGpu) {
  test::Bench bench(test::model("qwen3-30b-a3b"), "dgx-b200");
  ParallelConfig c = test::config(8, 1, 8, 1, 8);
  const Workload pairs = bench.workload(c);
  c.moe_dispatcher = MoeDispatcher::flex;
  const Workload flex = bench.workload(c);
  const SpanSet& ep = bench.evaluator.spans_for(c).expert;
  ASSERT_EQ(ep.count, 1);
  ASSERT_EQ(ep.spans[0].nodes, 1);
  double pair_bytes = 0;
  for (int i = 0; i < pairs.moe.forward.count; ++i)
    if (std::strcmp(pairs.moe.forward.ops[i].name, "ep_alltoall_dispatch") == 0) pair_bytes = pairs.moe.forward.ops[i].bytes;
  const double gpus = 8.0 * (1.0 - routing_miss_probability(bench.m.moe, 16));
  EXPECT_NEAR(dispatch_seconds(flex),
              bench.profile.collective_seconds(CollectiveOp::all_to_all, ep.spans[0], pair_bytes * gpus / 8.0), 1e-12);
  EXPECT_NEAR(dispatch_seconds(pairs), bench.profile.collective_seconds(CollectiveOp::all_to_all, ep.spans[0], pair_bytes), 1e-12);
  EXPECT_LT(dispatch_seconds(flex), dispatch_seconds(pairs));
}

// EP16 over two DGX H100 nodes: the network leg carries a token once to the other node (about 1
// remote node per token against 4 remote token-expert pairs), in an all-to-all among one GPU per
// node whose NICs all 8 GPUs of a node share; the NVLink leg is the per-GPU copies inside the node.
TEST(FlexDispatch, AcrossNodesEachTokenCrossesTheNetworkOncePerNode) {
  test::Bench bench(test::model("qwen3-30b-a3b"), "dgx-h100");
  ParallelConfig c = test::config(16, 1, 16, 1, 16);
  c.moe_dispatcher = MoeDispatcher::flex;
  const Workload flex = bench.workload(c);
  const GroupSpan span = bench.evaluator.spans_for(c).expert.spans[0];
  ASSERT_EQ(span.nodes, 2);
  ASSERT_EQ(span.max_ranks_per_node, 8);
  double pair_bytes = 0;
  for (int i = 0; i < flex.moe.forward.count; ++i)
    if (std::strcmp(flex.moe.forward.ops[i].name, "ep_alltoall_dispatch") == 0) pair_bytes = flex.moe.forward.ops[i].bytes;
  const MoeSpec& m = bench.m.moe;
  const double remote_nodes = 2.0 * (1.0 - routing_miss_probability(m, 64)) * 0.5;
  GroupSpan network;
  network.ranks = 2;
  network.nodes = 2;
  network.max_ranks_per_node = 1;
  network.groups_per_node = span.groups_per_node * 8;
  const double rdma = bench.profile.collective_seconds(CollectiveOp::all_to_all, network, pair_bytes * remote_nodes / 8.0 * 2.0);
  GroupSpan node = span;
  node.ranks = 8;
  node.nodes = 1;
  const double gpus = 16.0 * (1.0 - routing_miss_probability(m, 8));
  const double nvlink = bench.profile.collective_seconds(CollectiveOp::all_to_all, node, pair_bytes * gpus / 8.0);
  EXPECT_NEAR(dispatch_seconds(flex), std::max(rdma, nvlink), 1e-12);
  EXPECT_GT(rdma, nvlink);  // the NICs are the bottleneck
  c.moe_dispatcher = MoeDispatcher::alltoall;
  EXPECT_GT(dispatch_seconds(bench.workload(c)), 3.0 * dispatch_seconds(flex));
}

}  // namespace
}  // namespace tedsim
