#pragma once
// Shared by the GPU test programs: the fixture that skips without a device, and seeded random
// inputs.
#include <gtest/gtest.h>

#include <vector>

#include "../kernels/test_util.hpp"
#include "tedsim/kernels/device.hpp"

namespace tedsim::kernels::gpu_test {

// Every GPU test derives from this: on a machine without a usable device it skips, saying why.
class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << describe_cuda_unavailable();
  }
};

using test::random_vector;  // tests/kernels/test_util.hpp

}  // namespace tedsim::kernels::gpu_test
