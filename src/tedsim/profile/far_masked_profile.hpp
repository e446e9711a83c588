#pragma once
// A measured profile with every lookup far outside its measured sizes answered as free: the same
// configuration predicted through it and through the profile itself differ by exactly the time
// that rests on far extrapolations, which is what a user should know before trusting the answer.
#include "tedsim/profile/measured_profile.hpp"

namespace tedsim {

class FarMaskedProfile final : public Profile {
 public:
  explicit FarMaskedProfile(const MeasuredProfile& measured) : measured_(measured) {}
  double gemm_seconds(const GemmShape& shape) const override {
    return measured_.far_outside(shape) ? 0.0 : measured_.gemm_seconds(shape);
  }
  double kernel_seconds(KernelKind kind, double bytes, Dtype dtype) const override {
    return measured_.far_outside(kind, bytes, dtype) ? 0.0 : measured_.kernel_seconds(kind, bytes, dtype);
  }
  double collective_seconds(CollectiveOp op, const GroupSpan& span, double bytes) const override {
    return measured_.far_outside(op, span, bytes) ? 0.0 : measured_.collective_seconds(op, span, bytes);
  }
  double p2p_seconds(const GroupSpan& span, double bytes) const override { return measured_.p2p_seconds(span, bytes); }
  double arrival_wait_seconds(const GroupSpan& span, double compute_s) const override {
    return measured_.arrival_wait_seconds(span, compute_s);
  }
  std::string describe() const override { return measured_.describe() + " without its far extrapolations"; }

 private:
  const MeasuredProfile& measured_;
};

}  // namespace tedsim
