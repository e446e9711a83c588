#include "tedsim/runtime/layers/mla_attention.hpp"

namespace tedsim::runtime {
namespace {

// This rank's widths: queries, no-position keys with values, the down projection's output.
struct MlaWidths {
  int heads, nope, rope, qk, v, q, kv, ckv, q_lora, kv_lora;
  explicit MlaWidths(const StepDims& d)
      : heads(d.local_heads), nope(d.qk_nope), rope(d.qk_rope), qk(d.qk_nope + d.qk_rope), v(d.v_head),
        q(d.local_heads * (d.qk_nope + d.qk_rope)), kv(d.local_heads * (d.qk_nope + d.v_head)),
        ckv(d.kv_lora + d.qk_rope), q_lora(d.q_lora), kv_lora(d.kv_lora) {}
};

std::size_t sz(long long a, long long b) { return static_cast<std::size_t>(a) * static_cast<std::size_t>(b); }

}  // namespace

void MlaAttention::register_params(ParamRegistrar& reg, const StepContext& c, const std::string& prefix, int tensor_id,
                                   float stdv, float out_std, float norm_noise) {
  const StepDims& d = c.dims;
  const MlaWidths w(d);
  const int h = d.hidden, ti = d.tensor_rank, heads = c.model.heads;
  const int q_all = heads * w.qk, kv_all = heads * (w.nope + w.v), v_all = heads * w.v;
  // The replicated parts: every tensor rank holds them whole, each computes its heads' share of
  // their gradients.
  reg.set_tp_partial_grads(true);
  if (w.q_lora > 0) {
    q_down_ = reg.add(prefix + "attn.q_down", "attn_qkv", tensor_id, false, true,
                      ParamRegistrar::slice(1, h, w.q_lora, 0, 1, 0, h, {{0, w.q_lora}}), 0, stdv);
    q_norm_.register_params(reg, c.model, prefix + "attn.q_norm", "ln", tensor_id + 1, w.q_lora, norm_noise);
  }
  kv_down_ = reg.add(prefix + "attn.kv_down", "attn_qkv", tensor_id + 4, false, true,
                     ParamRegistrar::slice(1, h, w.ckv, 0, 1, 0, h, {{0, w.ckv}}), 0, stdv);
  kv_norm_.register_params(reg, c.model, prefix + "attn.kv_norm", "ln", tensor_id + 5, w.kv_lora, norm_noise);
  reg.set_tp_partial_grads(false);
  // Column-parallel over heads: this rank's heads' columns.
  if (w.q_lora > 0)
    q_up_ = reg.add(prefix + "attn.q_up", "attn_qkv", tensor_id + 3, false, false,
                    ParamRegistrar::slice(1, w.q_lora, q_all, 0, 1, 0, w.q_lora, {{ti * w.q, (ti + 1) * w.q}}), 0, stdv);
  else
    q_proj_ = reg.add(prefix + "attn.q_proj", "attn_qkv", tensor_id + 3, false, false,
                      ParamRegistrar::slice(1, h, q_all, 0, 1, 0, h, {{ti * w.q, (ti + 1) * w.q}}), 0, stdv);
  kv_up_ = reg.add(prefix + "attn.kv_up", "attn_qkv", tensor_id + 7, false, false,
                   ParamRegistrar::slice(1, w.kv_lora, kv_all, 0, 1, 0, w.kv_lora, {{ti * w.kv, (ti + 1) * w.kv}}), 0,
                   stdv);
  // Row-parallel: this rank's heads' value rows.
  out_ = reg.add(prefix + "attn.out", "attn_out", tensor_id + 8, false, false,
                 ParamRegistrar::slice(1, v_all, h, 0, 1, ti * w.heads * w.v, (ti + 1) * w.heads * w.v, {{0, h}}), 0,
                 out_std);
}

void MlaAttention::split_heads(StepContext& c, MlaActs& A) {
  const StepDims& d = c.dims;
  const MlaWidths w(d);
  const int s = d.seq;
  const std::size_t rows = sz(d.micro_batch * w.heads, s);
  float *qh = ensure(A.qh, rows * w.qk), *kh = ensure(A.kh, rows * w.qk), *vh = ensure(A.vh, rows * w.v);
  for (int b = 0; b < d.micro_batch; ++b)
    for (int hd = 0; hd < w.heads; ++hd) {
      const std::size_t tok = sz(b, s), head = sz(b * w.heads + hd, s);
      c.ops.copy_rows(qh + head * w.qk, w.qk, A.q.data() + tok * w.q + sz(hd, w.qk), w.q, w.qk, s);
      const float* kv = A.kv.data() + tok * w.kv + sz(hd, w.nope + w.v);
      c.ops.copy_rows(kh + head * w.qk, w.qk, kv, w.kv, w.nope, s);
      c.ops.copy_rows(kh + head * w.qk + w.nope, w.qk, A.ckv.data() + tok * w.ckv + w.kv_lora, w.ckv, w.rope, s);
      c.ops.copy_rows(vh + head * w.v, w.v, kv + w.nope, w.kv, w.v, s);
    }
}

void MlaAttention::forward(StepContext& c, const float* xn, MlaActs& A, float* y) {
  const StepDims& d = c.dims;
  const MlaWidths w(d);
  const int T = d.tokens, h = d.hidden, s = d.seq, bh = d.micro_batch * w.heads;
  const float* xin = c.sp_gather(xn, c.ws.sp_in, "sp_allgather_attn");
  float* q = ensure(A.q, sz(T, w.q));
  if (w.q_lora > 0) {
    c.mm(T, w.q_lora, h, xin, c.P(q_down_), ensure(A.cq, sz(T, w.q_lora)));
    q_norm_.forward(c, T, w.q_lora, A.cq.data(), ensure(A.cqn, sz(T, w.q_lora)), A.q_norm);
    c.mm(T, w.q, w.q_lora, A.cqn.data(), c.P(q_up_), q);
  } else {
    c.mm(T, w.q, h, xin, c.P(q_proj_), q);
  }
  float* ckv = ensure(A.ckv, sz(T, w.ckv));
  c.mm(T, w.ckv, h, xin, c.P(kv_down_), ckv);
  // The kv latent out of its [latent | rope key] rows for the norm and the up projection.
  c.ops.copy_rows(ensure(A.c, sz(T, w.kv_lora)), w.kv_lora, ckv, w.ckv, w.kv_lora, T);
  kv_norm_.forward(c, T, w.kv_lora, A.c.data(), ensure(A.cn, sz(T, w.kv_lora)), A.kv_norm);
  c.mm(T, w.kv, w.kv_lora, A.cn.data(), c.P(kv_up_), ensure(A.kv, sz(T, w.kv)));
  c.rotary(q + w.nope, w.heads, w.qk, w.q, false);        // each query head's rope part
  c.rotary(ckv + w.kv_lora, 1, w.rope, w.ckv, false);     // the shared rope key
  split_heads(c, A);
  c.ops.attention_forward(bh, s, w.qk, w.v, A.qh.data(), A.kh.data(), A.vh.data(), ensure(A.probs, sz(bh, sz(s, s))),
                          ensure(A.ctx_heads, sz(bh, sz(s, w.v))));
  const HeadShape values{d.micro_batch, s, w.heads, w.heads, w.v};
  c.ops.heads_to_tokens(values, A.ctx_heads.data(), ensure(A.ctx, sz(T, w.heads * w.v)));
  if (c.cfg.recomputes(kRecomputeCoreAttn)) release(A.probs);
  float* proj = c.block_output(y);
  c.mm(T, h, w.heads * w.v, A.ctx.data(), c.P(out_), proj);
  c.block_exit(proj, y, "tp_allreduce_attn", "sp_reducescatter_attn");
}

void MlaAttention::merge_head_grads(StepContext& c, const float* gqh, const float* gkh, const float* gvh, float* gq,
                                    float* gkv, float* gkpe, float* scratch) {
  const StepDims& d = c.dims;
  const MlaWidths w(d);
  const int s = d.seq, T = d.tokens;
  for (int hd = 0; hd < w.heads; ++hd) {
    // Every head's gradient of the shared rope key adds up: the first head's lands in place, the
    // others' in `scratch` first.
    float* kpe = hd == 0 ? gkpe : scratch;
    for (int b = 0; b < d.micro_batch; ++b) {
      const std::size_t tok = sz(b, s), head = sz(b * w.heads + hd, s);
      c.ops.copy_rows(gq + tok * w.q + sz(hd, w.qk), w.q, gqh + head * w.qk, w.qk, w.qk, s);
      float* kv = gkv + tok * w.kv + sz(hd, w.nope + w.v);
      c.ops.copy_rows(kv, w.kv, gkh + head * w.qk, w.qk, w.nope, s);
      c.ops.copy_rows(kv + w.nope, w.kv, gvh + head * w.v, w.v, w.v, s);
      c.ops.copy_rows(kpe + tok * w.rope, w.rope, gkh + head * w.qk + w.nope, w.qk, w.rope, s);
    }
    if (hd > 0) c.add_into(sz(T, w.rope), scratch, gkpe);
  }
}

float* MlaAttention::backward(StepContext& c, const float* xn, MlaActs& A, const float* g) {
  const StepDims& d = c.dims;
  const MlaWidths w(d);
  Workspace& ws = c.ws;
  const int T = d.tokens, h = d.hidden, s = d.seq, bh = d.micro_batch * w.heads;
  const std::size_t rows = sz(bh, s);
  const float* gy = c.sp_gather(g, ws.sp_grad, "sp_allgather_attn_bwd");
  float* gctx = ensure(ws.hidden_grad, sz(T, w.heads * w.v));
  c.mm_bt(T, w.heads * w.v, h, gy, c.P(out_), gctx);
  c.mm_at_acc(w.heads * w.v, h, T, A.ctx.data(), gy, c.G(out_));
  // Head-major gradients: the context's, then q's, k's and v's.
  float* gctxh = ensure(ws.wide1, rows * (2 * w.v + 2 * w.qk));
  float *gqh = gctxh + rows * w.v, *gkh = gqh + rows * w.qk, *gvh = gkh + rows * w.qk;
  const HeadShape values{d.micro_batch, s, w.heads, w.heads, w.v};
  c.ops.tokens_to_heads(values, gctx, gctxh);
  const bool recompute = c.cfg.recomputes(kRecomputeCoreAttn);
  if (recompute)
    c.ops.attention_forward(bh, s, w.qk, w.v, A.qh.data(), A.kh.data(), A.vh.data(), ensure(A.probs, sz(bh, sz(s, s))),
                            A.ctx_heads.data());
  c.ops.attention_backward(bh, s, w.qk, w.v, A.qh.data(), A.kh.data(), A.vh.data(), A.probs.data(), gctxh, gqh, gkh,
                           gvh);
  if (recompute) release(A.probs);
  // Token-row gradients, side by side: q, kv, the rope key, a scratch, [latent | rope key], the
  // latents' norm outputs and inputs.
  const int ql = std::max(w.q_lora, 1);
  float* gq = ensure(ws.wide2, sz(T, w.q + w.kv + 2 * w.rope + w.ckv + 2 * w.kv_lora + 2 * ql));
  float *gkv = gq + sz(T, w.q), *gkpe = gkv + sz(T, w.kv), *scratch = gkpe + sz(T, w.rope);
  float *gckv = scratch + sz(T, w.rope), *gcn = gckv + sz(T, w.ckv), *gc = gcn + sz(T, w.kv_lora);
  float *gcqn = gc + sz(T, w.kv_lora), *gcq = gcqn + sz(T, ql);
  merge_head_grads(c, gqh, gkh, gvh, gq, gkv, gkpe, scratch);
  c.rotary(gq + w.nope, w.heads, w.qk, w.q, true);
  c.rotary(gkpe, 1, w.rope, w.rope, true);
  // Keys and values: the up projection, the latent's norm, then [latent | rope key] rows.
  c.mm_bt(T, w.kv_lora, w.kv, gkv, c.P(kv_up_), gcn);
  c.mm_at_acc(w.kv_lora, w.kv, T, A.cn.data(), gkv, c.G(kv_up_));
  kv_norm_.backward(c, T, w.kv_lora, A.c.data(), A.kv_norm, gcn, gc);
  c.ops.copy_rows(gckv, w.ckv, gc, w.kv_lora, w.kv_lora, T);
  c.ops.copy_rows(gckv + w.kv_lora, w.ckv, gkpe, w.rope, w.rope, T);
  // The input: this rank's heads' share through both down projections (or the query projection),
  // summed over the tensor group by the block's exit.
  const float* xin = c.sp_gather(xn, ws.sp_in, "sp_regather_for_wgrad");
  float* gxn = ensure(ws.hidden_grad, sz(d.local_tokens, h));
  float* gxp = c.block_output(gxn);
  c.mm_bt(T, h, w.ckv, gckv, c.P(kv_down_), gxp);
  c.mm_at_acc(h, w.ckv, T, xin, gckv, c.G(kv_down_));
  if (w.q_lora > 0) {
    c.mm_bt(T, w.q_lora, w.q, gq, c.P(q_up_), gcqn);
    c.mm_at_acc(w.q_lora, w.q, T, A.cqn.data(), gq, c.G(q_up_));
    q_norm_.backward(c, T, w.q_lora, A.cq.data(), A.q_norm, gcqn, gcq);
    c.mm_bt(T, h, w.q_lora, gcq, c.P(q_down_), gxp, 1.0f);
    c.mm_at_acc(h, w.q_lora, T, xin, gcq, c.G(q_down_));
  } else {
    c.mm_bt(T, h, w.q, gq, c.P(q_proj_), gxp, 1.0f);
    c.mm_at_acc(h, w.q, T, xin, gq, c.G(q_proj_));
  }
  c.block_exit(gxp, gxn, "tp_allreduce_attn", "sp_reducescatter_attn_bwd");
  return gxn;
}

}  // namespace tedsim::runtime
