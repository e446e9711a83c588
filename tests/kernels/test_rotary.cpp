// Rotary position embeddings against a complex-number reference, and the properties the step
// relies on: pass-through outside the rotated part, the backward pass as the exact transpose,
// and attention scores that depend on relative positions only.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>

#include "test_util.hpp"
#include "tedsim/kernels/cpu/rotary.hpp"

namespace tedsim::kernels {
namespace {

struct Rope {
  int seq = 5, heads = 3, head_dim = 8, rotary_dim = 6, extra = 4;  // extra: row columns past the heads
  double theta = 10000.0;
  int stride() const { return heads * head_dim + extra; }
  std::vector<float> cos, sin;
  Rope() : cos(std::size_t(seq) * 3), sin(std::size_t(seq) * 3) {
    rotary_table(seq, rotary_dim, theta, cos.data(), sin.data());
  }
  void forward(int rows, std::vector<float>& x) const {
    rotary_forward(rows, seq, heads, head_dim, rotary_dim, stride(), cos.data(), sin.data(), x.data());
  }
  void backward(int rows, std::vector<float>& g) const {
    rotary_backward(rows, seq, heads, head_dim, rotary_dim, stride(), cos.data(), sin.data(), g.data());
  }
};

TEST(Rotary, ForwardMatchesTheComplexRotationReference) {
  const Rope r;
  const int rows = 2 * r.seq;  // two sequences
  const auto x0 = test::random_vector(std::size_t(rows) * r.stride(), 11);
  auto y = x0;
  r.forward(rows, y);
  std::vector<float> ref = x0;
  const int half = r.rotary_dim / 2;
  for (int row = 0; row < rows; ++row)
    for (int h = 0; h < r.heads; ++h)
      for (int i = 0; i < half; ++i) {
        const std::size_t a = std::size_t(row) * r.stride() + std::size_t(h) * r.head_dim + i;
        const double angle = double(row % r.seq) / std::pow(r.theta, double(2 * i) / r.rotary_dim);
        const std::complex<double> z = std::complex<double>(x0[a], x0[a + half]) * std::polar(1.0, angle);
        ref[a] = float(z.real());
        ref[a + half] = float(z.imag());
      }
  // Everything outside the rotated part (head elements past rotary_dim, the columns past the
  // heads) is ref's copy of the input, so the comparison also checks it is left alone.
  test::expect_close(y, ref, 1e-5, 1e-6, "rotary y");
}

TEST(Rotary, TheFirstPositionIsLeftAsItIs) {
  const Rope r;
  const auto x0 = test::random_vector(std::size_t(r.seq) * r.stride(), 12);
  auto y = x0;
  r.forward(r.seq, y);
  for (int c = 0; c < r.stride(); ++c) EXPECT_EQ(y[c], x0[c]) << "column " << c;
}

TEST(Rotary, BackwardIsTheTransposeAndTheInverse) {
  const Rope r;
  const int rows = 3 * r.seq;
  const auto x = test::random_vector(std::size_t(rows) * r.stride(), 13);
  const auto g = test::random_vector(x.size(), 14);
  auto fx = x;
  r.forward(rows, fx);
  auto bg = g;
  r.backward(rows, bg);
  double lhs = 0, rhs = 0;  // <R x, g> = <x, R^T g>
  for (std::size_t i = 0; i < x.size(); ++i) {
    lhs += double(fx[i]) * g[i];
    rhs += double(x[i]) * bg[i];
  }
  EXPECT_NEAR(lhs, rhs, 1e-4 * std::max(1.0, std::fabs(lhs)));
  auto back = fx;  // a rotation's transpose undoes it
  r.backward(rows, back);
  test::expect_close(back, x, 1e-5, 1e-5, "R^T R x");
}

TEST(Rotary, ScoresDependOnRelativePositionOnly) {
  // q at position p against k at position p': the same vectors placed at (p, p') and (p + 2, p' + 2)
  // give the same dot product (what makes RoPE a relative position encoding).
  Rope r;
  r.heads = 1;
  r.extra = 0;
  r.rotary_dim = r.head_dim;
  r.cos.assign(std::size_t(r.seq) * r.head_dim / 2, 0);
  r.sin.assign(r.cos.size(), 0);
  rotary_table(r.seq, r.rotary_dim, r.theta, r.cos.data(), r.sin.data());
  const auto q = test::random_vector(std::size_t(r.head_dim), 15);
  const auto k = test::random_vector(std::size_t(r.head_dim), 16);
  auto score = [&](int pq, int pk) {
    std::vector<float> qs(std::size_t(r.seq) * r.head_dim), ks(qs.size());
    std::copy(q.begin(), q.end(), qs.begin() + std::ptrdiff_t(pq) * r.head_dim);
    std::copy(k.begin(), k.end(), ks.begin() + std::ptrdiff_t(pk) * r.head_dim);
    r.forward(r.seq, qs);
    r.forward(r.seq, ks);
    double s = 0;
    for (int i = 0; i < r.head_dim; ++i) s += double(qs[std::size_t(pq) * r.head_dim + i]) * ks[std::size_t(pk) * r.head_dim + i];
    return s;
  };
  EXPECT_NEAR(score(1, 0), score(3, 2), 1e-5);
  EXPECT_NEAR(score(0, 2), score(2, 4), 1e-5);
  EXPECT_GT(std::fabs(score(1, 0) - score(2, 0)), 1e-4);  // and it does depend on the distance
}

}  // namespace
}  // namespace tedsim::kernels
