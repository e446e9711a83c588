#include "tedsim/runtime/moe/moe_layer.hpp"

namespace tedsim::runtime {

MoeLayer::MoeLayer(const StepContext& c)
    : dispatcher_(c.dims.dropless ? make_dropless_dispatcher() : make_capacity_dispatcher()),
      has_shared_(c.dims.shared_width > 0) {}

void MoeLayer::register_params(ParamRegistrar& reg, const StepContext& c, int expert_rank, const std::string& prefix,
                               int tensor_id, float stdv, float out_std, float gate_std) {
  router_.register_params(reg, c, prefix, tensor_id, gate_std);
  experts_.register_params(reg, c, expert_rank, prefix, tensor_id + 1, stdv, out_std);
  if (has_shared_)
    shared_.register_params(reg, c, TensorParallelMlp::Kind::shared_experts, prefix, tensor_id + 3, stdv, out_std);
}

void MoeLayer::forward(StepContext& c, const float* xn, MoeActs& A, float* out) {
  const std::size_t Thl = static_cast<std::size_t>(c.dims.local_tokens) * c.dims.hidden;
  router_.forward(c, xn, A);
  if (has_shared_) shared_.forward(c, xn, A.shared, ensure(c.ws.shared_out, Thl));
  dispatcher_->dispatch(c, xn, A);
  float* expert_out = experts_.forward(c, A);
  dispatcher_->combine(c, A, expert_out, out);
  if (has_shared_) c.add_into(Thl, c.ws.shared_out.data(), out);
}

void MoeLayer::backward(StepContext& c, const float* xn, MoeActs& A, const float* g, float* gxn) {
  float* expert_out_grad = dispatcher_->combine_backward(c, A, g);
  float* expert_in_grad = experts_.backward(c, A, expert_out_grad);
  dispatcher_->dispatch_backward(c, A, expert_in_grad, gxn);
  router_.backward(c, xn, A, gxn);
  if (has_shared_) {
    const std::size_t Thl = static_cast<std::size_t>(c.dims.local_tokens) * c.dims.hidden;
    float* gx = ensure(c.ws.shared_in_grad, Thl);
    shared_.backward(c, xn, A.shared, g, gx, c.ws.shared_act_grad, c.ws.shared_fc1_grad);
    c.add_into(Thl, gx, gxn);
  }
}

}  // namespace tedsim::runtime
