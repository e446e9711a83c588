#include "tedsim/runtime/moe/experts.hpp"

#include <algorithm>

namespace tedsim::runtime {

void GroupedExperts::register_params(ParamRegistrar& reg, const StepContext& c, int expert_rank,
                                     const std::string& prefix, int tensor_id, float stdv, float out_std) {
  const StepDims& d = c.dims;
  const int h = d.hidden, E = d.experts, El = d.local_experts, Fx = d.expert_width, Fe = d.expert_width_local;
  const int part = c.cfg.expert_tp ? d.tensor_rank : 0;
  std::vector<std::pair<int, int>> cols{{part * Fe, (part + 1) * Fe}};
  if (d.swiglu) cols.push_back({Fx + part * Fe, Fx + (part + 1) * Fe});
  const int F1x = d.swiglu ? 2 * Fx : Fx;
  const int a0 = expert_rank * El, a1 = a0 + El;
  fc1_ = reg.add(prefix + "moe.experts.fc1", "expert_fc1", tensor_id, true, false,
                 ParamRegistrar::slice(E, h, F1x, a0, a1, 0, h, cols), 0, stdv);
  fc2_ = reg.add(prefix + "moe.experts.fc2", "expert_fc2", tensor_id + 1, true, false,
                 ParamRegistrar::slice(E, Fx, h, a0, a1, part * Fe, (part + 1) * Fe, {{0, h}}), 0, out_std);
}

float* GroupedExperts::forward(StepContext& c, MoeActs& A) {
  const StepDims& d = c.dims;
  const int h = d.hidden, Fe = d.expert_width_local, F1e = d.expert_fc1_local;
  std::size_t total = 0;
  for (int r : A.expert_rows) total += r;
  ensure(A.expert_fc1_out, std::max<std::size_t>(total * F1e, 1));
  ensure(A.expert_act_out, std::max<std::size_t>(total * Fe, 1));
  float* out = ensure(c.ws.wide1, std::max<std::size_t>(total * h, 1));
  std::size_t off = 0;
  for (int x = 0; x < d.local_experts; ++x) {
    const int R = A.expert_rows[x];
    if (R > 0) {
      float* f1 = A.expert_fc1_out.data() + off * F1e;
      float* a1 = A.expert_act_out.data() + off * Fe;
      c.mm(R, F1e, h, A.expert_in.data() + off * h, c.P(fc1_) + static_cast<std::size_t>(x) * h * F1e, f1);
      c.activation_forward(R, Fe, f1, a1);
      c.mm(R, h, Fe, a1, c.P(fc2_) + static_cast<std::size_t>(x) * Fe * h, out + off * h);
    }
    off += R;
  }
  return out;
}

float* GroupedExperts::backward(StepContext& c, const MoeActs& A, const float* gout) {
  const StepDims& d = c.dims;
  const int h = d.hidden, Fe = d.expert_width_local, F1e = d.expert_fc1_local;
  std::size_t total = 0;
  int most = 0;
  for (int r : A.expert_rows) {
    total += r;
    most = std::max(most, r);
  }
  float* ga1 = ensure(c.ws.scratch, std::max<std::size_t>(std::size_t(most) * Fe, 1));
  Tensor gf1;
  ensure(gf1, std::max<std::size_t>(std::size_t(most) * F1e, 1));
  float* gin = ensure(c.ws.wide2, std::max<std::size_t>(total * h, 1));
  std::size_t off = 0;
  for (int x = 0; x < d.local_experts; ++x) {
    const int R = A.expert_rows[x];
    if (R > 0) {
      const float* go = gout + off * h;
      const float* w1 = c.P(fc1_) + static_cast<std::size_t>(x) * h * F1e;
      const float* w2 = c.P(fc2_) + static_cast<std::size_t>(x) * Fe * h;
      c.mm_bt(R, Fe, h, go, w2, ga1);
      c.mm_at_acc(Fe, h, R, A.expert_act_out.data() + off * Fe, go, c.G(fc2_) + static_cast<std::size_t>(x) * Fe * h);
      c.activation_backward(R, Fe, A.expert_fc1_out.data() + off * F1e, ga1, gf1.data());
      c.mm_at_acc(h, F1e, R, A.expert_in.data() + off * h, gf1.data(),
                  c.G(fc1_) + static_cast<std::size_t>(x) * h * F1e);
      c.mm_bt(R, h, F1e, gf1.data(), w1, gin + off * h);
    }
    off += R;
  }
  return gin;
}

}  // namespace tedsim::runtime
