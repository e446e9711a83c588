// Embedding, LM head and vocabulary-parallel cross-entropy, forward and backward.
#include "tedsim/runtime/trainer_impl.hpp"

namespace tedsim::runtime {

void Trainer::Impl::embed_forward() {
  const double t0 = now_s();
  float* x = ensure(inputs[0], static_cast<std::size_t>(T) * h);
  const float* w = P(emb);
  for (int i = 0; i < T; ++i) {
    const int id = tokens[i] - v0;
    if (id >= 0 && id < V_l)
      std::memcpy(x + static_cast<std::size_t>(i) * h, w + static_cast<std::size_t>(id) * h, sizeof(float) * h);
    else
      std::memset(x + static_cast<std::size_t>(i) * h, 0, sizeof(float) * h);
  }
  phase[kOther] += now_s() - t0;
  CommMode saved = mode;
  mode = CommMode::live;
  tp_allreduce(x, static_cast<std::size_t>(T) * h);
  mode = saved;
}

double Trainer::Impl::head_and_loss(bool backward) {
  const std::size_t Th = static_cast<std::size_t>(T) * h;
  double t0 = now_s();
  kernels::layernorm_forward(T, h, kLnEps, inputs[L].data(), P(lnf_g), P(lnf_b), ensure(xf, Th), ensure(lnf_mean, T),
                             ensure(lnf_rstd, T));
  phase[kOther] += now_s() - t0;
  float* lg = ensure(logits, static_cast<std::size_t>(T) * V_l);
  mm_bt(T, V_l, h, xf.data(), P(lm), lg);
  t0 = now_s();
  float* r = ensure(red, 3 * static_cast<std::size_t>(T));
  float *mx = r, *se = r + T, *tg = r + 2 * T;
  for (int i = 0; i < T; ++i) {
    const float* row = lg + static_cast<std::size_t>(i) * V_l;
    float m = -std::numeric_limits<float>::infinity();
    for (int v = 0; v < V_l; ++v) m = std::max(m, row[v]);
    mx[i] = m;
    const int id = targets[i] - v0;
    tg[i] = (id >= 0 && id < V_l) ? row[id] : 0.0f;  // the target's logit, from its owner only
  }
  phase[kOther] += now_s() - t0;
  if (t > 1) {
    const double c0 = now_s();
    tp->all_reduce(mx, mx, T, Dtype::fp32, ReduceOp::max);
    phase[kTpAllReduce] += now_s() - c0;
  }
  t0 = now_s();
  for (int i = 0; i < T; ++i) {
    float* row = lg + static_cast<std::size_t>(i) * V_l;
    double sum = 0;
    for (int v = 0; v < V_l; ++v) {
      row[v] = std::exp(row[v] - mx[i]);  // logits become exp(l - max); the target's is recovered below
      sum += row[v];
    }
    se[i] = static_cast<float>(sum);
  }
  phase[kOther] += now_s() - t0;
  if (t > 1) tp_allreduce(se, 2 * static_cast<std::size_t>(T));
  t0 = now_s();
  double loss = 0;
  for (int i = 0; i < T; ++i) loss += std::log(static_cast<double>(se[i])) + mx[i] - tg[i];
  loss /= T;
  if (!backward) {
    phase[kOther] += now_s() - t0;
    return loss;
  }
  const float scale = 1.0f / (static_cast<float>(T) * static_cast<float>(nmb_global));
  for (int i = 0; i < T; ++i) {
    float* row = lg + static_cast<std::size_t>(i) * V_l;
    const float inv = scale / se[i];
    for (int v = 0; v < V_l; ++v) row[v] *= inv;
    const int id = targets[i] - v0;
    if (id >= 0 && id < V_l) row[id] -= scale;
  }
  phase[kOther] += now_s() - t0;
  mm_at_acc(V_l, h, T, lg, xf.data(), G(lm));
  float* gxf = ensure(gtmp, Th);
  mm(T, h, V_l, lg, P(lm), gxf);
  tp_allreduce(gxf, Th);
  t0 = now_s();
  float* g = ensure(gbuf, Th);
  kernels::layernorm_backward(T, h, inputs[L].data(), P(lnf_g), lnf_mean.data(), lnf_rstd.data(), gxf, g,
                              ensure(lnd_g, h), ensure(lnd_b, h));
  add_into(h, lnd_g.data(), G(lnf_g));
  add_into(h, lnd_b.data(), G(lnf_b));
  phase[kOther] += now_s() - t0;
  return loss;
}

void Trainer::Impl::embed_backward() {
  const double t0 = now_s();
  float* gwt = G(emb);
  const float* g = gbuf.data();
  for (int i = 0; i < T; ++i) {
    const int id = tokens[i] - v0;
    if (id >= 0 && id < V_l) add_into(h, g + static_cast<std::size_t>(i) * h, gwt + static_cast<std::size_t>(id) * h);
  }
  phase[kOther] += now_s() - t0;
}

}  // namespace tedsim::runtime
