// Search against brute force: simulate every configuration one by one and compare the best.
#include <gtest/gtest.h>

#include <set>

#include "test_helpers.hpp"
#include "tedsim/search/search.hpp"

namespace tedsim {
namespace {

void expect_same_best_as_brute_force(const std::string& model, const std::string& topo, int gpus, int batch) {
  test::Bench bench(test::model(model), topo);
  SearchSpace space;
  space.gpus = gpus;
  space.global_batch = batch;
  const SearchResult r = run_search(bench.evaluator, space, 5);
  ASSERT_GT(r.feasible, 0);
  // Brute force through the public simulate path: validate, evaluate, keep the fastest that fits.
  double best = 0;
  ParallelConfig best_config;
  long long evaluated = 0, feasible = 0;
  for (const ParallelConfig& c : enumerate_configs(bench.m, space)) {
    validate_config(c, bench.m);
    const Prediction p = bench.evaluator.evaluate(c);
    ++evaluated;
    if (!p.fits()) continue;
    ++feasible;
    if (p.tokens_per_s > best) {
      best = p.tokens_per_s;
      best_config = c;
    }
  }
  EXPECT_EQ(r.evaluated, evaluated);
  EXPECT_EQ(r.feasible, feasible);
  EXPECT_EQ(r.top.front().config.describe(), best_config.describe());
  EXPECT_DOUBLE_EQ(r.top.front().tokens_per_s, best);
  for (std::size_t i = 1; i < r.top.size(); ++i) EXPECT_GE(r.top[i - 1].tokens_per_s, r.top[i].tokens_per_s);
}

TEST(Search, SameBestAsSimulatingEveryConfiguration) {
  expect_same_best_as_brute_force("ted-1.3b", "summit", 24, 96);
  expect_same_best_as_brute_force("tiny-moe", "local-cpu", 8, 32);
  expect_same_best_as_brute_force("mixtral-8x7b", "dgx-h100", 64, 256);
}

// With every_point (the HTML scatter), each feasible configuration is there once, in enumeration
// order, with its full prediction (no pruning bound), and the ranking is unchanged.
TEST(Search, EveryPointIsTheFullPredictionOfAFeasibleConfiguration) {
  test::Bench bench(test::model("tiny-moe"), "local-cpu");
  SearchSpace space;
  space.gpus = 8;
  space.global_batch = 32;
  const SearchResult ranked = run_search(bench.evaluator, space, 5);
  const SearchResult r = run_search(bench.evaluator, space, 5, {}, 2, true);
  ASSERT_EQ(r.top.size(), ranked.top.size());
  for (std::size_t i = 0; i < r.top.size(); ++i) EXPECT_EQ(r.top[i].config.describe(), ranked.top[i].config.describe());
  std::size_t next = 0;
  for (const ParallelConfig& c : enumerate_configs(bench.m, space)) {
    const Prediction p = bench.evaluator.evaluate(c);
    if (!p.fits()) continue;
    ASSERT_LT(next, r.points.size());
    const PlanPoint& point = r.points[next++];
    EXPECT_EQ(point.config.describe() + " zero" + std::to_string(point.config.zero),
              c.describe() + " zero" + std::to_string(c.zero));
    EXPECT_DOUBLE_EQ(point.tokens_per_s, p.tokens_per_s);
    EXPECT_DOUBLE_EQ(point.peak_bytes, p.memory.peak);
  }
  EXPECT_EQ(next, r.points.size());
  EXPECT_EQ(static_cast<long long>(r.points.size()), r.feasible);
  EXPECT_TRUE(ranked.points.empty());
}

TEST(Search, IsDeterministic) {
  test::Bench bench(test::model("ted-2.7b"), "thetagpu");
  SearchSpace space;
  space.gpus = 32;
  space.global_batch = 128;
  const SearchResult a = run_search(bench.evaluator, space, 20);
  const SearchResult b = run_search(bench.evaluator, space, 20);
  ASSERT_EQ(a.top.size(), b.top.size());
  for (std::size_t i = 0; i < a.top.size(); ++i) EXPECT_EQ(a.top[i].config.describe(), b.top[i].config.describe());
}

TEST(Search, EnumeratesOnlyValidDistinctConfigurations) {
  const ModelSpec m = test::model("ted-1.3b");
  SearchSpace space;
  space.gpus = 12;
  space.global_batch = 48;
  std::set<std::string> seen;
  for (const ParallelConfig& c : enumerate_configs(m, space)) {
    EXPECT_TRUE(config_is_valid(c, m)) << c.describe();
    EXPECT_EQ(m.heads % c.tp, 0);
    EXPECT_EQ(m.moe.experts % c.ep, 0);
    EXPECT_EQ(c.global_batch % (c.micro_batch * c.dp()), 0);
    const std::string key = c.describe() + (c.tiled_optimizer ? " tiled" : "") + " zero" + std::to_string(c.zero);
    EXPECT_TRUE(seen.insert(key).second) << "duplicate " << key;
  }
  EXPECT_GT(seen.size(), 100u);
}

TEST(Search, ConfigurationsThatDoNotFitArePruned) {
  test::Bench bench(test::model("ted-13b"), "summit");
  SearchSpace space;
  space.gpus = 6;
  space.global_batch = 12;
  const SearchResult r = run_search(bench.evaluator, space, 5);
  EXPECT_GT(r.evaluated, 0);
  EXPECT_EQ(r.feasible, 0);  // 13B + 16 experts cannot fit on one Summit node
  EXPECT_TRUE(r.top.empty());
}

}  // namespace
}  // namespace tedsim

namespace tedsim {
namespace {

// "Why this plan": for every option the best plan turns on, the search's plan without it is the
// brute-force best among configurations with that option off.
TEST(Search, ExplainsEachChoiceWithTheBestPlanWithoutIt) {
  for (const auto& [model, topo, gpus, batch] :
       {std::tuple{"tiny-moe", "local-cpu", 8, 32}, std::tuple{"ted-1.3b", "summit", 24, 96}}) {
    test::Bench bench(test::model(model), topo);
    SearchSpace space;
    space.gpus = gpus;
    space.global_batch = batch;
    const SearchResult r = run_search(bench.evaluator, space, 3, {}, 2);
    ASSERT_FALSE(r.top.empty());
    const std::vector<ParallelConfig> configs = enumerate_configs(bench.m, space);
    std::vector<Prediction> predictions;  // every configuration once, for all the knobs below
    for (const ParallelConfig& c : configs) predictions.push_back(bench.evaluator.evaluate(c));
    int explained = 0;
    for (int k = 0; k < kKnobCount; ++k) {
      if (!knob_on(r.top.front().config, Knob(k), bench.m.is_moe())) {
        EXPECT_FALSE(r.without[std::size_t(k)].has_value()) << knob_name(Knob(k));
        continue;
      }
      double best = 0;
      std::string best_config;
      for (std::size_t i = 0; i < configs.size(); ++i) {
        if (knob_on(configs[i], Knob(k), bench.m.is_moe())) continue;
        const Prediction& p = predictions[i];
        if (p.fits() && p.tokens_per_s > best) {
          best = p.tokens_per_s;
          best_config = configs[i].describe();
        }
      }
      ASSERT_TRUE(r.without[std::size_t(k)].has_value() == (best > 0)) << knob_name(Knob(k));
      if (best == 0) continue;
      ++explained;
      EXPECT_EQ(r.without[std::size_t(k)]->config.describe(), best_config) << model << " " << knob_name(Knob(k));
      EXPECT_LE(r.without[std::size_t(k)]->tokens_per_s, r.top.front().tokens_per_s);
    }
    EXPECT_GT(explained, 0) << model;
  }
}

}  // namespace
}  // namespace tedsim
