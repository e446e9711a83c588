// The layers of the TED step, forward and backward: attention and dense MLP with Megatron tensor
// parallelism; MoE layers with gating, dispatch, DTD, all-to-alls, experts and combine (dropless
// layers: trainer_dropless.cpp). With sequence parallelism the residual stream, the norms and the
// router hold this rank's Tl token rows, and the blocks gather and scatter around their GEMMs
// (trainer_sequence_parallel.cpp).
#include "tedsim/runtime/trainer_impl.hpp"

namespace tedsim::runtime {

void Trainer::Impl::slice_cap(const float* src, float* dst) {
  const std::size_t blk = static_cast<std::size_t>(Cp) * h;
  ops.copy_rows(dst, blk, src + static_cast<std::size_t>(ti) * blk, static_cast<std::size_t>(C) * h, blk, E);
}

void Trainer::Impl::unslice_cap(const float* src, float* dst) {
  const std::size_t blk = static_cast<std::size_t>(Cp) * h;
  for (int r = 0; r < t; ++r)
    ops.copy_rows(dst + r * blk, static_cast<std::size_t>(C) * h, src + static_cast<std::size_t>(r) * E * blk, blk,
                  blk, E);
}

// With one source the layouts coincide: a plain copy (the experts keep their input for backward).
void Trainer::Impl::to_expert_major(const float* src, float* dst, int S) {
  const std::size_t blk = static_cast<std::size_t>(Cp) * h;
  if (S == 1) return ops.copy(dst, src, El * blk);
  for (int sr = 0; sr < S; ++sr)
    ops.copy_rows(dst + sr * blk, S * blk, src + static_cast<std::size_t>(sr) * El * blk, blk, blk, El);
}

void Trainer::Impl::from_expert_major(const float* src, float* dst, int S) {
  const std::size_t blk = static_cast<std::size_t>(Cp) * h;
  if (S == 1) return ops.copy(dst, src, El * blk);
  for (int sr = 0; sr < S; ++sr)
    ops.copy_rows(dst + static_cast<std::size_t>(sr) * El * blk, blk, src + sr * blk, S * blk, blk, El);
}

void Trainer::Impl::activation_forward(int rows, int width, const float* x, float* y) {
  if (swiglu)
    ops.swiglu_forward(rows, width, x, y);
  else
    ops.gelu_forward(static_cast<std::size_t>(rows) * width, x, y);
}

void Trainer::Impl::activation_backward(int rows, int width, const float* x, const float* gy, float* gx) {
  if (swiglu)
    ops.swiglu_backward(rows, width, x, gy, gx);
  else
    ops.gelu_backward(static_cast<std::size_t>(rows) * width, x, gy, gx);
}

namespace {
const MlpNames kDenseMlpNames{"sp_allgather_mlp", "tp_allreduce_mlp", "sp_reducescatter_mlp", "sp_allgather_mlp_bwd",
                              "sp_reducescatter_mlp_bwd"};
const MlpNames kSharedNames{"sp_allgather_shared", "tp_allreduce_shared", "sp_reducescatter_shared",
                            "sp_allgather_shared_bwd", "sp_reducescatter_shared_bwd"};
}  // namespace

void Trainer::Impl::layer_forward(int l, const float* x, LayerActs& A, float* out) {
  const LayerIds& li = ids[l];
  const std::size_t Thl = static_cast<std::size_t>(Tl) * h;
  // Attention.
  norm_forward(x, li.ln1_g, li.ln1_b, ensure(A.xn1, Thl), A.mean1, A.rstd1);
  const float* xin = sp_gather(A.xn1.data(), sp_in, "sp_allgather_attn");
  Tensor& qkv = A.ctx;  // reused: qkv is dead once split into heads
  mm(T, qkv_l, h, xin, P(li.qkv), ensure(qkv, static_cast<std::size_t>(T) * qkv_l));
  const std::size_t hs = static_cast<std::size_t>(b) * a_l * s * hd;
  ops.split_heads(head_shape(), qkv.data(), ensure(A.q, hs), ensure(A.kx, hs), ensure(A.vx, hs));
  ops.attention_forward(b * a_l, s, hd, A.q.data(), A.kx.data(), A.vx.data(),
                             ensure(A.probs, static_cast<std::size_t>(b) * a_l * s * s), ensure(A.ctxh, hs));
  ops.heads_to_tokens(head_shape(), A.ctxh.data(), ensure(A.ctx, static_cast<std::size_t>(T) * q_l));
  // Selective recompute of the attention core keeps q, k, v and recomputes the softmax in backward.
  if (cfg.recomputes(kRecomputeCoreAttn)) release(A.probs);
  float* x1 = ensure(A.x1, Thl);
  float* proj = block_output(x1);
  mm(T, h, q_l, A.ctx.data(), P(li.out), proj);
  block_exit(proj, x1, "tp_allreduce_attn", "sp_reducescatter_attn");
  add_into(Thl, x, x1);
  // MLP or MoE.
  norm_forward(x1, li.ln2_g, li.ln2_b, ensure(A.xn2, Thl), A.mean2, A.rstd2);
  if (!li.moe) {
    mlp_forward(A.xn2.data(), F_l, F1_l, li.fc1, li.fc2, A.f1, A.a1, out, kDenseMlpNames);
  } else {
    moe_forward(li, A, out);
  }
  add_into(Thl, x1, out);
}

void Trainer::Impl::route(const LayerIds& li, LayerActs& A) {
  mm(Tr, E, h, A.xn2.data(), P(li.gate), ensure(A.logits, static_cast<std::size_t>(Tr) * E));
  if (!A.gate) A.gate = ops.make_routing();
  if (generic_router) {
    ops.route_forward(A.logits.data(), Tr, E, router_cfg, *A.gate);
  } else {
    kernels::GatingConfig gc;
    gc.k = k;
    gc.capacity_factor = model.moe.capacity_factor;
    gc.min_capacity = C;  // the rounded capacity (>= the formula's)
    ops.gating_forward(A.logits.data(), Tr, E, gc, *A.gate);
  }
  if (sp) group_aux(*A.gate);
  aux_sum += ops.aux_loss(*A.gate);
  if (opt.track_routing) {  // a device-to-host copy on GPUs: off in measured runs
    ops.routing_choices(*A.gate, host_expert, host_position);
    for (int i = 0; i < Tr * k; ++i)
      routing_sig = mix64(routing_sig ^ static_cast<std::uint64_t>(host_expert[i] * 131 + host_position[i] + 7));
  }
}

// A tensor-parallel MLP on the layer's normed input `in` (this rank's rows under SP): column-
// parallel fc1 (width_l per rank, fc1_l with SwiGLU's two halves), the activation, row-parallel
// fc2 and the block's exit into `out`. The dense MLP and the shared experts are both one.
void Trainer::Impl::mlp_forward(const float* in, int width_l, int fc1_l, int fc1, int fc2, Tensor& f1, Tensor& a1,
                                float* out, const MlpNames& names) {
  const float* x = sp_gather(in, sp_in, names.gather);
  mm(T, fc1_l, h, x, P(fc1), ensure(f1, static_cast<std::size_t>(T) * fc1_l));
  activation_forward(T, width_l, f1.data(), ensure(a1, static_cast<std::size_t>(T) * width_l));
  float* y = block_output(out);
  mm(T, h, width_l, a1.data(), P(fc2), y);
  block_exit(y, out, names.allreduce, names.scatter);
}

// Its backward: weight gradients accumulated, the input gradient written to gx (the block's entry
// mirrored: all-reduced, or reduce-scattered into this rank's rows). Under SP the gradient is
// gathered first, and the input again for the fc1 weight gradient (Megatron-Core keeps only the
// rank's rows between forward and backward).
void Trainer::Impl::mlp_backward(const float* in, int width_l, int fc1_l, int fc1, int fc2, const Tensor& f1,
                                 const Tensor& a1, const float* g, float* gx, Tensor& ga_scratch, Tensor& gf_scratch,
                                 const MlpNames& names) {
  const float* gy = sp_gather(g, sp_grad, names.gather_bwd);
  float* ga1 = ensure(ga_scratch, static_cast<std::size_t>(T) * width_l);
  mm_bt(T, width_l, h, gy, P(fc2), ga1);
  mm_at_acc(width_l, h, T, a1.data(), gy, G(fc2));
  float* gf1 = ensure(gf_scratch, static_cast<std::size_t>(T) * fc1_l);
  activation_backward(T, width_l, f1.data(), ga1, gf1);
  float* gxp = block_output(gx);
  mm_bt(T, h, fc1_l, gf1, P(fc1), gxp);
  const float* x = sp_gather(in, sp_in, "sp_regather_for_wgrad");
  mm_at_acc(h, fc1_l, T, x, gf1, G(fc1));
  block_exit(gxp, gx, names.allreduce, names.scatter_bwd);
}

void Trainer::Impl::shared_forward(const LayerIds& li, LayerActs& A) {
  mlp_forward(A.xn2.data(), Fs_l, F1s_l, li.sfc1, li.sfc2, A.sf1, A.sa1,
              ensure(shared_out, static_cast<std::size_t>(Tl) * h), kSharedNames);
}

void Trainer::Impl::shared_backward(const LayerIds& li, LayerActs& A, const float* g, float* gxn) {
  float* gx = ensure(sh_gx, static_cast<std::size_t>(Tl) * h);
  mlp_backward(A.xn2.data(), Fs_l, F1s_l, li.sfc1, li.sfc2, A.sf1, A.sa1, g, gx, sh_ga, sh_gf, kSharedNames);
  add_into(static_cast<std::size_t>(Tl) * h, gx, gxn);
}

void Trainer::Impl::moe_forward(const LayerIds& li, LayerActs& A, float* out) {
  route(li, A);
  if (Fs > 0) shared_forward(li, A);
  if (dropless) {
    dropless_experts_forward(li, A, out);
  } else {
    capacity_experts_forward(li, A, out);
  }
  if (Fs > 0) add_into(static_cast<std::size_t>(Tl) * h, shared_out.data(), out);
}

void Trainer::Impl::capacity_experts_forward(const LayerIds& li, LayerActs& A, float* out) {
  const std::size_t ECh = static_cast<std::size_t>(E) * C * h;
  const std::size_t ECph = static_cast<std::size_t>(E) * Cp * h;
  const Routing& gate = *A.gate;
  float* dbuf = ensure(A.cbuf, ECh);  // cbuf reused as the dispatch buffer until the combine input is built
  ops.dispatch(gate, A.xn2.data(), h, dbuf);
  const float* a2a_in = dbuf;
  if (split) {
    slice_cap(dbuf, ensure(send, ECph));
    a2a_in = send.data();
  }
  collective(Coll::all_to_all, *ep, a2a_in, ensure(recv, ECph), ECph, kEpAllToAll, "ep_alltoall_dispatch");
  const float* src = recv.data();
  int S = e;
  if (etp_split || sp_expert_gather) {  // the experts' width is split over t: they see every tensor rank's tokens
    collective(Coll::all_gather, *tp, recv.data(), ensure(gath, ECph * t), ECph * t, kTpAllGather,
               sp ? "sp_allgather_expert" : "dtd_allgather_dispatch");
    src = gath.data();
    S = t * e;
  }
  const int R = S * Cp;  // rows per local expert
  const std::size_t rows_h = static_cast<std::size_t>(El) * R * h;
  to_expert_major(src, ensure(A.ein, rows_h), S);
  ensure(A.ef1, static_cast<std::size_t>(El) * R * F1e);
  ensure(A.ea1, static_cast<std::size_t>(El) * R * Fe);
  float* eout = ensure(gmoe, rows_h);
  for (int x = 0; x < El; ++x) {
    float* f1 = A.ef1.data() + static_cast<std::size_t>(x) * R * F1e;
    float* a1 = A.ea1.data() + static_cast<std::size_t>(x) * R * Fe;
    mm(R, F1e, h, A.ein.data() + static_cast<std::size_t>(x) * R * h, P(li.efc1) + static_cast<std::size_t>(x) * h * F1e, f1);
    activation_forward(R, Fe, f1, a1);
    mm(R, h, Fe, a1, P(li.efc2) + static_cast<std::size_t>(x) * Fe * h, eout + static_cast<std::size_t>(x) * R * h);
  }
  if (cfg.expert_tp && t > 1 && !sp) tp_allreduce(eout, rows_h, "tp_allreduce_expert");
  float* back = ensure(gath, rows_h);
  from_expert_major(eout, back, S);
  const float* a2a_back = etp_split ? back + static_cast<std::size_t>(ti) * ECph : back;  // DTD drop
  if (sp_expert_gather) {  // each tensor rank's rows of the partial outputs, summed
    collective(Coll::reduce_scatter, *tp, back, ensure(send, ECph), ECph, kTpAllReduce, "sp_reducescatter_expert");
    a2a_back = send.data();
  }
  collective(Coll::all_to_all, *ep, a2a_back, ensure(recv, ECph), ECph, kEpAllToAll, "ep_alltoall_combine");
  float* cb = ensure(A.cbuf, ECh);
  if (split) {
    collective(Coll::all_gather, *tp, recv.data(), ensure(send, ECph * t), ECph * t, kTpAllGather, "dtd_allgather_combine");
    unslice_cap(send.data(), cb);
  } else {
    ops.copy(cb, recv.data(), ECh);
  }
  ops.combine(gate, cb, h, out);
}

void Trainer::Impl::layer_backward(int l, const float* x, LayerActs& A, float* g) {
  const LayerIds& li = ids[l];
  const std::size_t Thl = static_cast<std::size_t>(Tl) * h;
  float* gxn = ensure(gtmp, Thl);
  if (!li.moe) {
    mlp_backward(A.xn2.data(), F_l, F1_l, li.fc1, li.fc2, A.f1, A.a1, g, gxn, gw, gmoe, kDenseMlpNames);
  } else {
    moe_backward(li, A, g, gxn);
  }
  // LN2: g_x1 = g + LN2^T(gxn).
  float* gln = ensure(gtmp2, Thl);
  ln_backward(A.x1.data(), li.ln2_g, li.ln2_b, A.mean2.data(), A.rstd2.data(), gxn, gln);
  add_into(Thl, gln, g);  // g is now grad x1
  // Attention.
  const float* gy = sp_gather(g, sp_grad, "sp_allgather_attn_bwd");
  float* gctx = ensure(gtmp, static_cast<std::size_t>(T) * q_l);
  mm_bt(T, q_l, h, gy, P(li.out), gctx);
  mm_at_acc(q_l, h, T, A.ctx.data(), gy, G(li.out));
  const std::size_t hs = static_cast<std::size_t>(b) * a_l * s * hd;
  float* gctxh = ensure(gmoe, 4 * hs);
  ops.tokens_to_heads(head_shape(), gctx, gctxh);
  float *gq = gctxh + hs, *gk = gctxh + 2 * hs, *gv = gctxh + 3 * hs;
  if (cfg.recomputes(kRecomputeCoreAttn))
    ops.attention_forward(b * a_l, s, hd, A.q.data(), A.kx.data(), A.vx.data(),
                          ensure(A.probs, static_cast<std::size_t>(b) * a_l * s * s), A.ctxh.data());
  ops.attention_backward(b * a_l, s, hd, A.q.data(), A.kx.data(), A.vx.data(), A.probs.data(), gctxh, gq, gk, gv);
  if (cfg.recomputes(kRecomputeCoreAttn)) release(A.probs);
  float* gqkv = ensure(gw, static_cast<std::size_t>(T) * qkv_l);
  ops.merge_heads_grad(head_shape(), gq, gk, gv, gqkv);
  float* gxn1 = ensure(gtmp, Thl);
  float* gxp = block_output(gxn1);
  mm_bt(T, h, qkv_l, gqkv, P(li.qkv), gxp);
  mm_at_acc(h, qkv_l, T, sp_gather(A.xn1.data(), sp_in, "sp_regather_for_wgrad"), gqkv, G(li.qkv));
  block_exit(gxp, gxn1, "tp_allreduce_attn", "sp_reducescatter_attn_bwd");
  ln_backward(x, li.ln1_g, li.ln1_b, A.mean1.data(), A.rstd1.data(), gxn1, gln);
  add_into(Thl, gln, g);
}

void Trainer::Impl::norm_forward(const float* x, int gid, int bid, float* y, Tensor& mean, Tensor& rstd) {
  if (bid < 0) {
    ops.rmsnorm_forward(Tl, h, kLnEps, x, P(gid), y, ensure(rstd, Tl));
  } else {
    ops.layernorm_forward(Tl, h, kLnEps, x, P(gid), P(bid), y, ensure(mean, Tl), ensure(rstd, Tl));
  }
}

void Trainer::Impl::ln_backward(const float* x, int gid, int bid, const float* mean, const float* rstd, const float* gy, float* gx) {
  if (bid < 0) {
    ops.rmsnorm_backward(Tl, h, x, P(gid), rstd, gy, gx, ensure(lnd_g, h));
    add_into(h, lnd_g.data(), G(gid));
    return;
  }
  ops.layernorm_backward(Tl, h, x, P(gid), mean, rstd, gy, gx, ensure(lnd_g, h), ensure(lnd_b, h));
  add_into(h, lnd_g.data(), G(gid));
  add_into(h, lnd_b.data(), G(bid));
}

void Trainer::Impl::moe_backward(const LayerIds& li, LayerActs& A, const float* g, float* gxn) {
  if (dropless)
    dropless_experts_backward(li, A, g, gxn);
  else
    capacity_experts_backward(li, A, g, gxn);
  // Gate: the weights' gradient into the logits, then into the gate and the layer input.
  float* glog = ensure(gath, static_cast<std::size_t>(Tr) * E);
  ops.gating_backward(*A.gate, gweight.data(), opt.aux_loss_coef / static_cast<float>(nmb_global), glog);
  mm_at_acc(h, E, Tr, A.xn2.data(), glog, G(li.gate));
  mm_bt(Tr, h, E, glog, P(li.gate), gxn, 1.0f);
  if (Fs > 0) shared_backward(li, A, g, gxn);
}

void Trainer::Impl::capacity_experts_backward(const LayerIds& li, LayerActs& A, const float* g, float* gxn) {
  const std::size_t ECh = static_cast<std::size_t>(E) * C * h;
  const std::size_t ECph = static_cast<std::size_t>(E) * Cp * h;
  const Routing& gate = *A.gate;
  float* gwt = ensure(gweight, static_cast<std::size_t>(Tr) * k);
  float* gcb = ensure(send, std::max(ECh, ECph * t));
  ops.combine_backward(gate, A.cbuf.data(), g, h, gcb, gwt);
  const float* a2a_in = gcb;
  if (split) {  // backward of the final all-gather: this rank's slice
    slice_cap(gcb, ensure(gath, ECph));
    a2a_in = gath.data();
  }
  collective(Coll::all_to_all, *ep, a2a_in, ensure(recv, ECph), ECph, kEpAllToAll, "ep_alltoall_combine");
  const float* src = recv.data();
  int S = e;
  if (etp_split || sp_expert_gather) {  // backward of the DTD drop or of SP's reduce-scatter: all-gather
    collective(Coll::all_gather, *tp, recv.data(), ensure(gath, ECph * t), ECph * t, kTpAllGather,
               sp ? "sp_allgather_expert_bwd" : "dtd_allgather_combine");
    src = gath.data();
    S = t * e;
  }
  const int R = S * Cp;
  const std::size_t rows_h = static_cast<std::size_t>(El) * R * h;
  float* geout = ensure(gmoe, rows_h);
  to_expert_major(src, geout, S);
  Tensor& ga1 = scratch_out;
  ensure(ga1, static_cast<std::size_t>(R) * Fe);
  Tensor gf1;
  ensure(gf1, static_cast<std::size_t>(R) * F1e);
  float* gein = ensure(gw, rows_h);
  for (int x = 0; x < El; ++x) {
    const float* go = geout + static_cast<std::size_t>(x) * R * h;
    const float* w1 = P(li.efc1) + static_cast<std::size_t>(x) * h * F1e;
    const float* w2 = P(li.efc2) + static_cast<std::size_t>(x) * Fe * h;
    const float* f1 = A.ef1.data() + static_cast<std::size_t>(x) * R * F1e;
    const float* a1 = A.ea1.data() + static_cast<std::size_t>(x) * R * Fe;
    mm_bt(R, Fe, h, go, w2, ga1.data());
    mm_at_acc(Fe, h, R, a1, go, G(li.efc2) + static_cast<std::size_t>(x) * Fe * h);
    activation_backward(R, Fe, f1, ga1.data(), gf1.data());
    mm_at_acc(h, F1e, R, A.ein.data() + static_cast<std::size_t>(x) * R * h, gf1.data(),
              G(li.efc1) + static_cast<std::size_t>(x) * h * F1e);
    mm_bt(R, h, F1e, gf1.data(), w1, gein + static_cast<std::size_t>(x) * R * h);
  }
  if (cfg.expert_tp && t > 1 && !sp) tp_allreduce(gein, rows_h, "tp_allreduce_expert");
  float* back = ensure(gmoe, rows_h);
  from_expert_major(gein, back, S);
  const float* a2a_back = etp_split ? back + static_cast<std::size_t>(ti) * ECph : back;  // backward of all-gather
  if (sp_expert_gather) {  // backward of SP's all-gather: each tensor rank's rows, summed
    collective(Coll::reduce_scatter, *tp, back, ensure(send, ECph), ECph, kTpAllReduce, "sp_reducescatter_expert_bwd");
    a2a_back = send.data();
  }
  collective(Coll::all_to_all, *ep, a2a_back, ensure(recv, ECph), ECph, kEpAllToAll, "ep_alltoall_dispatch");
  float* gdb = ensure(gw, ECh);
  if (split) {  // backward of the DTD slice: all-gather
    collective(Coll::all_gather, *tp, recv.data(), ensure(send, ECph * t), ECph * t, kTpAllGather, "dtd_allgather_dispatch");
    unslice_cap(send.data(), gdb);
  } else {
    ops.copy(gdb, recv.data(), ECh);
  }
  ops.dispatch_backward(gate, gdb, h, gxn);
}

}  // namespace tedsim::runtime
