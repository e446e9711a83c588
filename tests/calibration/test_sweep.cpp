// What a calibration measures: the model's shapes by default, a generic grid with --grid.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tedsim/calibration/bench.hpp"
#include "tedsim/calibration/sweep.hpp"
#include "tedsim/comm/collective_check.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/model/workload.hpp"

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

// The loss is timed on the step's own three passes, at the sizes the job's loss asks about (its
// forward and backward bytes), and the point is checked against the double reference first.
TEST(Sweep, TheLossIsTimedOnTheStepsOwnPasses) {
  SweepOptions o;
  o.gpus = o.world = 2;
  o.quick = true;
  const ModelSpec m = model("cpu-moe");
  const Sweep s = derive_sweep(m, local_cpu(), o);
  std::vector<double> sizes;
  for (const KernelCase& k : s.kernels)
    if (k.kind == KernelKind::cross_entropy) sizes.push_back(k.bytes);
  ASSERT_FALSE(sizes.empty());
  // One micro-batch of cpu-moe's loss: 128 tokens x 2048 logits, 12 bytes each forward.
  const double forward = 12.0 * 128 * m.vocab;
  EXPECT_LE(*std::min_element(sizes.begin(), sizes.end()), forward);
  EXPECT_GE(*std::max_element(sizes.begin(), sizes.end()), forward);

  const auto bench = make_cpu_bench();
  const Prepared p = bench->kernel(KernelKind::cross_entropy, forward, m);
  ASSERT_TRUE(bool(p));
  EXPECT_EQ(p.check(), 0);
  EXPECT_GT(p.bytes, forward / 2);
  EXPECT_LE(p.bytes, forward);
  for (double t : bench->time(p, 1, 3, 1.0)) EXPECT_GT(t, 0.0);
}

// Beside the factor-2 grid, each op is measured at the sizes the job's own messages have (a
// library's algorithm can change between two grid sizes): cpu-moe's gradient reduce-scatter on 2
// ranks is 10.5 MiB, between the grid's 8 and 16 MiB.
TEST(Sweep, TheJobsOwnMessageSizesJoinTheGrid) {
  SweepOptions o;
  o.gpus = o.world = 2;
  o.ranks_per_node = 2;
  const Sweep s = derive_sweep(model("cpu-moe"), local_cpu(), o);
  const std::vector<std::int64_t> grid = sweep_counts(s.min_bytes, s.max_bytes, s.step_factor, o.dtype);
  const std::set<std::int64_t> on_grid(grid.begin(), grid.end());
  std::map<std::tuple<int, int>, std::set<std::int64_t>> off_grid, all;  // by (op, group ranks)
  for (const CollectiveCaseSpec& c : s.collectives) {
    all[{int(c.op), c.span.ranks}].insert(c.count);
    if (!on_grid.count(c.count)) off_grid[{int(c.op), c.span.ranks}].insert(c.count);
  }
  for (const auto& [key, counts] : all)
    for (std::int64_t g : grid) EXPECT_TRUE(counts.count(g)) << "grid size " << g << " missing for op " << std::get<0>(key);
  const auto rs = off_grid.find({int(CollectiveOp::reduce_scatter), 2});
  ASSERT_NE(rs, off_grid.end());
  bool gradient_sync = false;
  for (std::int64_t count : rs->second) {
    EXPECT_GE(count * 4, 256 * 1024);
    gradient_sync |= count * 4 > (8 << 20) && count * 4 < (16 << 20);
  }
  EXPECT_TRUE(gradient_sync);
  for (const auto& [key, counts] : off_grid) EXPECT_LE(counts.size(), 12u);
}

// Pipeline configurations of the world add the p2p exchange on the pipeline groups, labelled with
// the span the cost model looks up (a pair); the GPU sweep too (NCCL's point-to-point lanes).
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

// A dropless model's expert groups also time the all-to-all-v its dispatcher calls, split as the
// model's imbalance loads the busiest rank; capacity routing sends even all-to-alls only.
TEST(Sweep, DroplessExpertGroupsAddTheUnevenAllToAllV) {
  SweepOptions o;
  o.gpus = o.world = 2;
  o.ranks_per_node = 2;
  o.quick = true;
  const ModelSpec fine = model("cpu-moe-fine");  // 16 experts, dropless, imbalance 1.2
  int v = 0;
  for (const CollectiveCaseSpec& c : derive_sweep(fine, local_cpu(), o).collectives)
    if (c.op == CollectiveOp::all_to_all_v) {
      ++v;
      EXPECT_EQ(c.kind, GroupKind::expert);
      EXPECT_DOUBLE_EQ(c.busiest_load, busiest_rank_load(16, c.span.ranks, 1.2));
      EXPECT_GT(c.busiest_load, 1.0);
    }
  EXPECT_GT(v, 0);
  for (const CollectiveCaseSpec& c : derive_sweep(model("tiny-moe"), local_cpu(), o).collectives)
    EXPECT_NE(c.op, CollectiveOp::all_to_all_v);
}

// FP8 training on a GPU: the linears' GEMMs are timed in FP8, on cuBLASLt's layouts (dimensions
// rounded up to multiples of 16, as Transformer Engine pads them); the output layer's and the
// router's stay in the storage dtype, as Megatron-Core runs them.
TEST(Sweep, Fp8ModelsTimeTheLinearsInFp8AndTheRestInBf16) {
  ModelSpec m = model("cpu-qwen-moe");
  m.dtype = Dtype::fp8;
  SweepOptions o;
  o.gpus = o.world = 2;
  o.quick = true;
  o.gpu = true;
  o.dtype = Dtype::bf16;
  o.fp8_gemms = true;
  int fp8 = 0, bf16 = 0;
  bool output_layer = false;
  for (const GemmCase& g : derive_sweep(m, local_cpu(), o).gemms) {
    if (g.shape.dtype == Dtype::fp8) {
      ++fp8;
      EXPECT_EQ(g.shape.m % 16, 0);
      EXPECT_EQ(g.shape.n % 16, 0);
      EXPECT_EQ(g.shape.k % 16, 0);
    } else {
      EXPECT_EQ(g.shape.dtype, Dtype::bf16);
      ++bf16;
      output_layer |= g.shape.n == m.vocab || g.shape.n == m.vocab / 2;  // the vocabulary, whole or split over t = 2
    }
  }
  EXPECT_GT(fp8, 0);
  EXPECT_GT(bf16, 0);
  EXPECT_TRUE(output_layer);
  // A model in bf16 (or without FP8 GEMMs asked for) measures every GEMM in the one dtype.
  o.fp8_gemms = false;
  for (const GemmCase& g : derive_sweep(m, local_cpu(), o).gemms) EXPECT_EQ(g.shape.dtype, Dtype::bf16);
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
