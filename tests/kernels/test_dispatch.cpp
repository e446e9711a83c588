// Dispatch then combine reproduces the gate-weighted input; backward passes vs finite differences.
#include <gtest/gtest.h>

#include "tedsim/kernels/cpu/dispatch.hpp"
#include "test_util.hpp"

namespace tedsim::kernels {
namespace {

TEST(DispatchCombine, RoundTripIsGateWeightedInput) {
  for (int k : {1, 2, 4}) {
    const int T = 97, E = 8, h = 33;
    const auto logits = test::random_vector(T * E, 5 + k);
    const auto x = test::random_vector(T * h, 9 + k);
    GatingOutput g;
    gating_forward(logits.data(), T, E, GatingConfig{k, 100.0, 4, true}, g);  // C large: no drops
    std::vector<float> buf(static_cast<std::size_t>(E) * g.capacity * h, 123.0f), out(T * h);
    dispatch(g, x.data(), h, buf.data());
    combine(g, buf.data(), h, out.data());
    std::vector<float> expect(T * h);
    for (int t = 0; t < T; ++t) {
      double wsum = 0;
      for (int j = 0; j < k; ++j) wsum += g.weight[t * k + j];
      if (k > 1) {
        EXPECT_NEAR(wsum, 1.0, 1e-5);
      }
      for (int c = 0; c < h; ++c) expect[t * h + c] = static_cast<float>(wsum * x[t * h + c]);
    }
    test::expect_close(out, expect, 1e-5, 1e-6, "combine(dispatch(x))");
    // Empty slots are zero-filled (the sentinel 123 must be gone everywhere).
    for (int e = 0; e < E; ++e) {
      for (int p = g.kept[e]; p < g.capacity; ++p) {
        for (int c = 0; c < h; ++c) ASSERT_EQ(buf[(static_cast<std::size_t>(e) * g.capacity + p) * h + c], 0.0f);
      }
    }
  }
}

TEST(DispatchCombine, DroppedTokensContributeNothing) {
  const int T = 64, E = 4, h = 8;
  const auto logits = test::random_vector(T * E, 1);
  const auto x = test::random_vector(T * h, 2);
  GatingOutput g;
  gating_forward(logits.data(), T, E, GatingConfig{1, 0.5, 1, true}, g);
  std::vector<float> buf(static_cast<std::size_t>(E) * g.capacity * h), out(T * h);
  dispatch(g, x.data(), h, buf.data());
  combine(g, buf.data(), h, out.data());
  int dropped = 0;
  for (int t = 0; t < T; ++t) {
    const bool kept = g.position[t] >= 0;
    dropped += !kept;
    for (int c = 0; c < h; ++c) {
      EXPECT_FLOAT_EQ(out[t * h + c], kept ? g.weight[t] * x[t * h + c] : 0.0f);
    }
  }
  EXPECT_GT(dropped, 0);
}

TEST(DispatchCombine, BackwardIsAdjoint) {
  // dispatch is linear in x: <dispatch(x), gb> == <x, dispatch_backward(gb)>. combine is bilinear
  // in (buf, w): check grad_buf and grad_weight against the explicit derivatives.
  const int T = 50, E = 4, h = 16, k = 2;
  const auto logits = test::random_vector(T * E, 11);
  GatingOutput g;
  gating_forward(logits.data(), T, E, GatingConfig{k, 0.8, 1, true}, g);
  const std::size_t nbuf = static_cast<std::size_t>(E) * g.capacity * h;
  const auto x = test::random_vector(T * h, 12);
  const auto gb = test::random_vector(nbuf, 13);
  std::vector<float> buf(nbuf), gx(T * h);
  dispatch(g, x.data(), h, buf.data());
  dispatch_backward(g, gb.data(), h, gx.data());
  double lhs = 0, rhs = 0;
  for (std::size_t i = 0; i < nbuf; ++i) lhs += static_cast<double>(buf[i]) * gb[i];
  for (int i = 0; i < T * h; ++i) rhs += static_cast<double>(x[i]) * gx[i];
  EXPECT_NEAR(lhs, rhs, 1e-4 * std::abs(lhs) + 1e-4);

  const auto go = test::random_vector(T * h, 14);
  std::vector<float> gbuf(nbuf), gw(T * k), out(T * h);
  combine_backward(g, buf.data(), go.data(), h, gbuf.data(), gw.data());
  // <combine(buf), go> == <buf, gbuf> (linear in buf).
  combine(g, buf.data(), h, out.data());
  double l2 = 0, r2 = 0;
  for (int i = 0; i < T * h; ++i) l2 += static_cast<double>(out[i]) * go[i];
  for (std::size_t i = 0; i < nbuf; ++i) r2 += static_cast<double>(buf[i]) * gbuf[i];
  EXPECT_NEAR(l2, r2, 1e-4 * std::abs(l2) + 1e-4);
  // d<combine, go>/dw[t,j] = <go[t], buf[e,pos]> = <go[t], x[t]> for kept choices.
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < k; ++j) {
      double d = 0;
      if (g.position[t * k + j] >= 0) {
        for (int c = 0; c < h; ++c) d += static_cast<double>(go[t * h + c]) * x[t * h + c];
      }
      EXPECT_NEAR(gw[t * k + j], d, 1e-5 + 1e-5 * std::abs(d));
    }
  }
}

}  // namespace
}  // namespace tedsim::kernels
