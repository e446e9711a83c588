// Attention, LayerNorm, GeLU, SwiGLU: fp32 kernels vs fp64 references written here, forward by
// direct comparison and backward by central finite differences of an fp64 loss <y, w>.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "tedsim/kernels/cpu/activations.hpp"
#include "tedsim/kernels/cpu/attention.hpp"
#include "tedsim/kernels/cpu/layernorm.hpp"
#include "test_util.hpp"

namespace tedsim::kernels {
namespace {

using VecD = std::vector<double>;
VecD to_double(const std::vector<float>& v) { return VecD(v.begin(), v.end()); }
double dot(const VecD& a, const std::vector<float>& w) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * w[i];
  return s;
}

// Central differences of loss(x) in fp64 (step 1e-5: truncation ~1e-10, rounding ~1e-11).
std::vector<double> numeric_grad(const std::function<double(const VecD&)>& loss, VecD x) {
  std::vector<double> g(x.size());
  const double h = 1e-5;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double lp = loss(x);
    x[i] = keep - h;
    const double lm = loss(x);
    x[i] = keep;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

void expect_grad(const std::vector<float>& analytic, const std::vector<double>& numeric, double tol, const char* what) {
  ASSERT_EQ(analytic.size(), numeric.size());
  double scale = 0;
  for (double v : numeric) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    ASSERT_NEAR(analytic[i], numeric[i], tol * (scale + 1e-3)) << what << " index " << i;
  }
  EXPECT_GT(scale, 1e-3) << what << ": gradient should not be trivially zero";
}

// ---- attention reference (fp64), one loss over all outputs: q and k of d, v and out of dv.
VecD attention_ref(int heads, int s, int d, int dv, bool causal, const VecD& q, const VecD& k, const VecD& v) {
  VecD out(static_cast<std::size_t>(heads) * s * dv, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int hd = 0; hd < heads; ++hd) {
    const std::size_t o = static_cast<std::size_t>(hd) * s * d, ov = static_cast<std::size_t>(hd) * s * dv;
    for (int i = 0; i < s; ++i) {
      std::vector<double> p(s, 0.0);
      const int valid = causal ? i + 1 : s;
      double m = -1e300;
      for (int j = 0; j < valid; ++j) {
        double acc = 0;
        for (int c = 0; c < d; ++c) acc += q[o + i * d + c] * k[o + j * d + c];
        p[j] = acc * scale;
        m = std::max(m, p[j]);
      }
      double sum = 0;
      for (int j = 0; j < valid; ++j) sum += (p[j] = std::exp(p[j] - m));
      for (int j = 0; j < valid; ++j) {
        for (int c = 0; c < dv; ++c) out[ov + i * dv + c] += p[j] / sum * v[ov + j * dv + c];
      }
    }
  }
  return out;
}

// One head size for all three (multi-head and grouped-query attention), and MLA's value heads of
// another size than its query/key heads.
TEST(Attention, ForwardAndBackward) {
  for (const int dv : {4, 6, 3})
    for (bool causal : {false, true}) {
      const int heads = 2, s = 7, d = 4;
      const std::size_t n = static_cast<std::size_t>(heads) * s * d, nv = static_cast<std::size_t>(heads) * s * dv;
      const auto q = test::random_vector(n, 1), k = test::random_vector(n, 2), v = test::random_vector(nv, 3);
      const auto w = test::random_vector(nv, 4);  // loss = <out, w>, so grad_out = w
      std::vector<float> probs(static_cast<std::size_t>(heads) * s * s), out(nv);
      if (dv == d)
        attention_forward(heads, s, d, causal, q.data(), k.data(), v.data(), probs.data(), out.data());
      else
        attention_forward(heads, s, d, dv, causal, q.data(), k.data(), v.data(), probs.data(), out.data());
      const VecD ref = attention_ref(heads, s, d, dv, causal, to_double(q), to_double(k), to_double(v));
      test::expect_close(out, std::vector<float>(ref.begin(), ref.end()), 1e-5, 1e-6, "attention out");
      if (causal) {
        EXPECT_EQ(probs[1], 0.0f);  // row 0 sees only key 0
      }

      std::vector<float> gq(n), gk(n), gv(nv);
      if (dv == d)
        attention_backward(heads, s, d, q.data(), k.data(), v.data(), probs.data(), w.data(), gq.data(), gk.data(),
                           gv.data());
      else
        attention_backward(heads, s, d, dv, q.data(), k.data(), v.data(), probs.data(), w.data(), gq.data(),
                           gk.data(), gv.data());
      const VecD qd = to_double(q), kd = to_double(k), vd = to_double(v);
      const auto loss = [&](const VecD& qq, const VecD& kk, const VecD& vv) {
        return dot(attention_ref(heads, s, d, dv, causal, qq, kk, vv), w);
      };
      expect_grad(gq, numeric_grad([&](const VecD& x) { return loss(x, kd, vd); }, qd), 1e-4, "dq");
      expect_grad(gk, numeric_grad([&](const VecD& x) { return loss(qd, x, vd); }, kd), 1e-4, "dk");
      expect_grad(gv, numeric_grad([&](const VecD& x) { return loss(qd, kd, x); }, vd), 1e-4, "dv");
    }
}

// ---- layernorm reference (fp64): x, gamma, beta packed as one vector for finite differences.
VecD layernorm_ref(int rows, int h, double eps, const VecD& x, const VecD& gamma, const VecD& beta) {
  VecD y(x.size());
  for (int r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int i = 0; i < h; ++i) mu += x[r * h + i];
    mu /= h;
    for (int i = 0; i < h; ++i) var += (x[r * h + i] - mu) * (x[r * h + i] - mu);
    const double rs = 1.0 / std::sqrt(var / h + eps);
    for (int i = 0; i < h; ++i) y[r * h + i] = (x[r * h + i] - mu) * rs * gamma[i] + beta[i];
  }
  return y;
}

TEST(LayerNorm, ForwardAndBackward) {
  const int rows = 5, h = 24;
  const float eps = 1e-5f;
  const auto x = test::random_vector(rows * h, 1, -2, 2), gamma = test::random_vector(h, 2, 0.5, 1.5),
             beta = test::random_vector(h, 3), w = test::random_vector(rows * h, 4);
  std::vector<float> y(rows * h), mean(rows), rstd(rows);
  layernorm_forward(rows, h, eps, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data());
  const VecD xd = to_double(x), gd = to_double(gamma), bd = to_double(beta);
  const VecD ref = layernorm_ref(rows, h, eps, xd, gd, bd);
  test::expect_close(y, std::vector<float>(ref.begin(), ref.end()), 1e-5, 1e-5, "layernorm y");

  std::vector<float> gx(rows * h), gg(h), gb(h);
  layernorm_backward(rows, h, x.data(), gamma.data(), mean.data(), rstd.data(), w.data(), gx.data(), gg.data(),
                     gb.data());
  expect_grad(gx, numeric_grad([&](const VecD& v) { return dot(layernorm_ref(rows, h, eps, v, gd, bd), w); }, xd), 1e-4,
              "dx");
  expect_grad(gg, numeric_grad([&](const VecD& v) { return dot(layernorm_ref(rows, h, eps, xd, v, bd), w); }, gd), 1e-4,
              "dgamma");
  expect_grad(gb, numeric_grad([&](const VecD& v) { return dot(layernorm_ref(rows, h, eps, xd, gd, v), w); }, bd), 1e-4,
              "dbeta");
}

VecD gelu_ref(const VecD& x) {
  VecD y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    y[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  return y;
}

TEST(Gelu, ForwardAndBackward) {
  auto x = test::random_vector(200, 1, -6, 6);
  x[0] = 0.0f;
  x[1] = -20.0f;  // saturated tails must stay finite
  x[2] = 20.0f;
  const auto w = test::random_vector(200, 2);
  std::vector<float> y(200), gx(200);
  gelu_forward(x.size(), x.data(), y.data());
  const VecD ref = gelu_ref(to_double(x));
  test::expect_close(y, std::vector<float>(ref.begin(), ref.end()), 1e-5, 1e-6, "gelu y");
  gelu_backward(x.size(), x.data(), w.data(), gx.data());
  expect_grad(gx, numeric_grad([&](const VecD& v) { return dot(gelu_ref(v), w); }, to_double(x)), 1e-4, "gelu dx");
}

VecD swiglu_ref(int rows, int f, const VecD& x) {
  VecD y(static_cast<std::size_t>(rows) * f);
  for (int r = 0; r < rows; ++r) {
    for (int i = 0; i < f; ++i) {
      const double a = x[r * 2 * f + i], b = x[r * 2 * f + f + i];
      y[r * f + i] = a / (1 + std::exp(-a)) * b;
    }
  }
  return y;
}

TEST(SwiGlu, ForwardAndBackward) {
  const int rows = 6, f = 10;
  const auto x = test::random_vector(rows * 2 * f, 1, -4, 4), w = test::random_vector(rows * f, 2);
  std::vector<float> y(rows * f), gx(rows * 2 * f);
  swiglu_forward(rows, f, x.data(), y.data());
  const VecD ref = swiglu_ref(rows, f, to_double(x));
  test::expect_close(y, std::vector<float>(ref.begin(), ref.end()), 1e-5, 1e-6, "swiglu y");
  swiglu_backward(rows, f, x.data(), w.data(), gx.data());
  expect_grad(gx, numeric_grad([&](const VecD& v) { return dot(swiglu_ref(rows, f, v), w); }, to_double(x)), 1e-4,
              "swiglu dx");
}

}  // namespace
}  // namespace tedsim::kernels
