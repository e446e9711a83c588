// Eigen GEMM wrapper vs the naive fp64-accumulating reference over shapes, transposes, alpha/beta
// and leading dimensions larger than the logical width; grouped GEMM vs per-group references.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tedsim/kernels/cpu/gemm.hpp"
#include "test_util.hpp"

namespace tedsim::kernels {
namespace {

struct Shape {
  int m, n, k;
};

TEST(Gemm, MatchesReferenceAllTransposes) {
  const Shape shapes[] = {{1, 1, 1}, {7, 5, 3}, {64, 256, 64}, {33, 17, 129}, {128, 1, 40}};
  int seed = 0;
  for (const Shape s : shapes) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (float beta : {0.0f, 0.5f}) {
          GemmOp op{ta == 1, tb == 1, 1.5f, beta};
          const int pad = 3;  // leading dimensions wider than the matrices
          const int lda = (ta ? s.m : s.k) + pad, ldb = (tb ? s.k : s.n) + pad, ldc = s.n + pad;
          const auto a = test::random_vector(static_cast<std::size_t>(ta ? s.k : s.m) * lda, ++seed);
          const auto b = test::random_vector(static_cast<std::size_t>(tb ? s.n : s.k) * ldb, ++seed);
          auto c = test::random_vector(static_cast<std::size_t>(s.m) * ldc, ++seed);
          if (beta == 0.0f) {
            for (float& v : c) v = std::numeric_limits<float>::quiet_NaN();  // beta 0: C must not be read
          }
          auto c_ref = c;
          gemm(op, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c.data(), ldc);
          gemm_reference(op, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, c_ref.data(), ldc);
          for (int i = 0; i < s.m; ++i) {
            for (int j = 0; j < s.n; ++j) {
              ASSERT_NEAR(c[i * ldc + j], c_ref[i * ldc + j], 1e-5 * s.k + 1e-5)
                  << s.m << "x" << s.n << "x" << s.k << " ta=" << ta << " tb=" << tb << " beta=" << beta;
            }
          }
        }
      }
    }
  }
}

TEST(Gemm, ReferenceIsAProduct) {
  // [[1,2],[3,4]] x [[5,6],[7,8]] = [[19,22],[43,50]]: pins the reference itself.
  const float a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8};
  float c[4];
  gemm_reference(GemmOp{}, 2, 2, 2, a, 2, b, 2, c, 2);
  EXPECT_EQ(c[0], 19);
  EXPECT_EQ(c[1], 22);
  EXPECT_EQ(c[2], 43);
  EXPECT_EQ(c[3], 50);
  gemm(GemmOp{true, false, 1.0f, 0.0f}, 2, 2, 2, a, 2, b, 2, c, 2);  // A^T = [[1,3],[2,4]]
  EXPECT_EQ(c[0], 26);
  EXPECT_EQ(c[3], 44);
}

TEST(GemmGrouped, PerExpertTokenCounts) {
  const int groups = 4, rows = 16, n = 24, k = 20;
  const int m[groups] = {16, 0, 5, 11};
  const auto a = test::random_vector(static_cast<std::size_t>(groups) * rows * k, 1);
  for (int tb = 0; tb < 2; ++tb) {
    const auto b = test::random_vector(static_cast<std::size_t>(groups) * k * n, 2 + tb);
    std::vector<float> c(static_cast<std::size_t>(groups) * rows * n, -7.0f);
    GemmOp op{false, tb == 1, 1.0f, 0.0f};
    gemm_grouped_strided(op, groups, m, rows, n, k, a.data(), b.data(), c.data());
    for (int g = 0; g < groups; ++g) {
      std::vector<float> ref(static_cast<std::size_t>(rows) * n, -7.0f);
      gemm_reference(op, m[g], n, k, a.data() + g * rows * k, k, b.data() + g * k * n, tb ? k : n, ref.data(), n);
      for (int i = 0; i < rows * n; ++i) {
        // rows past m[g] are untouched (still the sentinel)
        ASSERT_NEAR(c[g * rows * n + i], ref[i], 1e-4) << "group " << g << " i " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tedsim::kernels
