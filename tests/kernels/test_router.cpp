// The routers of today's MoE models against a plain fp64 reference written from the models' own
// descriptions (sort-based top-k, explicit group masks), finite differences for the backward, and
// dropless dispatch + combine reproducing the weighted input exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "test_util.hpp"
#include "tedsim/kernels/cpu/dispatch.hpp"
#include "tedsim/kernels/cpu/router.hpp"

namespace tedsim::kernels {
namespace {

struct Reference {
  std::vector<int> expert;      // [T,k]
  std::vector<double> weight;   // [T,k], before capacity (every test here is dropless or roomy)
};

// Indices sorted by score, descending; stable, so equal scores keep index order (lowest first).
std::vector<int> ranked(const std::vector<double>& score) {
  std::vector<int> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return score[a] > score[b]; });
  return idx;
}

Reference reference_route(const std::vector<float>& logits, const std::vector<float>& bias, int T, int E,
                          const RouterConfig& c) {
  Reference r;
  for (int t = 0; t < T; ++t) {
    std::vector<double> l(E), score(E), select(E);
    for (int e = 0; e < E; ++e) l[e] = logits[t * E + e];
    if (c.kind == RouterKind::sigmoid) {
      for (int e = 0; e < E; ++e) {
        score[e] = 1.0 / (1.0 + std::exp(-l[e]));
        select[e] = score[e] + (bias.empty() ? 0.0 : bias[e]);
      }
    } else {
      const double m = *std::max_element(l.begin(), l.end());
      double s = 0;
      for (int e = 0; e < E; ++e) s += std::exp(l[e] - m);
      for (int e = 0; e < E; ++e) score[e] = select[e] = std::exp(l[e] - m) / s;
    }
    // Group mask: groups ranked by the sum of their best k / topk_groups selection scores.
    std::vector<bool> allowed(E, true);
    if (c.groups > 1) {
      const int per = E / c.groups, take = c.k / c.topk_groups;
      std::vector<double> gscore(c.groups);
      for (int g = 0; g < c.groups; ++g) {
        std::vector<double> mine(select.begin() + g * per, select.begin() + (g + 1) * per);
        std::sort(mine.rbegin(), mine.rend());
        gscore[g] = std::accumulate(mine.begin(), mine.begin() + take, 0.0);
      }
      const std::vector<int> order = ranked(gscore);
      std::fill(allowed.begin(), allowed.end(), false);
      for (int i = 0; i < c.topk_groups; ++i)
        for (int e = order[i] * per; e < (order[i] + 1) * per; ++e) allowed[e] = true;
    }
    std::vector<double> masked(E);
    for (int e = 0; e < E; ++e) masked[e] = allowed[e] ? select[e] : -1e300;
    const std::vector<int> order = ranked(masked);
    std::vector<double> w(c.k);
    for (int j = 0; j < c.k; ++j) r.expert.push_back(order[j]);
    if (c.kind == RouterKind::topk_softmax) {
      double m = -1e300, s = 0;
      for (int j = 0; j < c.k; ++j) m = std::max(m, l[order[j]]);
      for (int j = 0; j < c.k; ++j) s += std::exp(l[order[j]] - m);
      for (int j = 0; j < c.k; ++j) w[j] = std::exp(l[order[j]] - m) / s;
    } else {
      double s = 0;
      for (int j = 0; j < c.k; ++j) s += score[order[j]];
      for (int j = 0; j < c.k; ++j) w[j] = c.normalize ? score[order[j]] / s : score[order[j]];
    }
    for (int j = 0; j < c.k; ++j) r.weight.push_back(c.scaling * w[j]);
  }
  return r;
}

struct Case {
  const char* name;
  RouterKind kind;
  int E, k;
  bool normalize;
  float scaling;
  int groups, topk_groups;
  bool bias;
};

class Routers : public ::testing::TestWithParam<Case> {};

RouterConfig config_of(const Case& c) {
  RouterConfig r;
  r.kind = c.kind;
  r.k = c.k;
  r.normalize = c.normalize;
  r.scaling = c.scaling;
  r.groups = c.groups;
  r.topk_groups = c.topk_groups;
  r.drop_tokens = false;
  return r;
}

TEST_P(Routers, ChoicesAndWeightsMatchThePlainReference) {
  const Case c = GetParam();
  const int T = 257;
  const std::vector<float> logits = test::random_vector(std::size_t(T) * c.E, 11, -3.0f, 3.0f);
  const std::vector<float> bias = c.bias ? test::random_vector(c.E, 12, -0.2f, 0.2f) : std::vector<float>{};
  const RouterConfig cfg = config_of(c);
  RouterOutput out;
  route_forward(logits.data(), c.bias ? bias.data() : nullptr, T, c.E, cfg, out);
  const Reference ref = reference_route(logits, bias, T, c.E, cfg);
  int wrong = 0;
  for (int i = 0; i < T * c.k; ++i) wrong += out.gate.expert[i] != ref.expert[i];
  EXPECT_EQ(wrong, 0) << c.name;
  for (int i = 0; i < T * c.k; ++i) {
    EXPECT_GE(out.gate.position[i], 0);  // dropless
    EXPECT_NEAR(out.gate.weight[i], ref.weight[i], 2e-6 * std::max(1.0, std::abs(ref.weight[i]))) << c.name << " " << i;
  }
  if (c.groups > 1) {
    // Every token's experts lie in at most topk_groups groups.
    for (int t = 0; t < T; ++t) {
      std::vector<int> groups;
      for (int j = 0; j < c.k; ++j) groups.push_back(out.gate.expert[t * c.k + j] / (c.E / c.groups));
      std::sort(groups.begin(), groups.end());
      EXPECT_LE(std::unique(groups.begin(), groups.end()) - groups.begin(), c.topk_groups);
    }
  }
}

// loss = sum(grad_weight * weight) + grad_aux * aux: the backward against central differences.
TEST_P(Routers, BackwardMatchesFiniteDifferences) {
  const Case c = GetParam();
  const int T = 9;
  std::vector<float> logits = test::random_vector(std::size_t(T) * c.E, 21, -2.0f, 2.0f);
  const std::vector<float> bias = c.bias ? test::random_vector(c.E, 22, -0.2f, 0.2f) : std::vector<float>{};
  const std::vector<float> gw = test::random_vector(std::size_t(T) * c.k, 23);
  const float grad_aux = 0.37f;
  RouterConfig cfg = config_of(c);
  RouterOutput out;
  route_forward(logits.data(), c.bias ? bias.data() : nullptr, T, c.E, cfg, out);
  const std::vector<std::int32_t> choices = out.gate.expert;
  std::vector<float> grad(std::size_t(T) * c.E);
  route_backward(out, gw.data(), grad_aux, grad.data());
  auto loss = [&](const std::vector<float>& x, bool* same) {
    RouterOutput o;
    route_forward(x.data(), c.bias ? bias.data() : nullptr, T, c.E, cfg, o);
    *same = o.gate.expert == choices;
    double l = grad_aux * o.gate.aux_loss;
    for (int i = 0; i < T * c.k; ++i) l += double(gw[i]) * o.gate.weight[i];
    return l;
  };
  const float h = 1e-3f;
  int checked = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    std::vector<float> up = logits, down = logits;
    up[i] += h;
    down[i] -= h;
    bool same_up = false, same_down = false;
    const double numeric = (loss(up, &same_up) - loss(down, &same_down)) / (2.0 * h);
    if (!same_up || !same_down) continue;  // a choice flipped: the loss is not smooth here
    EXPECT_NEAR(grad[i], numeric, 2e-3 * std::max(1.0, std::abs(numeric))) << c.name << " logit " << i;
    ++checked;
  }
  EXPECT_GT(checked, int(logits.size()) * 9 / 10) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, Routers,
    ::testing::Values(Case{"softmax_topk_raw", RouterKind::softmax_topk, 16, 4, false, 1.0f, 1, 1, false},
                      Case{"softmax_topk_renormalized", RouterKind::softmax_topk, 16, 4, true, 1.0f, 1, 1, false},
                      Case{"softmax_top1", RouterKind::softmax_topk, 8, 1, false, 1.0f, 1, 1, false},
                      Case{"topk_softmax_mixtral", RouterKind::topk_softmax, 8, 2, false, 1.0f, 1, 1, false},
                      Case{"topk_softmax_top8", RouterKind::topk_softmax, 64, 8, false, 1.0f, 1, 1, false},
                      Case{"sigmoid_scaled", RouterKind::sigmoid, 32, 8, true, 2.5f, 1, 1, true},
                      Case{"sigmoid_unnormalized", RouterKind::sigmoid, 32, 4, false, 1.0f, 1, 1, false},
                      Case{"sigmoid_group_limited", RouterKind::sigmoid, 64, 8, true, 2.5f, 8, 4, true},
                      Case{"softmax_group_limited", RouterKind::softmax_topk, 32, 6, false, 1.0f, 8, 3, false}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Routers, TiesGoToTheLowestIndexForExpertsAndGroups) {
  // Every logit equal: experts 0..k-1 for every kind; with groups, the first topk_groups groups.
  const int T = 3, E = 16;
  const std::vector<float> logits(std::size_t(T) * E, 0.5f);
  for (RouterKind kind : {RouterKind::softmax_topk, RouterKind::topk_softmax, RouterKind::sigmoid}) {
    RouterConfig cfg;
    cfg.kind = kind;
    cfg.k = 4;
    cfg.drop_tokens = false;
    RouterOutput out;
    route_forward(logits.data(), nullptr, T, E, cfg, out);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < 4; ++j) EXPECT_EQ(out.gate.expert[t * 4 + j], j);
    cfg.groups = 4;
    cfg.topk_groups = 2;
    route_forward(logits.data(), nullptr, T, E, cfg, out);
    for (int j = 0; j < 4; ++j) EXPECT_LT(out.gate.expert[j], 8) << "groups 0 and 1 hold experts 0..7";
  }
  // A tie between two groups' scores: the lower group wins; a tie inside the winner: lower expert.
  std::vector<float> one(8, -5.0f);
  one[5] = one[6] = 2.0f;  // group 1 (experts 4..7) has two equal best experts
  one[1] = 2.0f;           // group 0 ties group 1's best single score
  RouterConfig cfg;
  cfg.kind = RouterKind::softmax_topk;
  cfg.k = 1;
  cfg.groups = 2;
  cfg.topk_groups = 1;
  cfg.drop_tokens = false;
  RouterOutput out;
  route_forward(one.data(), nullptr, 1, 8, cfg, out);
  EXPECT_EQ(out.gate.expert[0], 1);
}

TEST(Routers, DroplessDispatchThenCombineReproducesTheWeightedInputExactly) {
  const int T = 333, E = 16, k = 4, h = 24;
  const std::vector<float> logits = test::random_vector(std::size_t(T) * E, 31, -4.0f, 4.0f);
  const std::vector<float> x = test::random_vector(std::size_t(T) * h, 32);
  RouterConfig cfg;
  cfg.kind = RouterKind::sigmoid;
  cfg.k = k;
  cfg.normalize = true;
  cfg.scaling = 2.5f;
  cfg.drop_tokens = false;
  RouterOutput out;
  route_forward(logits.data(), nullptr, T, E, cfg, out);
  const GatingOutput& g = out.gate;
  EXPECT_EQ(g.capacity, *std::max_element(g.routed.begin(), g.routed.end()));
  EXPECT_EQ(std::accumulate(g.kept.begin(), g.kept.end(), 0), T * k);  // nothing dropped
  std::vector<float> buf(std::size_t(E) * g.capacity * h), y(std::size_t(T) * h);
  dispatch(g, x.data(), h, buf.data());
  // Every choice's slot holds its token bit for bit: nothing is dropped or mixed up.
  int wrong_rows = 0;
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      const float* row = buf.data() + (std::size_t(g.expert[t * k + j]) * g.capacity + g.position[t * k + j]) * h;
      for (int c = 0; c < h; ++c) wrong_rows += row[c] != x[t * h + c];
    }
  EXPECT_EQ(wrong_rows, 0);
  // Combine gives the token back weighted by its k weights; the sum of k products is exact up to
  // the rounding of its additions (whether the compiler fuses them differs between builds).
  combine(g, buf.data(), h, y.data());
  int wrong = 0;
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < h; ++c) {
      double expected = 0.0;
      for (int j = 0; j < k; ++j) expected += double(g.weight[t * k + j]) * x[t * h + c];
      wrong += std::abs(y[t * h + c] - expected) > 4e-7 * std::max(1.0, std::abs(expected));
    }
  EXPECT_EQ(wrong, 0);
}

TEST(Routers, CapacityDropsLaterChoicesFirstAndZeroesTheirWeight) {
  const int T = 64, E = 4, k = 2;
  std::vector<float> logits(std::size_t(T) * E, 0.0f);
  for (int t = 0; t < T; ++t) logits[t * E + 0] = 3.0f;  // everyone's first choice is expert 0
  RouterConfig cfg;
  cfg.kind = RouterKind::topk_softmax;
  cfg.k = k;
  cfg.capacity_factor = 1.0;
  cfg.min_capacity = 0;
  RouterOutput out;
  route_forward(logits.data(), nullptr, T, E, cfg, out);
  const int C = out.gate.capacity;  // k T / E = 32
  EXPECT_EQ(C, 32);
  EXPECT_EQ(out.gate.kept[0], C);
  for (int t = 0; t < T; ++t) {
    const bool dropped = out.gate.position[t * k] < 0;
    EXPECT_EQ(dropped, t >= C);
    if (dropped) EXPECT_EQ(out.gate.weight[t * k], 0.0f);
    else EXPECT_FLOAT_EQ(out.gate.weight[t * k], out.chosen_weight[t * k]);  // not renormalized (Megatron)
  }
}

}  // namespace
}  // namespace tedsim::kernels
