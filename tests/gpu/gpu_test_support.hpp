#pragma once
// Shared by the GPU test programs: the fixture that skips without a device, and seeded random
// inputs.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "tedsim/kernels/device.hpp"

namespace tedsim::kernels::gpu_test {

// Every GPU test derives from this: on a machine without a usable device it skips, saying why.
class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << describe_cuda_unavailable();
  }
};

inline std::vector<float> random_vector(std::size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace tedsim::kernels::gpu_test
