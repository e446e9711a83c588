#pragma once
// A profile from datasheet numbers: peaks times the topology's efficiency curves for kernels, an
// alpha-beta model per link level for collectives. What tedsim uses before any calibration.
#include "tedsim/profile/curve.hpp"
#include "tedsim/profile/profile.hpp"
#include "tedsim/spec/topology_spec.hpp"

namespace tedsim {

class AnalyticProfile final : public Profile {
 public:
  explicit AnalyticProfile(const TopologySpec& topology);
  double gemm_seconds(const GemmShape& shape) const override;
  double kernel_seconds(KernelKind kind, double bytes, Dtype dtype) const override;
  double collective_seconds(CollectiveOp op, const GroupSpan& span, double bytes) const override;
  double p2p_seconds(const GroupSpan& span, double bytes) const override;
  // From the topology's measured attention rates (efficiency.attention); -1 without them.
  double attention_seconds(AttentionKernel kernel, bool backward, const AttentionShape& shape) const override;
  Fp8Quantize fp8_quantize() const override { return fp8_quantize_bytes(topo_.device.fp8_recipe); }
  double host_op_seconds() const override { return topo_.host.framework_op_us * 1e-6; }
  int device_sms() const override { return topo_.device.sms; }
  std::string describe() const override;

 private:
  // The rate (TFLOP/s) of `curves` (by head dim 64, 128) at this head dim and sequence length:
  // interpolated in log(head dim) between the two, the one there is where only one is measured.
  static double rate_at(const LogCurve (&curves)[2], double head_dim, double seq);

  TopologySpec topo_;
  LogCurve gemm_by_flops_, gemm_by_min_dim_, memory_by_bytes_, fp8_scale_by_flops_;
  LogCurve flash_forward_[2], flash_backward_[2], unfused_[2], fp8_forward_[2], fp8_backward_[2];
  double launch_s_;
};

}  // namespace tedsim
