// FLOPs per iteration of dense configurations against the standard formula (Narayanan et al.,
// SC21, eq. 3, with activation recomputation): 96*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)).
#include <gtest/gtest.h>

#include "test_helpers.hpp"

namespace tedsim {
namespace {

double standard_flops(double B, double s, double L, double h, double V) {
  return 96.0 * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h));
}

struct DenseCase {
  const char* model;
  int gpus, tp, micro_batch, global_batch;
};

class DenseFlops : public ::testing::TestWithParam<DenseCase> {};

TEST_P(DenseFlops, MatchesStandardFormulaWithin1Percent) {
  const DenseCase k = GetParam();
  ModelSpec m = test::model(k.model);
  m.set_experts(0);
  test::Bench bench(m, "thetagpu");
  ParallelConfig c = test::config(k.gpus, k.tp, 1, k.micro_batch, k.global_batch);
  c.recompute = Recompute::full;
  const Prediction p = bench.evaluator.evaluate(c);
  const double expected = standard_flops(k.global_batch, m.seq_len, m.layers, m.hidden, m.vocab);
  EXPECT_NEAR(p.flops_per_iteration / expected, 1.0, 0.01)
      << "tedsim " << p.flops_per_iteration << " vs formula " << expected;
  // Without recompute, the model FLOPs are 3/4 of the layer FLOPs plus the head.
  EXPECT_LT(p.model_flops_per_iteration, p.flops_per_iteration);
}

INSTANTIATE_TEST_SUITE_P(GptShapes, DenseFlops,
                         ::testing::Values(DenseCase{"ted-1.3b", 8, 1, 4, 64}, DenseCase{"ted-1.3b", 16, 2, 2, 64},
                                           DenseCase{"ted-6.7b", 32, 4, 1, 128}, DenseCase{"ted-13b", 64, 8, 2, 256}));

TEST(Flops, NoCheckpointingRemovesTheRecomputedForward) {
  ModelSpec m = test::model("ted-1.3b");
  m.set_experts(0);
  test::Bench bench(m, "thetagpu");
  ParallelConfig c = test::config(8, 2, 1, 2, 32);
  c.recompute = Recompute::none;
  const Prediction p = bench.evaluator.evaluate(c);
  // 72*B*s*L*h^2*(1 + s/(6h)) + 6*B*s*h*V: three passes of the layers, the head unchanged.
  const double B = 32, s = m.seq_len, L = m.layers, h = m.hidden, V = m.vocab;
  const double expected = 72.0 * B * s * L * h * h * (1.0 + s / (6.0 * h)) + 6.0 * B * s * h * V;
  EXPECT_NEAR(p.flops_per_iteration / expected, 1.0, 1e-9);
  EXPECT_DOUBLE_EQ(p.flops_per_iteration, p.model_flops_per_iteration);
}

// The model's FLOPs do not depend on how experts are split: with expert TP each tensor rank runs
// 1/t of F, with DTD 1/t of the tokens, and with neither every tensor rank runs the same expert
// work (counted once in model FLOPs, t times in hardware FLOPs).
TEST(Flops, ModelFlopsCountReplicatedExpertWorkOnce) {
  test::Bench bench(test::model("ted-1.3b"), "summit");
  double reference = 0;
  for (bool expert_tp : {true, false}) {
    for (bool dtd : {true, false}) {
      ParallelConfig c = test::config(64, 2, 8, 1, 512);
      c.expert_tp = expert_tp;
      c.dtd = dtd;
      const Prediction p = bench.evaluator.evaluate(c);
      if (reference == 0) reference = p.model_flops_per_iteration;
      EXPECT_NEAR(p.model_flops_per_iteration / reference, 1.0, 1e-9) << "expert_tp " << expert_tp << " dtd " << dtd;
      if (!expert_tp && !dtd) {
        EXPECT_GT(p.flops_per_iteration - p.model_flops_per_iteration, 0.2 * reference);  // the duplicates
      }
    }
  }
}

}  // namespace
}  // namespace tedsim
