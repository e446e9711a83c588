// Collective counts and bytes per layer, DTD and CAC, hand-computed for small configurations.
#include <gtest/gtest.h>

#include "test_helpers.hpp"

namespace tedsim {
namespace {

constexpr auto AR = CollectiveOp::all_reduce;
constexpr auto AG = CollectiveOp::all_gather;
constexpr auto A2A = CollectiveOp::all_to_all;

int per_microbatch(const LayerBlocks& l, CollectiveOp op, GroupKind g) {
  return l.forward.count_collectives(op, g) + l.recompute.count_collectives(op, g) +
         l.backward.count_collectives(op, g);
}

// ted-1.3b with 16 experts, 16 devices, t=2, e=4, b=1: T = 2048 tokens, C = ceil(2048/16) = 128.
class Ted13Layers : public ::testing::Test {
 protected:
  test::Bench bench{test::model("ted-1.3b"), "thetagpu"};
  ParallelConfig base() const {
    ParallelConfig c = test::config(16, 2, 4, 1, 64);
    c.recompute = Recompute::full;
    c.cac = false;
    c.dtd = false;
    return c;
  }
  const double h = 2048, T = 2048, E = 16, C = 128, bytes = 2;
};

TEST_F(Ted13Layers, ResolvedShape) {
  const Workload w = bench.workload(base());
  EXPECT_EQ(w.shape.tokens, 2048);
  EXPECT_EQ(w.shape.capacity, 128);
  EXPECT_EQ(w.shape.local_experts, 4);
  EXPECT_EQ(w.shape.expert_rows, 4 * 128);  // e * C tokens per local expert
}

TEST_F(Ted13Layers, CheckpointingGivesSixAllToAllsAndSixAllReducesPerMoeLayer) {
  const Workload w = bench.workload(base());
  EXPECT_EQ(per_microbatch(w.moe, A2A, GroupKind::expert), 6);
  EXPECT_EQ(per_microbatch(w.moe, AR, GroupKind::tensor), 6);
  EXPECT_EQ(per_microbatch(w.dense, AR, GroupKind::tensor), 6);
  EXPECT_EQ(per_microbatch(w.dense, A2A, GroupKind::expert), 0);
}

TEST_F(Ted13Layers, CacTakesMoeLayersFromSixPlusSixToFourPlusFour) {
  ParallelConfig c = base();
  c.cac = true;
  const Workload w = bench.workload(c);
  EXPECT_EQ(per_microbatch(w.moe, A2A, GroupKind::expert), 4);
  EXPECT_EQ(per_microbatch(w.moe, AR, GroupKind::tensor), 4);
  EXPECT_EQ(per_microbatch(w.dense, AR, GroupKind::tensor), 4);
  EXPECT_EQ(w.moe.recompute.count_collectives(A2A, GroupKind::expert), 0);
}

TEST_F(Ted13Layers, WithoutCheckpointingThereIsNoRecompute) {
  ParallelConfig c = base();
  c.recompute = Recompute::none;
  const Workload w = bench.workload(c);
  EXPECT_EQ(w.moe.recompute.count, 0);
  EXPECT_EQ(per_microbatch(w.moe, A2A, GroupKind::expert), 4);
  EXPECT_EQ(per_microbatch(w.moe, AR, GroupKind::tensor), 4);
}

TEST_F(Ted13Layers, CollectiveBytesPerLayer) {
  const Workload w = bench.workload(base());
  // Each all-to-all moves the whole [E, C, h] buffer of a rank; each tensor all-reduce T*h
  // (attention) or the local experts' E/e * e*C rows of h (expert tensor parallelism).
  EXPECT_DOUBLE_EQ(w.moe.forward.collective_bytes(A2A, GroupKind::expert), 2 * E * C * h * bytes);
  EXPECT_DOUBLE_EQ(w.moe.forward.collective_bytes(AR, GroupKind::tensor), T * h * bytes + E * C * h * bytes);
  EXPECT_DOUBLE_EQ(w.dense.forward.collective_bytes(AR, GroupKind::tensor), 2 * T * h * bytes);
  EXPECT_EQ(w.moe.forward.count_collectives(AG, GroupKind::tensor), 0);
}

TEST_F(Ted13Layers, DtdDividesAllToAllBytesByTAndAddsTensorAllGathers) {
  ParallelConfig c = base();
  const Workload plain = bench.workload(c);
  c.dtd = true;
  const Workload dtd = bench.workload(c);
  EXPECT_DOUBLE_EQ(dtd.moe.forward.collective_bytes(A2A, GroupKind::expert) * 2,
                   plain.moe.forward.collective_bytes(A2A, GroupKind::expert));
  EXPECT_DOUBLE_EQ(dtd.moe.backward.collective_bytes(A2A, GroupKind::expert) * 2,
                   plain.moe.backward.collective_bytes(A2A, GroupKind::expert));
  // Forward: gather before the experts and after the all-to-all back; backward mirrors both.
  EXPECT_EQ(dtd.moe.forward.count_collectives(AG, GroupKind::tensor), 2);
  EXPECT_EQ(dtd.moe.backward.count_collectives(AG, GroupKind::tensor), 2);
  EXPECT_DOUBLE_EQ(dtd.moe.forward.collective_bytes(AG, GroupKind::tensor), 2 * E * C * h * bytes);
  // Everything else is unchanged.
  EXPECT_EQ(per_microbatch(dtd.moe, AR, GroupKind::tensor), per_microbatch(plain.moe, AR, GroupKind::tensor));
  EXPECT_DOUBLE_EQ(dtd.dense.forward.seconds, plain.dense.forward.seconds);
}

TEST(Dtd, IsANoOpAtTensorDegreeOne) {
  test::Bench bench(test::model("ted-1.3b"), "thetagpu");
  ParallelConfig c = test::config(16, 1, 4, 1, 64);
  const Workload plain = bench.workload(c);
  c.dtd = true;
  const Workload dtd = bench.workload(c);
  for (const auto op : {AR, AG, A2A})
    for (const auto g : {GroupKind::tensor, GroupKind::expert}) {
      EXPECT_EQ(dtd.moe.forward.count_collectives(op, g), plain.moe.forward.count_collectives(op, g));
      EXPECT_DOUBLE_EQ(dtd.moe.forward.collective_bytes(op, g), plain.moe.forward.collective_bytes(op, g));
    }
  EXPECT_DOUBLE_EQ(dtd.moe.forward.seconds, plain.moe.forward.seconds);
  EXPECT_DOUBLE_EQ(dtd.moe.backward.seconds, plain.moe.backward.seconds);
}

TEST(Collectives, GroupsOfOneRankVanish) {
  test::Bench bench(test::model("ted-1.3b"), "thetagpu");
  const Workload w = bench.workload(test::config(8, 1, 1, 1, 64));
  for (const auto op : {AR, AG, A2A}) {
    EXPECT_EQ(w.moe.forward.count_collectives(op, GroupKind::tensor), 0);
    EXPECT_EQ(w.moe.forward.count_collectives(op, GroupKind::expert), 0);
  }
}

TEST(Collectives, WithoutExpertTensorParallelismThereIsNoExpertAllReduce) {
  test::Bench bench(test::model("ted-1.3b"), "thetagpu");
  ParallelConfig c = test::config(16, 2, 4, 1, 64);
  c.expert_tp = false;
  c.dtd = true;
  const Workload w = bench.workload(c);
  EXPECT_EQ(w.moe.forward.count_collectives(AR, GroupKind::tensor), 1);  // attention only
  EXPECT_EQ(w.moe.forward.count_collectives(AG, GroupKind::tensor), 1);  // after the all-to-all back
  EXPECT_EQ(w.shape.expert_rows, 4 * 64);                                 // e * C/t tokens, whole experts
  EXPECT_EQ(w.shape.ffn_local, 8192);
}

}  // namespace
}  // namespace tedsim
