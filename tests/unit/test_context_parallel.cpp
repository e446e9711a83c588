// Context parallelism (ParallelConfig::cp): where its groups sit in the rank order, what a rank
// computes once each sequence is split over cp ranks, the attention's key/value ring, the memory it
// saves, and the search's context degrees.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "test_helpers.hpp"
#include "tedsim/search/search.hpp"

namespace tedsim {
namespace {

// Llama 3.1 70B with Transformer Engine's fused core, which context parallelism runs in.
ModelSpec llama_flash() {
  ModelSpec m = test::model("hf/llama-3.1-70b");
  m.core_attention = AttentionKernel::flash;
  return m;
}

using test::find_op;

// Megatron's tp-cp-ep-dp-pp order: a context group is cp ranks at stride tp inside a stage, and
// the data group (same tensor rank) holds the context ranks too.
TEST(ContextParallel, GroupsFollowTheTensorRanksInsideAStage) {
  const TedLayout one(16, 2, 1, RankLayout::ted, true, 1, 2);
  EXPECT_EQ(one.group_members(GroupKind::context, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(one.group_members(GroupKind::context, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(one.group_members(GroupKind::context, 7), (std::vector<int>{5, 7}));
  EXPECT_EQ(one.group_count(GroupKind::context), 8);
  EXPECT_EQ(one.group_size(GroupKind::data), 8);  // 4 replicas x 2 context ranks
  const TedLayout staged(16, 2, 2, RankLayout::ted, true, 2, 2);
  EXPECT_EQ(staged.group_members(GroupKind::context, 9), (std::vector<int>{9, 11}));
  EXPECT_EQ(staged.group_members(GroupKind::context, 12), (std::vector<int>{12, 14}));
  // The context groups partition the ranks: every index in range, every group of cp ranks.
  std::vector<int> members(std::size_t(staged.group_count(GroupKind::context)), 0);
  for (int r = 0; r < 16; ++r) {
    const int g = staged.group_index(GroupKind::context, r);
    ASSERT_GE(g, 0);
    ASSERT_LT(g, staged.group_count(GroupKind::context));
    ++members[std::size_t(g)];
  }
  EXPECT_TRUE(std::all_of(members.begin(), members.end(), [](int n) { return n == 2; }));
}

TEST(ContextParallel, ReplicasAreTheStageOverTensorAndContext) {
  ParallelConfig c = test::config(64, 4, 1, 1, 64);
  c.pp = 2;
  c.cp = 2;
  EXPECT_EQ(c.dp(), 4);
  EXPECT_EQ(c.dp_with_cp(), 8);
  EXPECT_EQ(c.grad_accum(), 16);
  EXPECT_NE(c.describe().find("t=4 c=2 e=1 d=4"), std::string::npos) << c.describe();
}

// Llama 3.1 70B on 16 H100s at t = 8: context ranks on two nodes. Each rank holds half of each
// sequence: half the GEMM rows, half of the causal core (load-balanced), and passes its keys and
// values (one local key head of 128, keys and values) around the ring.
TEST(ContextParallel, EachRankComputesItsShareAndRingsTheKeysAndValues) {
  const test::Bench bench(llama_flash(), "dgx-h100");
  ParallelConfig c = test::config(16, 8, 1, 1, 32);
  c.recompute = Recompute::none;
  c.seq_len = 8192;
  const Workload one = bench.workload(c);
  c.cp = 2;
  const Workload two = bench.workload(c);
  EXPECT_EQ(two.shape.tokens, one.shape.tokens / 2);
  const Op* core1 = find_op(one.dense.forward, "attn_core");
  const Op* core2 = find_op(two.dense.forward, "attn_core");
  ASSERT_NE(core1, nullptr);
  ASSERT_NE(core2, nullptr);
  EXPECT_NEAR(core2->flops, core1->flops / 2, 1e-6 * core1->flops);
  EXPECT_NEAR(find_op(two.dense.forward, "qkv_proj")->flops, find_op(one.dense.forward, "qkv_proj")->flops / 2, 1.0);
  EXPECT_EQ(find_op(one.dense.forward, "cp_kv_exchange"), nullptr);
  const Op* ring = find_op(two.dense.forward, "cp_kv_exchange");
  ASSERT_NE(ring, nullptr);
  EXPECT_EQ(ring->group, GroupKind::context);
  EXPECT_EQ(ring->phase, Phase::cp_ring);
  EXPECT_DOUBLE_EQ(ring->bytes, 2.0 * double(two.shape.tokens) * (2 * 128) * 2);
  // What the core's steps do not cover stays exposed; here the core covers all of it.
  const double full = bench.evaluator.spans_for(c).context.seconds(bench.profile, CollectiveOp::all_gather, ring->bytes);
  EXPECT_GT(full, 0.0);
  EXPECT_EQ(bench.evaluator.spans_for(c).context.widest().nodes, 2);
  EXPECT_LE(ring->seconds, full);
  EXPECT_GE(ring->seconds, std::max(0.0, full - core2->seconds / 2) - 1e-12);
  // Backward sends the gradients beside the keys and values: twice the bytes, under the backward core.
  const Op* back = find_op(two.dense.backward, "cp_kv_exchange");
  ASSERT_NE(back, nullptr);
  EXPECT_DOUBLE_EQ(back->bytes, 2.0 * ring->bytes);
  const double back_full = bench.evaluator.spans_for(c).context.seconds(bench.profile, CollectiveOp::all_gather, back->bytes);
  EXPECT_NEAR(back->seconds, std::max(0.0, back_full - find_op(two.dense.backward, "attn_core")->seconds / 2), 1e-12);

  // On one node's NVLink a slow enough core hides the ring; on links slow enough it shows.
  TopologySpec slow = bench.topo;
  slow.inter.bandwidth_gbs = 0.1;
  const AnalyticProfile slow_profile(slow);
  const Evaluator slow_eval(bench.m, slow, slow_profile);
  const Workload exposed = build_workload(bench.m, c, slow_profile, slow_eval.spans_for(c));
  EXPECT_GT(exposed.dense.forward.phase_seconds[int(Phase::cp_ring)], 0.0);
}

// Communication-aware checkpointing stashes the collectives' outputs, but not the ring's gathered
// keys and values: full recompute replays the ring either way.
TEST(ContextParallel, RecomputeReplaysTheRingEvenUnderCac) {
  const test::Bench bench(llama_flash(), "dgx-h100");
  ParallelConfig c = test::config(16, 8, 1, 1, 32);
  c.seq_len = 8192;
  c.cp = 2;
  c.recompute = Recompute::full;
  c.cac = true;
  const Workload w = bench.workload(c);
  EXPECT_NE(find_op(w.dense.recompute, "cp_kv_exchange"), nullptr);
  EXPECT_EQ(find_op(w.dense.recompute, "tp_allreduce_attn"), nullptr);  // stashed by CAC
}

// Megatron-Core runs context parallelism in Transformer Engine's attention only.
TEST(ContextParallel, NeedsTheFusedCore) {
  ParallelConfig c = test::config(16, 8, 1, 1, 32);
  c.seq_len = 8192;
  c.cp = 2;
  EXPECT_NE(config_violation(c, test::model("hf/llama-3.1-70b")).find("fused attention core"), std::string::npos);
  EXPECT_EQ(config_violation(c, llama_flash()), "");
}

// The search reuses a workload only between plans of the same context degree: its best plan is
// the best of every plan evaluated on its own.
TEST(ContextParallel, SearchRanksEachContextDegreeOnItsOwnWorkload) {
  const test::Bench bench(llama_flash(), "dgx-h100");
  SearchSpace space;
  space.gpus = 16;
  space.global_batch = 16;
  space.seq_len = 16384;
  space.max_pp = 2;
  space.max_cp = 4;
  space.zero_stages = {1};
  const std::vector<ParallelConfig> configs = enumerate_configs(bench.m, space);
  double best = 0;
  std::string best_plan;
  for (const ParallelConfig& c : configs) {
    const Prediction p = bench.evaluator.evaluate(c);
    if (p.fits() && p.tokens_per_s > best) {
      best = p.tokens_per_s;
      best_plan = c.describe();
    }
  }
  const SearchResult r = run_search(bench.evaluator, space, 1, {}, 1);
  ASSERT_FALSE(r.top.empty());
  EXPECT_EQ(r.top.front().config.describe(), best_plan);
  EXPECT_NEAR(r.top.front().tokens_per_s, best, 1e-9 * best);
}

TEST(ContextParallel, ActivationsSplitWithTheSequence) {
  const test::Bench bench(llama_flash(), "dgx-h100");
  ParallelConfig c = test::config(16, 8, 1, 1, 32);
  c.recompute = Recompute::none;
  c.seq_len = 8192;
  const Prediction one = bench.evaluator.evaluate(c);
  c.cp = 2;
  const Prediction two = bench.evaluator.evaluate(c);
  EXPECT_NEAR(two.memory.activations / one.memory.activations, 0.5, 0.02);
  EXPECT_DOUBLE_EQ(two.memory.weights, one.memory.weights);
  EXPECT_GT(two.sim.iteration_s, 0.0);
}

TEST(ContextParallel, SearchTriesContextDegreesOnlyWhenAsked) {
  const ModelSpec m = llama_flash();
  SearchSpace space;
  space.gpus = 32;
  space.global_batch = 32;
  space.seq_len = 8192;
  space.max_pp = 4;
  const auto none = enumerate_configs(m, space);
  EXPECT_TRUE(std::all_of(none.begin(), none.end(), [](const ParallelConfig& c) { return c.cp == 1; }));
  space.max_cp = 4;
  const auto some = enumerate_configs(m, space);
  EXPECT_GT(some.size(), none.size());
  EXPECT_TRUE(std::any_of(some.begin(), some.end(), [](const ParallelConfig& c) { return c.cp == 4; }));
  EXPECT_TRUE(std::all_of(some.begin(), some.end(), [](const ParallelConfig& c) { return c.cp <= 4; }));
}

}  // namespace
}  // namespace tedsim
