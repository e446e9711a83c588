// The iteration timeline: attribution sums, overlap of gradient sync with backward, traces.
#include <gtest/gtest.h>

#include <numeric>

#include "test_helpers.hpp"
#include "tedsim/sim/trace.hpp"

namespace tedsim {
namespace {

double sum(const PhaseTimes& t) { return std::accumulate(t.begin(), t.end(), 0.0); }

TEST(Simulator, ExposedTimesSumToIterationAndNeverExceedBusy) {
  test::Bench bench(test::model("ted-6.7b"), "summit");
  for (int zero : {0, 1, 2}) {
    ParallelConfig c = test::config(128, 2, 16, 1, 1024);
    c.zero = zero;
    c.dtd = c.cac = true;
    const Prediction p = bench.evaluator.evaluate(c);
    EXPECT_NEAR(sum(p.sim.exposed), p.sim.iteration_s, 1e-9 * p.sim.iteration_s) << "zero " << zero;
    for (int i = 0; i < kPhaseCount; ++i) EXPECT_LE(p.sim.exposed[i], p.sim.busy[i] * (1 + 1e-12) + 1e-15);
  }
}

TEST(Simulator, GradientSyncOverlapsTheLastBackward) {
  test::Bench bench(test::model("ted-1.3b"), "thetagpu");
  ParallelConfig c = test::config(64, 1, 16, 1, 64);
  c.zero = 0;
  const Prediction p = bench.evaluator.evaluate(c);
  const double busy = p.sim.busy[int(Phase::dp_grad_sync)];
  const double exposed = p.sim.exposed[int(Phase::dp_grad_sync)];
  ASSERT_GT(busy, 0);
  EXPECT_LT(exposed, busy);  // some of it hides under backward compute
  EXPECT_GT(p.sim.grad_buckets, 1);
}

TEST(Simulator, MicrobatchesAddTheirComputeAndSyncOnlyOnce) {
  test::Bench bench(test::model("ted-1.3b"), "thetagpu");
  ParallelConfig one = test::config(16, 2, 4, 1, 8);
  ParallelConfig four = test::config(16, 2, 4, 1, 32);
  const Prediction a = bench.evaluator.evaluate(one), b = bench.evaluator.evaluate(four);
  ASSERT_EQ(a.config.grad_accum(), 1);
  ASSERT_EQ(b.config.grad_accum(), 4);
  EXPECT_NEAR(b.sim.busy[int(Phase::compute)], 4 * a.sim.busy[int(Phase::compute)], 1e-9);
  EXPECT_NEAR(b.sim.busy[int(Phase::dp_grad_sync)], a.sim.busy[int(Phase::dp_grad_sync)], 1e-12);
  EXPECT_EQ(a.sim.grad_buckets, b.sim.grad_buckets);
}

TEST(Simulator, ZeroTwoSyncsEveryMicrobatch) {
  test::Bench bench(test::model("ted-1.3b"), "thetagpu");
  ParallelConfig c = test::config(16, 2, 4, 1, 32);
  c.zero = 1;
  const Prediction z1 = bench.evaluator.evaluate(c);
  c.zero = 2;
  const Prediction z2 = bench.evaluator.evaluate(c);
  EXPECT_EQ(z2.sim.grad_buckets, 4 * z1.sim.grad_buckets);
}

// ZeRO-3 as tedsim's CPU step runs it (no prefetch): every gather is exposed on the compute
// stream, and each layer's gradients are reduce-scattered blocking at the end of its backward,
// every micro-batch, instead of in buckets on the data-parallel stream.
TEST(Simulator, ZeroThreeWithoutPrefetchExposesGathersAndSyncsLayersInTheBackward) {
  test::Bench bench(test::model("ted-1.3b"), "thetagpu");
  ParallelConfig c = test::config(16, 2, 4, 1, 32);
  c.zero = 3;
  const Prediction prefetched = bench.evaluator.evaluate(c);
  c.zero3_prefetch = false;
  const Prediction blocking = bench.evaluator.evaluate(c);
  const int dp = int(Phase::dp_grad_sync);
  // Same work on the wire, less of it hidden.
  EXPECT_GT(blocking.sim.exposed[dp], prefetched.sim.exposed[dp]);
  EXPECT_GT(blocking.sim.iteration_s, prefetched.sim.iteration_s);
  // Only the embedding's and the head's gradients go to the data-parallel stream in buckets.
  EXPECT_LT(blocking.sim.grad_buckets, prefetched.sim.grad_buckets);
  const Workload w = bench.evaluator.workload_for(c);
  for (const LayerBlocks* l : {&w.dense, &w.moe}) {
    ASSERT_TRUE(l->grads_synced_in_backward);
    bool found = false;
    for (int i = 0; i < l->backward.count; ++i)
      if (std::string(l->backward.ops[i].name) == "zero3_grad_reducescatter") {
        found = true;
        EXPECT_NEAR(l->backward.ops[i].seconds,
                    w.nonexpert_sync_seconds(l->nonexpert_grad_elems) +
                        (l->expert_grad_elems > 0 ? w.expert_sync_seconds(l->expert_grad_elems) : 0.0),
                    1e-15);
      }
    EXPECT_TRUE(found);
    EXPECT_EQ(l->zero3_hidden_forward_s, 0.0);
    EXPECT_EQ(l->zero3_hidden_backward_s, 0.0);
  }
}

TEST(Simulator, TraceHasBothStreamsAndMatchesTheIteration) {
  test::Bench bench(test::model("tiny-moe"), "local-cpu");
  ParallelConfig c = test::config(4, 2, 2, 1, 16);
  c.zero = 0;
  TraceRecorder trace;
  const Prediction p = bench.evaluator.evaluate(c, &trace);
  ASSERT_FALSE(trace.events().empty());
  bool compute = false, dp = false;
  double end = 0;
  for (const TraceEvent& e : trace.events()) {
    compute |= e.stream == Stream::compute;
    dp |= e.stream == Stream::data_parallel;
    end = std::max(end, e.start_s + e.duration_s);
    EXPECT_GE(e.duration_s, 0);
  }
  EXPECT_TRUE(compute);
  EXPECT_TRUE(dp);
  EXPECT_NEAR(end, p.sim.iteration_s, 1e-9 * p.sim.iteration_s);
  const Prediction untraced = bench.evaluator.evaluate(c);
  EXPECT_NEAR(untraced.sim.iteration_s, p.sim.iteration_s, 1e-12 * p.sim.iteration_s);
}

TEST(Simulator, FasterLinksNeverSlowAnIterationDown) {
  ModelSpec m = test::model("ted-2.7b");
  TopologySpec slow = test::topology("thetagpu");
  TopologySpec fast = slow;
  fast.inter.bandwidth_gbs *= 4;
  AnalyticProfile ps(slow), pf(fast);
  Evaluator es(m, slow, ps), ef(m, fast, pf);
  const ParallelConfig c = test::config(64, 2, 8, 1, 128);
  EXPECT_LT(ef.evaluate(c).sim.iteration_s, es.evaluate(c).sim.iteration_s);
}

}  // namespace
}  // namespace tedsim
