// FP8 on the device against the CPU reference (kernels/cpu/fp8.hpp): the E4M3 quantization bit
// for bit, and cuBLASLt's scaled FP8 GEMM against the product of the same quantized values in
// double, within the bf16 rounding of its output. Skips on devices without FP8 tensor cores.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/fp8.hpp"
#include "tedsim/kernels/cuda/step_kernels.hpp"
#include "gpu_device_arrays.hpp"
#include "gpu_test_support.hpp"

namespace tedsim::kernels {
namespace {

namespace cu = tedsim::kernels::cuda;
using gpu_test::DevF;
using gpu_test::random_vector;

class GpuFp8 : public gpu_test::Gpu {
 protected:
  void SetUp() override {
    gpu_test::Gpu::SetUp();
    if (IsSkipped()) return;
    std::string why;
    if (!cu::fp8_gemm_supported(&why)) GTEST_SKIP() << why;
  }
};

// E4M3 bytes back to floats on the host (the format's definition; test_fp8.cpp checks the CPU
// rounding against the same).
float e4m3_to_float(std::uint8_t b) {
  const int sign = b >> 7, exponent = (b >> 3) & 15, mantissa = b & 7;
  const double v = exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return float(sign ? -v : v);
}

std::vector<float> quantize_on_device(const std::vector<float>& x, float scale, cu::DeviceBuffer& bytes) {
  DevF dx(x);
  bytes = cu::DeviceBuffer(x.size() + 4);
  cu::quantize_e4m3(dx.ptr(), x.size(), scale, bytes.data());
  cu::synchronize();
  std::vector<std::uint8_t> host(x.size());
  cu::copy(host.data(), bytes.data(), host.size());
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = e4m3_to_float(host[i]);
  return out;
}

TEST_F(GpuFp8, QuantizationMatchesTheCpuRounding) {
  std::vector<float> x = random_vector(10007, 51, -3, 3);
  x.insert(x.end(), {0.0f, 1.0625f, 1.1875f, 500.0f, -1e6f, 1e-4f});
  for (float scale : {1.0f, 37.5f, 0.01f}) {
    cu::DeviceBuffer bytes;
    const std::vector<float> got = quantize_on_device(x, scale, bytes);
    const std::vector<float> want = quantize_e4m3(x, scale);
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << "x " << x[i] << " scale " << scale;
  }
}

// C = (a_scale A) (w_scale W)^T in bf16 against double sums of the same E4M3 values.
TEST_F(GpuFp8, ScaledGemmMatchesTheProductOfItsQuantizedInputs) {
  cu::BlasHandle blas;
  struct Shape {
    int m, n, k;
  };
  for (const Shape& s : {Shape{16, 16, 16}, Shape{128, 96, 272}, Shape{1040, 2048, 512}}) {
    const float a_quant = 64.0f, w_quant = 200.0f;  // the quantization scales; the GEMM takes their inverses
    cu::DeviceBuffer a8, w8;
    const std::vector<float> a = quantize_on_device(random_vector(std::size_t(s.m) * s.k, 52, -2, 2), a_quant, a8);
    const std::vector<float> w = quantize_on_device(random_vector(std::size_t(s.n) * s.k, 53, -1, 1), w_quant, w8);
    DevF a_scale(std::vector<float>{1.0f / a_quant}), w_scale(std::vector<float>{1.0f / w_quant});
    cu::DeviceBuffer c(std::size_t(s.m) * s.n * 2);
    cu::gemm_fp8(blas, s.m, s.n, s.k, a8.data(), w8.data(), a_scale.ptr(), w_scale.ptr(), c.data());
    DevF c32(std::size_t(s.m) * s.n, 0.0f);
    cu::convert_to_fp32(c.data(), Dtype::bf16, c32.ptr(), std::size_t(s.m) * s.n);
    const std::vector<float> got = c32.host();
    for (int i = 0; i < s.m; ++i)
      for (int j = 0; j < s.n; ++j) {
        double want = 0, magnitude = 0;
        for (int p = 0; p < s.k; ++p) {
          const double term = double(a[std::size_t(i) * s.k + p]) * w[std::size_t(j) * s.k + p];
          want += term;
          magnitude += std::abs(term);
        }
        want /= double(a_quant) * w_quant;
        magnitude /= double(a_quant) * w_quant;
        // bf16 output: 2^-8 relative; fp32 accumulation of k terms far below that.
        ASSERT_NEAR(got[std::size_t(i) * s.n + j], want, 1e-2 * std::abs(want) + 1e-4 * magnitude + 1e-6)
            << s.m << "x" << s.n << "x" << s.k << " at " << i << "," << j;
      }
  }
}

TEST_F(GpuFp8, ShapesOffTheFp8LayoutAreRefused) {
  cu::BlasHandle blas;
  cu::DeviceBuffer a(64 * 64), w(64 * 64), c(64 * 64 * 2);
  DevF one(std::vector<float>{1.0f});
  EXPECT_THROW(cu::gemm_fp8(blas, 17, 16, 16, a.data(), w.data(), one.ptr(), one.ptr(), c.data()), InputError);
}

}  // namespace
}  // namespace tedsim::kernels
