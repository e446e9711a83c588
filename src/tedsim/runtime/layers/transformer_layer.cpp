#include "tedsim/runtime/layers/transformer_layer.hpp"

#include <utility>

namespace tedsim::runtime {

TransformerLayer::TransformerLayer(const StepContext& c, int index, int shape_of, std::string name)
    : index_(index), name_(std::move(name)) {
  if (c.model.is_moe_layer(shape_of)) moe_ = std::make_unique<MoeLayer>(c);
}

void TransformerLayer::register_params(ParamRegistrar& reg, const StepContext& c, int expert_rank,
                                       const InitScales& init) {
  reg.set_unit(index_ + 1);
  const int base = 100 * (index_ + 1);
  const std::string p = name_ + ".";
  const int h = c.dims.hidden;
  norm1_.register_params(reg, c.model, p + "ln1", "ln", base + 0, h, init.norm_noise);
  if (c.dims.mla)
    mla_.register_params(reg, c, p, base + 50, init.stdv, init.out_std, init.norm_noise);
  else
    attention_.register_params(reg, c, p, base + 2, init.stdv, init.out_std, init.norm_noise);
  norm2_.register_params(reg, c.model, p + "ln2", "ln", base + 4, h, init.norm_noise);
  if (moe_)
    moe_->register_params(reg, c, expert_rank, p, base + 8, init.stdv, init.out_std, init.gate_std);
  else
    mlp_.register_params(reg, c, TensorParallelMlp::Kind::dense, p, base + 6, init.stdv, init.out_std);
}

void TransformerLayer::forward(StepContext& c, const float* x, LayerActs& A, float* out) {
  const std::size_t Thl = static_cast<std::size_t>(c.dims.local_tokens) * c.dims.hidden;
  norm1_.forward(c, x, ensure(A.xn1, Thl), A.norm1);
  float* x1 = ensure(A.x1, Thl);
  if (c.dims.mla)
    mla_.forward(c, A.xn1.data(), A.mla, x1);
  else
    attention_.forward(c, A.xn1.data(), A.attention, x1);
  c.add_into(Thl, x, x1);
  norm2_.forward(c, x1, ensure(A.xn2, Thl), A.norm2);
  if (moe_)
    moe_->forward(c, A.xn2.data(), A.moe, out);
  else
    mlp_.forward(c, A.xn2.data(), A.mlp, out);
  c.add_into(Thl, x1, out);
}

void TransformerLayer::backward(StepContext& c, const float* x, LayerActs& A, float* g) {
  const std::size_t Thl = static_cast<std::size_t>(c.dims.local_tokens) * c.dims.hidden;
  Workspace& ws = c.ws;
  float* gxn = ensure(ws.hidden_grad, Thl);
  if (moe_)
    moe_->backward(c, A.xn2.data(), A.moe, g, gxn);
  else
    mlp_.backward(c, A.xn2.data(), A.mlp, g, gxn, ws.wide2, ws.wide1);
  // The second norm: d(loss)/d(x1) = g + norm2'(gxn).
  float* gln = ensure(ws.hidden_grad2, Thl);
  norm2_.backward(c, A.x1.data(), A.norm2, gxn, gln);
  c.add_into(Thl, gln, g);
  const float* gxn1 = c.dims.mla ? mla_.backward(c, A.xn1.data(), A.mla, g)
                                 : attention_.backward(c, A.xn1.data(), A.attention, g);
  norm1_.backward(c, x, A.norm1, gxn1, gln);
  c.add_into(Thl, gln, g);
}

}  // namespace tedsim::runtime
