// The arrival wait at blocking collectives in the timeline (sim/arrival_skew.hpp): where it lands,
// how much, and which groups meet which.
#include <gtest/gtest.h>

#include "test_helpers.hpp"
#include "tedsim/sim/simulator.hpp"
#include "tedsim/sim/trace.hpp"

namespace tedsim {
namespace {

// The analytic profile, whose ranks wait `fraction` of the compute since their group last met.
class SkewedProfile final : public Profile {
 public:
  SkewedProfile(const TopologySpec& topology, double fraction) : inner_(topology), fraction_(fraction) {}
  double gemm_seconds(const GemmShape& s) const override { return inner_.gemm_seconds(s); }
  double kernel_seconds(KernelKind k, double b, Dtype d) const override { return inner_.kernel_seconds(k, b, d); }
  double collective_seconds(CollectiveOp op, const GroupSpan& s, double b) const override {
    return inner_.collective_seconds(op, s, b);
  }
  double p2p_seconds(const GroupSpan& s, double b) const override { return inner_.p2p_seconds(s, b); }
  double arrival_wait_seconds(const GroupSpan& s, double compute_s) const override {
    return s.ranks > 1 ? fraction_ * compute_s : 0.0;
  }
  std::string describe() const override { return "skewed analytic"; }

 private:
  AnalyticProfile inner_;
  double fraction_;
};

constexpr double kFraction = 0.05;

struct Pair {
  Prediction lined_up, skewed;
};

Pair predict(const ParallelConfig& c) {
  const ModelSpec m = test::model("cpu-moe");
  const TopologySpec topo = test::topology("local-cpu");
  const SkewedProfile none(topo, 0.0), skewed(topo, kFraction);
  return {Evaluator(m, topo, none).evaluate(c), Evaluator(m, topo, skewed).evaluate(c)};
}

ParallelConfig two_ranks(int tp, int ep) {
  ParallelConfig c = test::config(2, tp, ep, 2, 8);
  c.zero = 0;
  c.recompute = Recompute::none;
  return c;
}

double added(const Pair& p, Phase phase) { return p.skewed.sim.exposed[int(phase)] - p.lined_up.sim.exposed[int(phase)]; }

TEST(ArrivalSkew, LinedUpRanksPredictWhatTheAnalyticProfileDoes) {
  const ParallelConfig c = two_ranks(2, 1);
  const ModelSpec m = test::model("cpu-moe");
  const TopologySpec topo = test::topology("local-cpu");
  const AnalyticProfile analytic(topo);
  EXPECT_DOUBLE_EQ(Evaluator(m, topo, analytic).evaluate(c).sim.iteration_s, predict(c).lined_up.sim.iteration_s);
}

TEST(ArrivalSkew, DataParallelismAloneMeetsOnceWithTheWholeIterationsDrift) {
  // t = 1, e = 1: no collective inside the layers, so the gradient sync after the last micro-batch
  // waits for every pass of the iteration's drift, and nothing else changes.
  const Pair p = predict(two_ranks(1, 1));
  const double passes = p.lined_up.sim.stages[0].busy_s;
  EXPECT_NEAR(added(p, Phase::dp_grad_sync), kFraction * passes, 1e-9 * passes);
  EXPECT_NEAR(p.skewed.sim.iteration_s - p.lined_up.sim.iteration_s, kFraction * passes, 1e-9 * passes);
  EXPECT_DOUBLE_EQ(added(p, Phase::compute), 0);
}

TEST(ArrivalSkew, LayerCollectivesWaitInTheirOwnPhaseAndTheIterationByAsMuch) {
  const Pair p = predict(two_ranks(2, 1));
  EXPECT_GT(added(p, Phase::tp_allreduce), 0);
  EXPECT_DOUBLE_EQ(added(p, Phase::dp_grad_sync), 0);  // d = 1: no gradient sync
  EXPECT_DOUBLE_EQ(added(p, Phase::compute), 0);
  double sum = 0;
  for (int i = 0; i < kPhaseCount; ++i) sum += added(p, Phase(i));
  EXPECT_NEAR(p.skewed.sim.iteration_s - p.lined_up.sim.iteration_s, sum, 1e-12);
  // Each wait is a share of the compute since the one before: together no more than that share
  // of all the compute, and (collectives every layer) far more than a single layer's.
  EXPECT_LE(sum, kFraction * p.lined_up.sim.iteration_s);
  EXPECT_GT(sum, 0.5 * kFraction * p.lined_up.sim.exposed[int(Phase::compute)]);
}

TEST(ArrivalSkew, AnAllToAllMeetsTheDataGroupInsideIt) {
  // t = 1, e = 2 on 2 ranks: the expert group is the data group, so the gradient sync waits only
  // for the drift since the last all-to-all, far less than data parallelism alone does.
  const Pair moe = predict(two_ranks(1, 2));
  const Pair dp = predict(two_ranks(1, 1));
  EXPECT_GT(added(moe, Phase::ep_alltoall), 0);
  EXPECT_LT(added(moe, Phase::dp_grad_sync), 0.2 * added(dp, Phase::dp_grad_sync));
}

TEST(ArrivalSkew, TheOneStageShortcutMatchesTheFullTimeline) {
  // A traced simulation runs every micro-batch through the timeline; an untraced one of one stage
  // runs one and adds the others: their waits must agree.
  const ModelSpec m = test::model("cpu-moe");
  const TopologySpec topo = test::topology("local-cpu");
  const SkewedProfile skewed(topo, kFraction);
  const Evaluator evaluator(m, topo, skewed);
  for (const auto& [tp, ep] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{1, 2}}) {
    const ParallelConfig c = two_ranks(tp, ep);
    const Workload w = build_workload(m, c, skewed, evaluator.spans_for(c));
    ASSERT_GT(w.shape.ga, 1);
    TraceRecorder trace;
    const SimResult full = simulate_iteration(m, c, w, &trace), shortcut = simulate_iteration(m, c, w);
    EXPECT_NEAR(shortcut.iteration_s, full.iteration_s, 1e-9 * full.iteration_s) << c.describe();
    for (int i = 0; i < kPhaseCount; ++i)
      EXPECT_NEAR(shortcut.exposed[i], full.exposed[i], 1e-9 * full.iteration_s) << c.describe() << " " << to_string(Phase(i));
  }
}

TEST(ArrivalSkew, MultiTokenPredictionModulesWaitAtTheirCollectivesToo) {
  // The modules' entry blocks are part of the timeline's walk: their tensor-group gathers wait.
  const ModelSpec m = test::model("cpu-deepseek-moe");
  ASSERT_GT(m.mtp_layers, 0);
  ModelSpec without = m;
  without.mtp_layers = 0;
  const TopologySpec topo = test::topology("local-cpu");
  const SkewedProfile skewed(topo, kFraction);
  const ParallelConfig c = two_ranks(2, 1);
  const Prediction with_mtp = Evaluator(m, topo, skewed).evaluate(c);
  const Prediction plain = Evaluator(without, topo, skewed).evaluate(c);
  EXPECT_GT(with_mtp.sim.exposed[int(Phase::tp_allreduce)] + with_mtp.sim.exposed[int(Phase::tp_allgather)],
            plain.sim.exposed[int(Phase::tp_allreduce)] + plain.sim.exposed[int(Phase::tp_allgather)]);
  EXPECT_GT(with_mtp.sim.iteration_s, plain.sim.iteration_s);
}

TEST(MeanRank, DroplessRanksOfMeanLoadWaitInTheAllToAllForTheBusiest) {
  // The prediction times the busiest rank; a rank of mean load runs its experts' rows (the layout
  // copies, the grouped GEMMs, the activation) in 1/load_factor of that and waits the rest in the
  // next all-to-all. The per-rank mean that validate compares with moves exactly that share, and
  // keeps the sum.
  const ModelSpec m = test::model("cpu-moe-fine");
  ASSERT_TRUE(m.moe.dropless());
  const TopologySpec topo = test::topology("local-cpu");
  const AnalyticProfile profile(topo);
  const Evaluator evaluator(m, topo, profile);
  const ParallelConfig c = two_ranks(1, 2);
  const Workload w = build_workload(m, c, profile, evaluator.spans_for(c));
  ASSERT_GT(w.shape.load_factor, 1.0);
  const SimResult r = simulate_iteration(m, c, w);
  double expert_s = 0, activation_s = 0;
  for (const Block* b : {&w.moe.forward, &w.moe.recompute, &w.moe.backward})
    for (int i = 0; i < b->count; ++i) {
      const std::string name = b->ops[i].name;
      if (name.rfind("expert_", 0) == 0 && !b->ops[i].is_collective) expert_s += b->ops[i].seconds;
      if (name == "expert_activation") activation_s += b->ops[i].seconds;
    }
  ASSERT_GT(activation_s, 0);  // not the GEMMs alone
  int moe_layers = 0;
  for (int layer = 0; layer < m.layers; ++layer) moe_layers += m.is_moe_layer(layer);
  const double shift = expert_s * moe_layers * w.shape.ga * (1 - 1 / w.shape.load_factor);
  ASSERT_GT(shift, 0);
  EXPECT_NEAR(r.exposed[int(Phase::compute)] - r.mean_exposed[int(Phase::compute)], shift, 1e-12);
  EXPECT_NEAR(r.mean_exposed[int(Phase::ep_alltoall)] - r.exposed[int(Phase::ep_alltoall)], shift, 1e-12);
  // Capacity mode: every rank runs C tokens per expert, the mean rank is the busiest.
  ModelSpec capacity = m;
  capacity.moe.capacity_factor = 1.25;
  const Workload wc = build_workload(capacity, c, profile, evaluator.spans_for(c));
  const SimResult rc = simulate_iteration(capacity, c, wc);
  EXPECT_EQ(rc.mean_exposed, rc.exposed);
}

}  // namespace
}  // namespace tedsim
