// RMSNorm against an fp64 reference and its backward against central differences.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.hpp"
#include "tedsim/kernels/cpu/rmsnorm.hpp"

namespace tedsim::kernels {
namespace {

TEST(RmsNorm, ForwardMatchesTheFp64Reference) {
  const int rows = 7, h = 48;
  const auto x = test::random_vector(std::size_t(rows) * h, 1, -2.0f, 2.0f);
  const auto g = test::random_vector(h, 2, 0.5f, 1.5f);
  std::vector<float> y(x.size()), rstd(rows);
  rmsnorm_forward(rows, h, 1e-6f, x.data(), g.data(), y.data(), rstd.data());
  std::vector<float> ref(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < h; ++i) ss += double(x[r * h + i]) * x[r * h + i];
    const double s = 1.0 / std::sqrt(ss / h + 1e-6);
    for (int i = 0; i < h; ++i) ref[r * h + i] = float(x[r * h + i] * s * g[i]);
  }
  test::expect_close(y, ref, 1e-6, 1e-6, "rmsnorm y");
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int rows = 3, h = 16;
  auto x = test::random_vector(std::size_t(rows) * h, 3, -2.0f, 2.0f);
  auto g = test::random_vector(h, 4, 0.5f, 1.5f);
  const auto gy = test::random_vector(x.size(), 5);
  std::vector<float> y(x.size()), rstd(rows), gx(x.size()), gg(h);
  rmsnorm_forward(rows, h, 1e-6f, x.data(), g.data(), y.data(), rstd.data());
  rmsnorm_backward(rows, h, x.data(), g.data(), rstd.data(), gy.data(), gx.data(), gg.data());
  auto loss = [&]() {
    std::vector<float> yy(x.size()), rr(rows);
    rmsnorm_forward(rows, h, 1e-6f, x.data(), g.data(), yy.data(), rr.data());
    double l = 0;
    for (std::size_t i = 0; i < yy.size(); ++i) l += double(gy[i]) * yy[i];
    return l;
  };
  const float eps = 1e-3f;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    x[i] = x0 + eps;
    const double up = loss();
    x[i] = x0 - eps;
    const double down = loss();
    x[i] = x0;
    EXPECT_NEAR(gx[i], (up - down) / (2 * eps), 2e-3) << "x " << i;
  }
  for (int i = 0; i < h; ++i) {
    const float g0 = g[i];
    g[i] = g0 + eps;
    const double up = loss();
    g[i] = g0 - eps;
    const double down = loss();
    g[i] = g0;
    EXPECT_NEAR(gg[i], (up - down) / (2 * eps), 2e-3) << "gamma " << i;
  }
}

}  // namespace
}  // namespace tedsim::kernels
