#pragma once
// Small helpers shared by the kernel tests: seeded random vectors and max-error comparisons.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace tedsim::kernels::test {

inline std::vector<float> random_vector(std::size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Asserts |a - b| <= atol + rtol * |b| elementwise, reporting the first failure's index.
inline void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rtol, double atol,
                         const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i])) << what << " index " << i;
    ASSERT_LE(std::abs(static_cast<double>(a[i]) - b[i]), atol + rtol * std::abs(static_cast<double>(b[i])))
        << what << " index " << i << ": " << a[i] << " vs " << b[i];
  }
}

}  // namespace tedsim::kernels::test
