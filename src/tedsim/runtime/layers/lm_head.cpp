#include "tedsim/runtime/layers/lm_head.hpp"

#include <algorithm>
#include <cmath>

#include "tedsim/runtime/layers/embedding.hpp"

namespace tedsim::runtime {

void LmHead::register_params(ParamRegistrar& reg, const StepContext& c, int embedding_table, float stdv,
                             float norm_noise) {
  const StepDims& d = c.dims;
  reg.set_unit(d.layers + 1);
  if (!c.model.tie_embeddings)
    weight_ = reg.add("lm_head", "lm_head", 2, false, false, vocab_rows(d), 0, stdv);
  else if (embedding_table >= 0)
    weight_ = embedding_table;
  else  // initialized alike and kept equal by the tied-embedding sync
    weight_ = add_embedding_copy(reg, c, stdv);
  final_norm_.register_params(reg, c.model, "final_ln", "final_ln", 3, d.hidden, norm_noise);
}

double LmHead::forward(StepContext& c, const float* x, const std::int32_t* targets, bool backward, Tensor& grad) {
  const StepDims& d = c.dims;
  const float* normed = norm_forward(c, x);
  float* g = backward ? ensure(grad_normed_, static_cast<std::size_t>(d.local_tokens) * d.hidden) : nullptr;
  const double loss = output_loss(c, normed, targets, 0, token_weight(d), g);
  if (backward) norm_backward(c, x, g, grad);
  return loss;
}

const float* LmHead::norm_forward(StepContext& c, const float* x) {
  const StepDims& d = c.dims;
  const double t0 = c.clock();
  final_norm_.forward(c, x, ensure(normed_, static_cast<std::size_t>(d.local_tokens) * d.hidden), norm_acts_);
  c.charge(kOther, "final_layernorm", t0, c.clock());
  return normed_.data();
}

double LmHead::output_loss(StepContext& c, const float* hidden, const std::int32_t* targets, int masked_tail,
                           float weight, float* grad_hidden) {
  const StepDims& d = c.dims;
  const int T = d.tokens, h = d.hidden, V_l = d.vocab_local, v0 = d.vocab_first;
  const auto counted = [&](int i) { return i % d.seq < d.seq - masked_tail; };
  if (masked_tail > 0) {  // any id will do where nothing counts; its gradient row is zeroed below
    counted_targets_.assign(targets, targets + T);
    for (int i = 0; i < T; ++i)
      if (!counted(i)) counted_targets_[i] = 0;
    targets = counted_targets_.data();
  }
  const CommMode saved = c.mode;
  c.mode = CommMode::live;
  const float* xin = c.sp_gather(hidden, normed_full_, "sp_allgather_lm_head");
  c.mode = saved;
  float* lg = ensure(logits_, static_cast<std::size_t>(T) * V_l);
  c.mm_bt(T, V_l, h, xin, c.P(weight_), lg);
  double t0 = c.clock();
  float* r = ensure(row_stats_, 3 * static_cast<std::size_t>(T));
  float *mx = r, *se = r + T, *tg = r + 2 * T;
  c.ops.ce_max_and_target(T, V_l, v0, lg, targets, mx, tg);
  c.charge(kOther, "cross_entropy", t0, c.clock());
  if (d.tensor_size > 1) {
    const double c0 = c.clock();
    c.tp->all_reduce(mx, mx, T, Dtype::fp32, ReduceOp::max);
    c.tp->wait();
    c.charge(kTpAllReduce, "tp_allreduce_loss_max", c0, now_s());
  }
  t0 = c.clock();
  c.ops.ce_exp_and_sum(T, V_l, mx, lg, se);  // logits become exp(l - max); the target's is in tg
  c.charge(kOther, "cross_entropy", t0, c.clock());
  if (d.tensor_size > 1) c.tp_allreduce(se, 2 * static_cast<std::size_t>(T), "tp_allreduce_loss_sum");
  t0 = c.clock();
  host_stats_.resize(3 * static_cast<std::size_t>(T));
  c.ops.to_host(r, host_stats_.data(), host_stats_.size());
  double loss = 0;
  int n = 0;
  for (int i = 0; i < T; ++i) {
    if (!counted(i)) continue;
    loss += std::log(static_cast<double>(host_stats_[T + i])) + host_stats_[i] - host_stats_[2 * T + i];
    ++n;
  }
  loss /= std::max(n, 1);
  if (!grad_hidden) {
    c.charge(kOther, "cross_entropy", t0, c.clock());
    return loss;
  }
  c.ops.ce_gradient(T, V_l, v0, targets, se, weight, lg);
  if (masked_tail > 0)  // the uncounted positions: the last masked_tail rows of each sequence
    for (int b = 0; b < d.micro_batch; ++b)
      c.ops.memory().zero(lg + (static_cast<std::size_t>(b) * d.seq + d.seq - masked_tail) * V_l,
                          static_cast<std::size_t>(masked_tail) * V_l * sizeof(float));
  c.charge(kOther, "cross_entropy_bwd", t0, c.clock());
  c.mm_at_acc(V_l, h, T, lg, xin, c.G(weight_));
  float* gxp = c.block_output(grad_hidden);
  c.mm(T, h, V_l, lg, c.P(weight_), gxp);
  c.block_exit(gxp, grad_hidden, "tp_allreduce_lm_head_bwd", "sp_reducescatter_lm_head_bwd");
  return loss;
}

void LmHead::norm_backward(StepContext& c, const float* x, const float* grad_normed, Tensor& grad) {
  const StepDims& d = c.dims;
  const double t0 = c.clock();
  final_norm_.backward(c, x, norm_acts_, grad_normed, ensure(grad, static_cast<std::size_t>(d.local_tokens) * d.hidden));
  c.charge(kOther, "final_layernorm_bwd", t0, c.clock());
}

}  // namespace tedsim::runtime
