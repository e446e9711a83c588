// What a calibration measures: the model's shapes by default, a generic grid with --grid.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tedsim/calibration/sweep.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim::calibration {
namespace {

ModelSpec model(const std::string& name) { return load_model(std::string(TEDSIM_SOURCE_DIR) + "/models/" + name + ".yaml"); }
TopologySpec local_cpu() { return load_topology(std::string(TEDSIM_SOURCE_DIR) + "/topologies/local-cpu.yaml"); }

std::set<std::tuple<long, long, long>> shapes(const Sweep& s) {
  std::set<std::tuple<long, long, long>> out;
  for (const GemmCase& g : s.gemms) out.insert({long(g.shape.m), long(g.shape.n), long(g.shape.k)});
  return out;
}

TEST(Sweep, ModelShapesFollowTheModelAndTheGridDoesNot) {
  SweepOptions o;
  o.gpus = o.world = 2;
  o.quick = true;
  const Sweep tiny = derive_sweep(model("tiny-moe"), local_cpu(), o);
  const Sweep other = derive_sweep(model("cpu-moe"), local_cpu(), o);
  EXPECT_NE(shapes(tiny), shapes(other));
  o.grid = true;
  const Sweep grid_tiny = derive_sweep(model("tiny-moe"), local_cpu(), o);
  const Sweep grid_other = derive_sweep(model("cpu-moe"), local_cpu(), o);
  EXPECT_EQ(shapes(grid_tiny), shapes(grid_other));
  EXPECT_TRUE(shapes(grid_tiny).count({64, 64, 64}));
  EXPECT_TRUE(shapes(grid_tiny).count({1024, 1024, 1024}));
  EXPECT_GT(grid_tiny.kernels.size(), tiny.kernels.size());
  // Collectives follow the TED groups of the world either way.
  EXPECT_EQ(grid_tiny.collectives.size(), tiny.collectives.size());
}

// Pipeline configurations of the world add the p2p exchange on the pipeline groups, labelled with
// the span the cost model looks up (a pair); the GPU sweep leaves it out (no NCCL p2p yet).
TEST(Sweep, PipelineStagesAddTheSendRecvExchange) {
  SweepOptions o;
  o.gpus = o.world = 4;
  o.ranks_per_node = 4;
  o.quick = true;
  const Sweep s = derive_sweep(model("tiny-moe"), local_cpu(), o);
  int send_recv = 0;
  for (const CollectiveCaseSpec& c : s.collectives)
    if (c.op == CollectiveOp::send_recv) {
      ++send_recv;
      EXPECT_EQ(c.kind, GroupKind::pipeline);
      EXPECT_GT(c.p, 1);
      EXPECT_EQ(c.span.ranks, 2);
      EXPECT_EQ(c.span.nodes, 1);
    }
  EXPECT_GT(send_recv, 0);
  o.gpu = true;  // NCCL's point-to-point lanes: the same exchange
  int on_gpu = 0;
  for (const CollectiveCaseSpec& c : derive_sweep(model("tiny-moe"), local_cpu(), o).collectives)
    on_gpu += c.op == CollectiveOp::send_recv;
  EXPECT_GT(on_gpu, 0);
  o.gpu = false;
  o.gpus = o.world = 1;
  for (const CollectiveCaseSpec& c : derive_sweep(model("tiny-moe"), local_cpu(), o).collectives)
    EXPECT_NE(c.op, CollectiveOp::send_recv);
}

// More ranks on one host than the topology's node (4 ranks on a host, local-cpu's nodes have 2):
// the placed node is one island, so no group crosses islands and no series is measured twice.
TEST(Sweep, RanksPlacedOnOneHostNeverCrossIslands) {
  SweepOptions o;
  o.gpus = o.world = 4;
  o.ranks_per_node = 4;
  o.quick = true;
  const Sweep s = derive_sweep(model("tiny-moe"), local_cpu(), o);
  ASSERT_FALSE(s.collectives.empty());
  std::set<std::tuple<int, int, int, int, int, bool, std::int64_t>> seen;
  for (const CollectiveCaseSpec& c : s.collectives) {
    EXPECT_FALSE(c.span.crosses_islands) << to_string(c.op) << " over " << c.span.ranks << " ranks";
    EXPECT_EQ(c.span.nodes, 1);
    EXPECT_TRUE(seen.insert({int(c.op), c.span.ranks, c.span.nodes, c.span.max_ranks_per_node, c.span.groups_per_node,
                             c.span.crosses_islands, c.count})
                    .second)
        << "measured twice: " << to_string(c.op) << " over " << c.span.ranks << " ranks, count " << c.count;
  }
}

TEST(Sweep, RanksMustBePlacedInBlocksPerHost) {
  using Hosts = std::vector<std::string>;
  EXPECT_NO_THROW(require_block_placement(Hosts{"a"}));
  EXPECT_NO_THROW(require_block_placement(Hosts{"a", "a", "b", "b"}));
  EXPECT_NO_THROW(require_block_placement(Hosts{"a", "a", "a", "b"}));  // a partly filled last host
  try {
    require_block_placement(Hosts{"a", "b", "a", "b"});  // round-robin (mpirun --map-by node)
    ADD_FAILURE() << "round-robin placement accepted";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 1 runs on b, rank 0 on a"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--map-by slot"), std::string::npos) << msg;
  }
  EXPECT_THROW(require_block_placement(Hosts{"a", "b", "b", "b"}), InputError);  // first host short
}

}  // namespace
}  // namespace tedsim::calibration
