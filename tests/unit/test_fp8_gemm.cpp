// FP8 GEMMs on the analytic profile: the topology's fp8_gemm_scale_by_flops scales the bf16
// curve's efficiency for FP8 GEMMs at the FP8 peak (hand-computed here), and bad scales are
// named by key.
#include <gtest/gtest.h>

#include <string>

#include "tedsim/core/error.hpp"
#include "tedsim/profile/analytic_profile.hpp"

namespace tedsim {
namespace {

std::string topology_text(const std::string& extra, const std::string& peaks = "{fp32: 67, bf16: 1000, fp8: 2000}") {
  return R"(name: fp8-test
device:
  kind: gpu
  name: test GPU
  memory_gib: 80
  peak_tflops: )" + peaks + R"(
  memory_bandwidth_gbs: 3000
devices_per_node: 8
intra_node: {bandwidth_gbs: 450, latency_us: 1}
inter_node: {bandwidth_gbs: 400, latency_us: 5}
efficiency:
  gemm_by_flops: [[1.0e6, 0.5], [1.0e12, 0.5]]
  gemm_by_min_dim: [[1, 1.0], [1024, 1.0]]
  memory_by_bytes: [[1024, 0.5], [1.0e9, 0.5]]
)" + extra;
}

TEST(Fp8Gemm, TheScaleCurveMultipliesTheBf16EfficiencyAtTheFp8Peak) {
  const AnalyticProfile p(topology_from_yaml_text(
      topology_text("  fp8_gemm_scale_by_flops: [[1.0e9, 0.5], [1.0e11, 0.9]]\n"), "fp8-test"));
  const GemmShape big{4096, 4096, 4096, 1, Dtype::fp8};  // 1.37e11 FLOPs: the curve's last point holds
  EXPECT_NEAR(p.gemm_seconds(big), big.flops() / (2000e12 * 0.5 * 0.9), 1e-12);
  GemmShape bf16 = big;
  bf16.dtype = Dtype::bf16;
  EXPECT_NEAR(p.gemm_seconds(bf16), bf16.flops() / (1000e12 * 0.5), 1e-12);
  // 1e10 FLOPs lies halfway in log between the points: scale 0.7.
  const GemmShape mid{1000, 1000, 5000, 1, Dtype::fp8};
  EXPECT_NEAR(p.gemm_seconds(mid), mid.flops() / (2000e12 * 0.5 * 0.7), 1e-12);
  // Without the curve FP8 runs at the bf16 curve.
  const AnalyticProfile plain(topology_from_yaml_text(topology_text(""), "fp8-test"));
  EXPECT_NEAR(plain.gemm_seconds(big), big.flops() / (2000e12 * 0.5), 1e-12);
}

TEST(Fp8Gemm, BadScalesNameTheKey) {
  const auto error_of = [](const std::string& text) {
    try {
      topology_from_yaml_text(text, "fp8-test");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(topology_text("  fp8_gemm_scale_by_flops: [[1.0e9, 1.5]]\n")).find("efficiency.fp8_gemm_scale_by_flops"),
            std::string::npos);
  EXPECT_NE(error_of(topology_text("  fp8_gemm_scale_by_flops: [[1.0e9, 0.8]]\n", "{fp32: 67, bf16: 1000}"))
                .find("has no fp8 peak"),
            std::string::npos);
}

}  // namespace
}  // namespace tedsim
