// Embedding, LM head and vocabulary-parallel cross-entropy, forward and backward. With sequence
// parallelism the embedding's partial rows are reduce-scattered into this rank's token rows, and
// the LM head gathers the final norm's rows (the cross-entropy runs on all T tokens, as without).
#include "tedsim/runtime/trainer_impl.hpp"

namespace tedsim::runtime {

void Trainer::Impl::embed_forward() {
  gather_unit(0);
  const double t0 = clock();
  float* x = ensure(inputs[0], static_cast<std::size_t>(Tl) * h);
  float* rows = block_output(x);
  ops.embedding_forward(T, h, v0, V_l, tokens.data(), P(emb), rows);
  charge(kOther, "embedding_lookup", t0, clock());
  CommMode saved = mode;
  mode = CommMode::live;
  block_exit(rows, x, "tp_allreduce_embedding", "sp_reducescatter_embedding");
  mode = saved;
}

double Trainer::Impl::head_and_loss(bool backward) {
  const std::size_t Thl = static_cast<std::size_t>(Tl) * h;
  gather_unit(L + 1);
  double t0 = clock();
  norm_forward(inputs[L].data(), lnf_g, lnf_b, ensure(xf, Thl), lnf_mean, lnf_rstd);
  charge(kOther, "final_layernorm", t0, clock());
  const CommMode saved = mode;
  mode = CommMode::live;
  const float* xin = sp_gather(xf.data(), xf_full, "sp_allgather_lm_head");
  mode = saved;
  float* lg = ensure(logits, static_cast<std::size_t>(T) * V_l);
  mm_bt(T, V_l, h, xin, P(lm), lg);
  t0 = clock();
  float* r = ensure(red, 3 * static_cast<std::size_t>(T));
  float *mx = r, *se = r + T, *tg = r + 2 * T;
  ops.ce_max_and_target(T, V_l, v0, lg, targets.data(), mx, tg);
  charge(kOther, "cross_entropy", t0, clock());
  if (t > 1) {
    const double c0 = clock();
    tp->all_reduce(mx, mx, T, Dtype::fp32, ReduceOp::max);
    tp->wait();
    charge(kTpAllReduce, "tp_allreduce_loss_max", c0, now_s());
  }
  t0 = clock();
  ops.ce_exp_and_sum(T, V_l, mx, lg, se);  // logits become exp(l - max); the target's is in tg
  charge(kOther, "cross_entropy", t0, clock());
  if (t > 1) tp_allreduce(se, 2 * static_cast<std::size_t>(T), "tp_allreduce_loss_sum");
  t0 = clock();
  host_red.resize(3 * static_cast<std::size_t>(T));
  ops.to_host(r, host_red.data(), host_red.size());
  double loss = 0;
  for (int i = 0; i < T; ++i) loss += std::log(static_cast<double>(host_red[T + i])) + host_red[i] - host_red[2 * T + i];
  loss /= T;
  if (!backward) {
    charge(kOther, "cross_entropy", t0, clock());
    return loss;
  }
  const float scale = 1.0f / (static_cast<float>(T) * static_cast<float>(nmb_global));
  ops.ce_gradient(T, V_l, v0, targets.data(), se, scale, lg);
  charge(kOther, "cross_entropy_bwd", t0, clock());
  mm_at_acc(V_l, h, T, lg, xin, G(lm));
  float* gxf = ensure(gtmp, Thl);
  float* gxp = block_output(gxf);
  mm(T, h, V_l, lg, P(lm), gxp);
  block_exit(gxp, gxf, "tp_allreduce_lm_head_bwd", "sp_reducescatter_lm_head_bwd");
  t0 = clock();
  float* g = ensure(gbuf, Thl);
  ln_backward(inputs[L].data(), lnf_g, lnf_b, lnf_mean.data(), lnf_rstd.data(), gxf, g);
  charge(kOther, "final_layernorm_bwd", t0, clock());
  return loss;
}

void Trainer::Impl::embed_backward() {
  const float* g = sp_gather(gbuf.data(), sp_grad, "sp_allgather_embedding_bwd");
  const double t0 = clock();
  ops.embedding_backward(T, h, v0, V_l, tokens.data(), g, G(emb));
  charge(kOther, "embedding_bwd", t0, clock());
}

}  // namespace tedsim::runtime
