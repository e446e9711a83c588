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
  std::string describe() const override;

 private:
  TopologySpec topo_;
  LogCurve gemm_by_flops_, gemm_by_min_dim_, memory_by_bytes_;
  double launch_s_;
};

}  // namespace tedsim
