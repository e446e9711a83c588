// The loss's three CPU passes (vocabulary-parallel cross-entropy) against a double reference, the
// gradient against finite differences of the loss, and a vocabulary split over two ranks (max and
// sum combined as the step's all-reduces combine them) against the unsplit result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "test_util.hpp"
#include "tedsim/kernels/cpu/cross_entropy.hpp"

namespace tedsim::kernels {
namespace {

std::vector<std::int32_t> ids(int n, int lo, int hi, unsigned seed) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[std::size_t(i)] = lo + std::int32_t((2654435761u * (i + seed)) % unsigned(hi - lo));
  return out;
}

// Mean over tokens of log sum exp(row) - row[target] (all ids owned), in double.
double loss(int tokens, int v, const std::vector<float>& logits, const std::vector<std::int32_t>& targets) {
  double total = 0;
  for (int i = 0; i < tokens; ++i) {
    const float* row = logits.data() + std::size_t(i) * v;
    const double m = *std::max_element(row, row + v);
    double s = 0;
    for (int j = 0; j < v; ++j) s += std::exp(double(row[j]) - m);
    total += std::log(s) + m - row[targets[std::size_t(i)]];
  }
  return total / tokens;
}

TEST(CrossEntropy, PassesMatchTheDoubleReference) {
  const int v0 = 1000;
  for (int tokens : {3, 77})
    for (int v : {50, 1500}) {  // rows that are not a multiple of the 8-wide exp
      const auto logits = test::random_vector(std::size_t(tokens) * v, 7, -6, 6);
      const auto targets = ids(tokens, v0 - 20, v0 + v + 20, 3);  // some owned by another rank
      std::vector<float> lg = logits, mx(tokens), tg(tokens), se(tokens);
      ce_max_and_target(tokens, v, v0, lg.data(), targets.data(), mx.data(), tg.data());
      std::vector<float> want_exp(lg.size()), want_grad(lg.size());
      const float scale = 0.25f;
      for (int i = 0; i < tokens; ++i) {
        const float* row = logits.data() + std::size_t(i) * v;
        EXPECT_EQ(mx[i], *std::max_element(row, row + v));
        const int id = targets[std::size_t(i)] - v0;
        EXPECT_EQ(tg[i], id >= 0 && id < v ? row[id] : 0.0f);
        double s = 0;
        for (int j = 0; j < v; ++j) s += std::exp(double(row[j]) - mx[i]);
        for (int j = 0; j < v; ++j) {
          const double e = std::exp(double(row[j]) - mx[i]);
          want_exp[std::size_t(i) * v + j] = float(e);
          want_grad[std::size_t(i) * v + j] = float(e / s * scale - (j == id ? scale : 0.0));
        }
      }
      ce_exp_and_sum(tokens, v, mx.data(), lg.data(), se.data());
      test::expect_close(lg, want_exp, 1e-6, 1e-30, "exp");
      std::vector<float> want_sum(tokens);
      for (int i = 0; i < tokens; ++i) {
        double s = 0;
        for (int j = 0; j < v; ++j) s += want_exp[std::size_t(i) * v + j];
        want_sum[i] = float(s);
      }
      test::expect_close(se, want_sum, 1e-6, 0.0, "row sum");
      ce_gradient(tokens, v, v0, targets.data(), se.data(), scale, lg.data());
      test::expect_close(lg, want_grad, 1e-5, 1e-7, "gradient");
    }
}

TEST(CrossEntropy, GradientIsTheLossDerivative) {
  const int tokens = 4, v = 37;
  const auto logits = test::random_vector(std::size_t(tokens) * v, 11, -3, 3);
  const auto targets = ids(tokens, 0, v, 5);
  std::vector<float> g = logits, mx(tokens), tg(tokens), se(tokens);
  ce_max_and_target(tokens, v, 0, g.data(), targets.data(), mx.data(), tg.data());
  ce_exp_and_sum(tokens, v, mx.data(), g.data(), se.data());
  ce_gradient(tokens, v, 0, targets.data(), se.data(), 1.0f / tokens, g.data());
  for (std::size_t k : {std::size_t(0), std::size_t(5), std::size_t(v + 3), std::size_t(3 * v + 36)}) {
    std::vector<float> up = logits, down = logits;
    const float h = 1e-2f;
    up[k] += h;
    down[k] -= h;
    const double numeric = (loss(tokens, v, up, targets) - loss(tokens, v, down, targets)) / (2.0 * h);
    EXPECT_NEAR(g[k], numeric, 1e-4) << "logit " << k;
  }
}

TEST(CrossEntropy, AVocabularySplitOverTwoRanksGivesTheUnsplitGradient) {
  const int tokens = 9, v = 64, half = v / 2;
  const auto logits = test::random_vector(std::size_t(tokens) * v, 13, -4, 4);
  const auto targets = ids(tokens, 0, v, 9);
  const float scale = 1.0f / tokens;
  std::vector<float> whole = logits, mx(tokens), tg(tokens), se(tokens);
  ce_max_and_target(tokens, v, 0, whole.data(), targets.data(), mx.data(), tg.data());
  ce_exp_and_sum(tokens, v, mx.data(), whole.data(), se.data());
  ce_gradient(tokens, v, 0, targets.data(), se.data(), scale, whole.data());

  // Each rank's slice [r * half, (r + 1) * half); the all-reduces: max, then sum.
  std::vector<float> part[2], pmx[2], ptg[2], pse[2];
  for (int r = 0; r < 2; ++r) {
    part[r].resize(std::size_t(tokens) * half);
    for (int i = 0; i < tokens; ++i)
      std::copy_n(logits.begin() + std::ptrdiff_t(i * v + r * half), half, part[r].begin() + std::ptrdiff_t(i * half));
    pmx[r].resize(tokens), ptg[r].resize(tokens), pse[r].resize(tokens);
    ce_max_and_target(tokens, half, r * half, part[r].data(), targets.data(), pmx[r].data(), ptg[r].data());
  }
  std::vector<float> max_all(tokens), sum_all(tokens);
  for (int i = 0; i < tokens; ++i) {
    max_all[i] = std::max(pmx[0][i], pmx[1][i]);
    EXPECT_EQ(max_all[i], mx[i]);
    EXPECT_EQ(ptg[0][i] + ptg[1][i], tg[i]);  // exactly one rank owns each target
  }
  for (int r = 0; r < 2; ++r) ce_exp_and_sum(tokens, half, max_all.data(), part[r].data(), pse[r].data());
  for (int i = 0; i < tokens; ++i) sum_all[i] = pse[0][i] + pse[1][i];
  test::expect_close(sum_all, se, 1e-6, 0.0, "row sum");
  for (int r = 0; r < 2; ++r) {
    ce_gradient(tokens, half, r * half, targets.data(), sum_all.data(), scale, part[r].data());
    for (int i = 0; i < tokens; ++i)
      for (int j = 0; j < half; ++j)
        EXPECT_NEAR(part[r][std::size_t(i) * half + j], whole[std::size_t(i) * v + r * half + j], 1e-7)
            << "rank " << r << " token " << i << " logit " << j;
  }
}

}  // namespace
}  // namespace tedsim::kernels
