// Fused gating against the plain reference, plus hand-checked cases for ties, capacity and drops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/kernels/cpu/gating_common.hpp"
#include "test_util.hpp"

namespace tedsim::kernels {
namespace {

void expect_same_routing(const GatingOutput& a, const GatingOutput& b) {
  ASSERT_EQ(a.capacity, b.capacity);
  EXPECT_EQ(a.expert, b.expert);
  EXPECT_EQ(a.position, b.position);
  EXPECT_EQ(a.routed, b.routed);
  EXPECT_EQ(a.kept, b.kept);
  EXPECT_EQ(a.top1_count, b.top1_count);
  test::expect_close(a.probs, b.probs, 1e-5, 1e-7, "probs");
  test::expect_close(a.weight, b.weight, 1e-5, 1e-7, "weight");
  EXPECT_NEAR(a.aux_loss, b.aux_loss, 1e-5 * std::abs(b.aux_loss));
}

TEST(Capacity, FormulaAndMinimum) {
  EXPECT_EQ(capacity(256, 8, 1, 1.0, 4), 32);
  EXPECT_EQ(capacity(256, 8, 2, 1.0, 4), 64);
  EXPECT_EQ(capacity(100, 8, 1, 1.0, 4), 13);   // ceil(12.5)
  EXPECT_EQ(capacity(256, 8, 1, 1.25, 4), 40);
  EXPECT_EQ(capacity(80, 8, 1, 1.1, 4), 11);    // 1.1*80/8 = 11 exactly: no extra slot from rounding
  EXPECT_EQ(capacity(16, 64, 1, 1.0, 4), 4);    // min capacity wins
  EXPECT_EQ(capacity(0, 8, 2, 1.0, 0), 0);
  EXPECT_THROW(capacity(10, 0, 1, 1.0, 4), InputError);
}

struct Case {
  int tokens, experts, k;
  double factor;
  int min_capacity;
};

class GatingRandom : public ::testing::TestWithParam<Case> {};

TEST_P(GatingRandom, FusedMatchesReference) {
  const Case c = GetParam();
  // Small integer-valued logits create many exact ties, so tie-breaking is exercised too.
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<float> logits = test::random_vector(static_cast<std::size_t>(c.tokens) * c.experts, 17 + variant, -3, 3);
    if (variant == 1) {
      for (float& x : logits) x = std::round(x);
    }
    GatingConfig cfg{c.k, c.factor, c.min_capacity, true};
    GatingOutput fused, ref;
    gating_forward(logits.data(), c.tokens, c.experts, cfg, fused);
    gating_forward_reference(logits.data(), c.tokens, c.experts, cfg, ref);
    expect_same_routing(fused, ref);
    // Invariants: kept counts never exceed C; every kept slot is unique per expert.
    for (int e = 0; e < c.experts; ++e) EXPECT_LE(fused.kept[e], fused.capacity);
    EXPECT_EQ(std::accumulate(fused.routed.begin(), fused.routed.end(), 0), c.tokens * c.k);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GatingRandom,
                         ::testing::Values(Case{64, 8, 1, 1.0, 4}, Case{257, 16, 2, 1.0, 4}, Case{300, 32, 4, 1.25, 8},
                                           Case{200, 8, 8, 1.0, 4}, Case{128, 64, 2, 0.5, 4},
                                           Case{10, 64, 1, 1.0, 4}, Case{1000, 7, 3, 2.0, 1}));

TEST(Gating, ExactTiesGoToLowestIndex) {
  // Token 0: all equal -> choices 0,1,2. Token 1: experts 2 and 3 tie for top -> 2 then 3.
  const std::vector<float> logits = {0, 0, 0, 0, 1, 1, 5, 5};
  GatingConfig cfg{3, 4.0, 4, true};
  GatingOutput out;
  gating_forward(logits.data(), 2, 4, cfg, out);
  EXPECT_EQ((std::vector<std::int32_t>{0, 1, 2, 2, 3, 0}), out.expert);
  // k >= 2: kept weights renormalized over the token's kept choices.
  EXPECT_NEAR(out.weight[0], 1.0f / 3.0f, 1e-6);
  const float e5 = std::exp(5.0f), e1 = std::exp(1.0f);
  EXPECT_NEAR(out.weight[3], e5 / (2 * e5 + e1), 1e-6);
  EXPECT_NEAR(out.weight[5], e1 / (2 * e5 + e1), 1e-6);
}

TEST(Gating, Top1DropsBeyondCapacityInTokenOrder) {
  // 6 tokens all prefer expert 1 among E=2; C = max(ceil(6/2 * 1.0), 2) = 3: tokens 0..2 kept.
  std::vector<float> logits;
  for (int t = 0; t < 6; ++t) logits.insert(logits.end(), {0.0f, 1.0f + t});
  GatingConfig cfg{1, 1.0, 2, true};
  GatingOutput out;
  gating_forward(logits.data(), 6, 2, cfg, out);
  ASSERT_EQ(out.capacity, 3);
  EXPECT_EQ((std::vector<std::int32_t>{0, 1, 2, -1, -1, -1}), out.position);
  EXPECT_EQ(out.kept[1], 3);
  EXPECT_EQ(out.routed[1], 6);
  for (int t = 0; t < 6; ++t) {
    const float p1 = 1.0f / (1.0f + std::exp(-(1.0f + t)));
    EXPECT_NEAR(out.weight[t], t < 3 ? p1 : 0.0f, 1e-6);  // top-1 weight is the raw probability
  }
  // aux = E * sum_e me_e * ce_e with ce = (0, 1).
  double me1 = 0;
  for (int t = 0; t < 6; ++t) me1 += 1.0 / (1.0 + std::exp(-(1.0 + t)));
  EXPECT_NEAR(out.aux_loss, 2.0 * (me1 / 6.0), 1e-6);
}

TEST(Gating, SecondChoicesComeAfterAllFirstChoices) {
  // E=2, k=2, 3 tokens all prefer expert 0: expert 0 gets first choices at 0,1,2; expert 1 gets
  // second choices at 0,1,2. C = max(ceil(2*3/2*0.5), 1) = 2 drops token 2 on both.
  const std::vector<float> logits = {2, 1, 2, 1, 2, 1};
  GatingConfig cfg{2, 0.5, 1, true};
  GatingOutput out;
  gating_forward(logits.data(), 3, 2, cfg, out);
  ASSERT_EQ(out.capacity, 2);
  EXPECT_EQ((std::vector<std::int32_t>{0, 0, 1, 1, -1, -1}), out.position);
  EXPECT_FLOAT_EQ(out.weight[4], 0.0f);
  EXPECT_NEAR(out.weight[0] + out.weight[1], 1.0f, 1e-6);

  // Mixed: token 0 prefers 1, tokens 1,2 prefer 0. Expert 0: first choices of tokens 1,2 at 0,1,
  // then token 0's second choice at 2. Expert 1: token 0 (1st choice) at 0, then the second
  // choices of tokens 1,2 at 1,2.
  const std::vector<float> mixed = {0, 3, 3, 0, 3, 0};
  GatingConfig big{2, 10.0, 1, true};
  gating_forward(mixed.data(), 3, 2, big, out);
  EXPECT_EQ((std::vector<std::int32_t>{1, 0, 0, 1, 0, 1}), out.expert);
  EXPECT_EQ((std::vector<std::int32_t>{0, 2, 0, 1, 1, 2}), out.position);
}

TEST(Gating, HalfDroppedSecondChoiceRenormalizesToOne) {
  // Token 2's second choice is dropped: its kept first choice then has weight 1 (DeepSpeed top2).
  const std::vector<float> logits = {2, 1, 2, 1, 2, 1};
  GatingConfig cfg{2, 0.75, 1, true};  // C = ceil(2*0.75*3/2) = 3: expert 1 keeps 3 -> no drop
  GatingOutput out;
  gating_forward(logits.data(), 3, 2, cfg, out);
  ASSERT_EQ(out.capacity, 3);
  const std::vector<float> asym = {2, 1, 2, 1, 1, 2, 1, 2};  // expert 0 first for 2, expert 1 first for 2
  GatingConfig tight{2, 0.25, 3, true};  // C = max(ceil(1), 3) = 3: each expert gets 2 first + 2 second
  gating_forward(asym.data(), 4, 2, tight, out);
  ASSERT_EQ(out.capacity, 3);
  // Expert 0: tokens 0,1 first (0,1), then token 2's second (2), token 3's second dropped.
  EXPECT_EQ(out.position[5], 2);
  EXPECT_EQ(out.position[7], -1);
  EXPECT_FLOAT_EQ(out.weight[7], 0.0f);
  EXPECT_NEAR(out.weight[6], 1.0f, 1e-6);
}

TEST(Gating, NoDropModeKeepsEverything) {
  const auto logits = test::random_vector(512 * 8, 3);
  GatingConfig cfg{2, 1.0, 4, false};
  GatingOutput out;
  gating_forward(logits.data(), 512, 8, cfg, out);
  for (int p : out.position) EXPECT_GE(p, 0);
}

// The vector kernel (AVX2: E <= 64, 8-token groups, tail tokens and NaN rows by the scalar route)
// and the portable path both against the reference: widths that are not a multiple of the vector
// width, token counts that are not a multiple of the group, k = 1, 2 (fast paths) and k > 2, with
// and without exact ties.
TEST(GatingPaths, VectorAndPortableMatchReference) {
  struct Shape { int tokens, experts, k; };
  const Shape shapes[] = {{19, 1, 1}, {40, 3, 2}, {64, 8, 1}, {75, 9, 2}, {130, 16, 1}, {131, 16, 2}, {97, 17, 3},
                          {64, 24, 8}, {85, 33, 2}, {72, 63, 1}, {203, 64, 2}, {48, 64, 5}, {72, 64, 8}, {41, 40, 6},
                          {33, 65, 2}, {40, 100, 1},
                          // E = 16, k <= 2 (per-row pipelined kernel): T below, at and just past its
                          // 4-token pipeline, odd tails, and T past two 256-token sum blocks.
                          {1, 16, 1}, {3, 16, 2}, {4, 16, 1}, {5, 16, 2}, {7, 16, 1}, {8, 16, 2},
                          {259, 16, 1}, {515, 16, 2}, {16, 16, 3}};
  for (const Shape& s : shapes) {
    for (int variant = 0; variant < 2; ++variant) {
      auto logits = test::random_vector(static_cast<std::size_t>(s.tokens) * s.experts, 31 + variant, -3, 3);
      if (variant == 1) {
        for (float& x : logits) x = std::round(x);
      }
      const GatingConfig cfg{s.k, 1.0, 4, true};
      GatingOutput ref, fused, portable;
      gating_forward_reference(logits.data(), s.tokens, s.experts, cfg, ref);
      gating_forward(logits.data(), s.tokens, s.experts, cfg, fused);
      detail::gating_forward_portable(logits.data(), s.tokens, s.experts, cfg, portable);
      SCOPED_TRACE("T=" + std::to_string(s.tokens) + " E=" + std::to_string(s.experts) + " k=" + std::to_string(s.k) +
                   " variant=" + std::to_string(variant) +
                   (detail::gating_has_vector_path(s.experts) ? " (vector)" : " (portable)"));
      expect_same_routing(fused, ref);
      expect_same_routing(portable, ref);
    }
  }
}

// Outputs larger than the row kernel's streaming-store threshold (8 MiB of probs), plus a tail
// of T % 8 tokens after the streamed groups.
TEST(GatingPaths, LargeOutputsMatchReference) {
  const int T = 32771, E = 64;
  auto logits = test::random_vector(static_cast<std::size_t>(T) * E, 41, -3, 3);
  for (int k : {1, 2, 8}) {
    const GatingConfig cfg{k, 1.0, 4, true};
    GatingOutput ref, fused;
    gating_forward_reference(logits.data(), T, E, cfg, ref);
    gating_forward(logits.data(), T, E, cfg, fused);
    SCOPED_TRACE("k=" + std::to_string(k));
    expect_same_routing(fused, ref);
  }
}

TEST(GatingPaths, NegativeInfinityLogitsAreChosenLastByIndex) {
  // Token rows with -inf entries: finite ones first by value, then the -inf ones by lowest index
  // (k exceeds the finite count in the second row). Eight tokens + 1 so the group and tail both see it.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits;
  for (int t = 0; t < 9; ++t) {
    if (t % 2 == 0) {
      logits.insert(logits.end(), {-inf, 1.0f, -inf, 2.0f, 0.5f, -inf, 1.0f, -1.0f, 3.0f, -inf});
    } else {
      logits.insert(logits.end(), {-inf, -inf, 4.0f, -inf, -inf, -inf, -inf, -inf, -inf, -inf});
    }
  }
  for (int k : {1, 2, 3}) {
    const GatingConfig cfg{k, 4.0, 4, true};
    GatingOutput ref, fused, portable;
    gating_forward_reference(logits.data(), 9, 10, cfg, ref);
    gating_forward(logits.data(), 9, 10, cfg, fused);
    detail::gating_forward_portable(logits.data(), 9, 10, cfg, portable);
    expect_same_routing(fused, ref);
    expect_same_routing(portable, ref);
    EXPECT_EQ(fused.expert[1 * k + 0], 2);
    if (k >= 2) {
      EXPECT_EQ(fused.expert[1 * k + 1], 0);
    }
  }
}

// E = 16, k = 1, 2 (row kernel): -inf lanes, an exact tie at the max and one below it, a tie of
// all lanes, and rows the vector path cannot take (a NaN, a +inf, all -inf) go the scalar route in
// token order, between vector tokens: choices and positions as the portable path's.
TEST(GatingPaths, E16SpecialRows) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const int T = 23, E = 16;
  auto logits = test::random_vector(static_cast<std::size_t>(T) * E, 57, -3, 3);
  auto row = [&](int t) { return logits.data() + static_cast<std::size_t>(t) * E; };
  for (int e = 0; e < E; e += 3) row(1)[e] = -inf;
  row(2)[5] = row(2)[12] = 9.0f;                                   // tie at the max
  row(3)[3] = 9.0f, row(3)[7] = row(3)[14] = 8.0f;                 // tie for the second choice
  for (int e = 0; e < E; ++e) row(4)[e] = 0.5f;                    // all tied
  for (int e = 0; e < E; ++e) row(5)[e] = e == 9 ? 1.0f : -inf;    // one finite lane
  for (int e = 0; e < E; ++e) row(6)[e] = e < 2 ? 1.0f : -inf;     // two finite lanes
  for (int k : {1, 2}) {
    const GatingConfig cfg{k, 1.0, 2, true};
    GatingOutput ref, fused;
    gating_forward_reference(logits.data(), T, E, cfg, ref);
    gating_forward(logits.data(), T, E, cfg, fused);
    SCOPED_TRACE("finite rows, k=" + std::to_string(k));
    expect_same_routing(fused, ref);
  }
  auto special = logits;
  auto srow = [&](int t) { return special.data() + static_cast<std::size_t>(t) * E; };
  srow(9)[4] = nan;
  srow(13)[11] = inf;
  for (int e = 0; e < E; ++e) srow(17)[e] = -inf;
  srow(22)[0] = nan;  // the scalar tail
  for (int k : {1, 2}) {
    const GatingConfig cfg{k, 1.0, 2, true};
    GatingOutput fused, portable;
    gating_forward(special.data(), T, E, cfg, fused);
    detail::gating_forward_portable(special.data(), T, E, cfg, portable);
    SCOPED_TRACE("special rows, k=" + std::to_string(k));
    EXPECT_EQ(fused.expert, portable.expert);
    EXPECT_EQ(fused.position, portable.position);
    EXPECT_EQ(fused.routed, portable.routed);
    EXPECT_EQ(fused.top1_count, portable.top1_count);
    for (int t : {0, 8, 10, 12, 14, 16, 18, 21}) {
      for (int j = 0; j < k; ++j) {
        EXPECT_NEAR(fused.weight[t * k + j], portable.weight[t * k + j], 1e-6) << "t=" << t;
      }
    }
  }
}

TEST(Gating, RejectsBadArguments) {
  std::vector<float> logits(16);
  GatingOutput out;
  EXPECT_THROW(gating_forward(logits.data(), 4, 4, GatingConfig{5, 1.0, 4, true}, out), InputError);
  EXPECT_THROW(gating_forward(logits.data(), 1, 16, GatingConfig{9, 1.0, 4, true}, out), InputError);
}

// Loss L = sum_j g_j * w_j + a * aux; gradient from gating_backward vs central differences.
TEST(GatingBackward, MatchesFiniteDifferences) {
  for (int k : {1, 2, 4}) {
    const int T = 24, E = 8;
    const auto logits = test::random_vector(T * E, 100 + k, -2, 2);
    const auto g = test::random_vector(static_cast<std::size_t>(T) * k, 200 + k);
    const float a = 0.7f;
    GatingConfig cfg{k, 0.75, 1, true};  // tight capacity: some choices dropped
    GatingOutput fwd;
    gating_forward_reference(logits.data(), T, E, cfg, fwd);
    const bool some_dropped =
        std::any_of(fwd.position.begin(), fwd.position.end(), [](int p) { return p < 0; });
    if (k > 1) {
      EXPECT_TRUE(some_dropped);
    }
    std::vector<float> grad(T * E);
    gating_backward(fwd, g.data(), a, grad.data());

    auto loss = [&](const std::vector<float>& x) {
      GatingOutput o;
      gating_forward_reference(x.data(), T, E, cfg, o);
      double l = a * o.aux_loss;
      for (std::size_t i = 0; i < o.weight.size(); ++i) l += static_cast<double>(g[i]) * o.weight[i];
      return l;
    };
    const float h = 1e-3f;
    for (int i = 0; i < T * E; ++i) {
      auto xp = logits, xm = logits;
      xp[i] += h;
      xm[i] -= h;
      const double fd = (loss(xp) - loss(xm)) / (2.0 * h);
      ASSERT_NEAR(grad[i], fd, 2e-3 + 1e-2 * std::abs(fd)) << "k=" << k << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace tedsim::kernels
