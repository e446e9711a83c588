#include "tedsim/runtime/layers/norm.hpp"

namespace tedsim::runtime {

void NormLayer::register_params(ParamRegistrar& reg, const ModelSpec& model, const std::string& name,
                                const std::string& kind, int tensor_id, int hidden, float noise) {
  gamma_ = reg.add_vector(name + ".gamma", kind, tensor_id, hidden, 1, noise);
  if (model.norm == Norm::layernorm) beta_ = reg.add_vector(name + ".beta", kind, tensor_id + 1, hidden, 0, noise);
}

void NormLayer::forward(StepContext& c, const float* x, float* y, NormActs& a) {
  forward(c, c.dims.local_tokens, c.dims.hidden, x, y, a);
}

void NormLayer::backward(StepContext& c, const float* x, const NormActs& a, const float* gy, float* gx) {
  backward(c, c.dims.local_tokens, c.dims.hidden, x, a, gy, gx);
}

void NormLayer::forward(StepContext& c, int rows, int h, const float* x, float* y, NormActs& a) {
  if (beta_ < 0)
    c.ops.rmsnorm_forward(rows, h, kNormEps, x, c.P(gamma_), y, ensure(a.rstd, rows));
  else
    c.ops.layernorm_forward(rows, h, kNormEps, x, c.P(gamma_), c.P(beta_), y, ensure(a.mean, rows), ensure(a.rstd, rows));
}

void NormLayer::backward(StepContext& c, int rows, int h, const float* x, const NormActs& a, const float* gy,
                         float* gx) {
  Workspace& ws = c.ws;
  if (beta_ < 0) {
    c.ops.rmsnorm_backward(rows, h, x, c.P(gamma_), a.rstd.data(), gy, gx, ensure(ws.norm_gamma_grad, h));
    c.add_into(h, ws.norm_gamma_grad.data(), c.G(gamma_));
    return;
  }
  c.ops.layernorm_backward(rows, h, x, c.P(gamma_), a.mean.data(), a.rstd.data(), gy, gx,
                           ensure(ws.norm_gamma_grad, h), ensure(ws.norm_beta_grad, h));
  c.add_into(h, ws.norm_gamma_grad.data(), c.G(gamma_));
  c.add_into(h, ws.norm_beta_grad.data(), c.G(beta_));
}

}  // namespace tedsim::runtime
