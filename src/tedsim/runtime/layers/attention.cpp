#include "tedsim/runtime/layers/attention.hpp"

#include <algorithm>

namespace tedsim::runtime {

void SelfAttention::register_params(ParamRegistrar& reg, const StepContext& c, const std::string& prefix,
                                    int tensor_id, float stdv, float out_std, float norm_noise) {
  const StepDims& d = c.dims;
  const int h = d.hidden, ti = d.tensor_rank, q_l = d.local_q_width, kv_l = d.local_kv_width;
  const int qd = c.model.q_dim();  // heads x head_dim: h unless head_dim is given apart from hidden / heads
  const int kvd = c.model.kv_dim();
  // This rank's query columns, then its key and value columns, of the global [h, q + k + v].
  qkv_ = reg.add(prefix + "attn.qkv", "attn_qkv", tensor_id, false, false,
                 ParamRegistrar::slice(1, h, qd + 2 * kvd, 0, 1, 0, h,
                                       {{ti * q_l, (ti + 1) * q_l},
                                        {qd + ti * kv_l, qd + (ti + 1) * kv_l},
                                        {qd + kvd + ti * kv_l, qd + kvd + (ti + 1) * kv_l}}),
                 0, stdv);
  out_ = reg.add(prefix + "attn.out", "attn_out", tensor_id + 1, false, false,
                 ParamRegistrar::slice(1, qd, h, 0, 1, ti * q_l, (ti + 1) * q_l, {{0, h}}), 0, out_std);
  qk_norm_ = c.model.qk_norm == QkNorm::head;
  if (qk_norm_) {
    // Every tensor rank holds the gains whole and normalizes its own heads with them: its gradient
    // of them is its heads' share, summed over the group (ParamInfo::tp_partial_grad).
    reg.set_tp_partial_grads(true);
    q_norm_.register_params(reg, c.model, prefix + "attn.q_norm", "ln", tensor_id + 40, d.head_dim, norm_noise);
    k_norm_.register_params(reg, c.model, prefix + "attn.k_norm", "ln", tensor_id + 42, d.head_dim, norm_noise);
    reg.set_tp_partial_grads(false);
  }
}

void SelfAttention::qk_norm_forward(StepContext& c, float* qkv, AttentionActs& A) {
  const StepDims& d = c.dims;
  const int T = d.tokens, q_l = d.local_q_width, kv_l = d.local_kv_width, qkv_l = d.local_qkv_width;
  // Each part out of the qkv rows as head rows, normalized (into the core's output tensor, not
  // written yet), and back in place.
  float* out = ensure(A.ctx_heads, static_cast<std::size_t>(T) * std::max(q_l, kv_l));
  const auto one = [&](NormLayer& norm, Tensor& in, NormActs& acts, int offset, int width) {
    c.ops.copy_rows(ensure(in, static_cast<std::size_t>(T) * width), width, qkv + offset, qkv_l, width, T);
    norm.forward(c, T * (width / d.head_dim), d.head_dim, in.data(), out, acts);
    c.ops.copy_rows(qkv + offset, qkv_l, out, width, width, T);
  };
  one(q_norm_, A.q_in, A.q_norm, 0, q_l);
  one(k_norm_, A.k_in, A.k_norm, q_l, kv_l);
}

void SelfAttention::qk_norm_backward(StepContext& c, float* grad_qkv, AttentionActs& A) {
  const StepDims& d = c.dims;
  const int T = d.tokens, q_l = d.local_q_width, kv_l = d.local_kv_width, qkv_l = d.local_qkv_width;
  const std::size_t most = static_cast<std::size_t>(T) * std::max(q_l, kv_l);
  float* post = ensure(c.ws.wide1, 2 * most);  // free once the heads' gradients are merged
  float* pre = post + most;
  const auto one = [&](NormLayer& norm, const Tensor& in, const NormActs& acts, int offset, int width) {
    c.ops.copy_rows(post, width, grad_qkv + offset, qkv_l, width, T);
    norm.backward(c, T * (width / d.head_dim), d.head_dim, in.data(), acts, post, pre);
    c.ops.copy_rows(grad_qkv + offset, qkv_l, pre, width, width, T);
  };
  one(q_norm_, A.q_in, A.q_norm, 0, q_l);
  one(k_norm_, A.k_in, A.k_norm, q_l, kv_l);
}

void SelfAttention::forward(StepContext& c, const float* xn, AttentionActs& A, float* y) {
  const StepDims& d = c.dims;
  const int T = d.tokens, h = d.hidden, q_l = d.local_q_width, qkv_l = d.local_qkv_width;
  const int bh = d.micro_batch * d.local_heads;
  const float* xin = c.sp_gather(xn, c.ws.sp_in, "sp_allgather_attn");
  Tensor& qkv = A.ctx;  // reused: qkv is dead once split into heads
  c.mm(T, qkv_l, h, xin, c.P(qkv_), ensure(qkv, static_cast<std::size_t>(T) * qkv_l));
  if (qk_norm_) qk_norm_forward(c, qkv.data(), A);
  c.rotary_forward(qkv.data());
  const std::size_t hs = static_cast<std::size_t>(bh) * d.seq * d.head_dim;
  c.ops.split_heads(c.head_shape(), qkv.data(), ensure(A.q, hs), ensure(A.k, hs), ensure(A.v, hs));
  c.ops.attention_forward(bh, d.seq, d.head_dim, d.head_dim, A.q.data(), A.k.data(), A.v.data(),
                          ensure(A.probs, static_cast<std::size_t>(bh) * d.seq * d.seq), ensure(A.ctx_heads, hs));
  c.ops.heads_to_tokens(c.head_shape(), A.ctx_heads.data(), ensure(A.ctx, static_cast<std::size_t>(T) * q_l));
  if (c.cfg.recomputes(kRecomputeCoreAttn)) release(A.probs);
  float* proj = c.block_output(y);
  c.mm(T, h, q_l, A.ctx.data(), c.P(out_), proj);
  c.block_exit(proj, y, "tp_allreduce_attn", "sp_reducescatter_attn");
}

float* SelfAttention::backward(StepContext& c, const float* xn, AttentionActs& A, const float* g) {
  const StepDims& d = c.dims;
  Workspace& ws = c.ws;
  const int T = d.tokens, h = d.hidden, q_l = d.local_q_width, qkv_l = d.local_qkv_width;
  const int bh = d.micro_batch * d.local_heads;
  const float* gy = c.sp_gather(g, ws.sp_grad, "sp_allgather_attn_bwd");
  float* gctx = ensure(ws.hidden_grad, static_cast<std::size_t>(T) * q_l);
  c.mm_bt(T, q_l, h, gy, c.P(out_), gctx);
  c.mm_at_acc(q_l, h, T, A.ctx.data(), gy, c.G(out_));
  const std::size_t hs = static_cast<std::size_t>(bh) * d.seq * d.head_dim;
  float* gctxh = ensure(ws.wide1, 4 * hs);
  c.ops.tokens_to_heads(c.head_shape(), gctx, gctxh);
  float *gq = gctxh + hs, *gk = gctxh + 2 * hs, *gv = gctxh + 3 * hs;
  const bool recompute = c.cfg.recomputes(kRecomputeCoreAttn);
  if (recompute)
    c.ops.attention_forward(bh, d.seq, d.head_dim, d.head_dim, A.q.data(), A.k.data(), A.v.data(),
                            ensure(A.probs, static_cast<std::size_t>(bh) * d.seq * d.seq), A.ctx_heads.data());
  c.ops.attention_backward(bh, d.seq, d.head_dim, d.head_dim, A.q.data(), A.k.data(), A.v.data(), A.probs.data(), gctxh, gq, gk,
                           gv);
  if (recompute) release(A.probs);
  float* gqkv = ensure(ws.wide2, static_cast<std::size_t>(T) * qkv_l);
  c.ops.merge_heads_grad(c.head_shape(), gq, gk, gv, gqkv);
  c.rotary_backward(gqkv);
  if (qk_norm_) qk_norm_backward(c, gqkv, A);
  float* gxn = ensure(ws.hidden_grad, static_cast<std::size_t>(d.local_tokens) * h);
  float* gxp = c.block_output(gxn);
  c.mm_bt(T, h, qkv_l, gqkv, c.P(qkv_), gxp);
  c.mm_at_acc(h, qkv_l, T, c.sp_gather(xn, ws.sp_in, "sp_regather_for_wgrad"), gqkv, c.G(qkv_));
  c.block_exit(gxp, gxn, "tp_allreduce_attn", "sp_reducescatter_attn_bwd");
  return gxn;
}

}  // namespace tedsim::runtime
