#pragma once
// Device arrays and tolerance checks shared by the GPU kernel tests: an array filled from the host
// and read back, and the comparisons against a CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tedsim/kernels/cuda/cuda_kernels.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"

namespace tedsim::kernels::gpu_test {

constexpr float kGarbage = 12345.0f;  // initial value of outputs that must be overwritten

// A device array filled from the host through cuda::copy (so the copies are exercised everywhere);
// 4 spare bytes keep the pointer non-null for empty arrays.
template <class T>
struct Dev {
  cuda::DeviceBuffer buf;
  std::size_t n;
  explicit Dev(const std::vector<T>& host) : buf(host.size() * sizeof(T) + 4), n(host.size()) {
    cuda::copy(buf.data(), host.data(), n * sizeof(T));
  }
  Dev(std::size_t count, T fill) : Dev(std::vector<T>(count, fill)) {}
  T* ptr() { return buf.as<T>(); }
  std::vector<T> host() const {
    cuda::synchronize();
    std::vector<T> h(n);
    cuda::copy(h.data(), buf.data(), n * sizeof(T));
    return h;
  }
};
using DevF = Dev<float>;
using DevI = Dev<std::int32_t>;

// |gpu - ref| <= rtol * (|ref| + scale).
void expect_close(const std::vector<float>& gpu, const std::vector<float>& ref, double rtol, double scale,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_LE(std::abs(static_cast<double>(gpu[i]) - ref[i]), rtol * (std::abs(ref[i]) + scale))
        << what << " index " << i << ": " << gpu[i] << " vs " << ref[i];
  }
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

// For sums of many terms: rounding noise scales with the largest entries, not with each one. The
// 1e-6 floor keeps an all-zero reference from demanding bit-exact zeros of a different sum order.
void expect_close_to_max(const std::vector<float>& gpu, const std::vector<float>& ref, double rtol,
                         const std::string& what) {
  expect_close(gpu, ref, rtol, max_abs(ref) + 1e-6, what);
}

}  // namespace tedsim::kernels::gpu_test
