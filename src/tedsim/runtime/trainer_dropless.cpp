// Dropless MoE layers of the step: each expert's kept rows travel over all-to-all-v to the rank
// that holds it, the local experts run on however many rows arrived, and the results come back.
#include "tedsim/runtime/trainer_impl.hpp"

namespace tedsim::runtime {

// The dispatch buffer holds expert e's kept rows at [e][0, kept[e]); rank r of the expert group
// owns experts r*El .. r*El+El-1. Out: every rank sends each peer its rows for the peer's experts
// (in expert order) and receives, from each source s, its rows for each local expert x: they are
// stored expert-major (x, then s) for the grouped GEMM. Back is the exact inverse.
void Trainer::Impl::dropless_exchange_out(LayerActs& A, const float* dbuf, float* expert_rows) {
  const int S = ep->size(), Cl = A.dl_capacity;
  const std::size_t hh = static_cast<std::size_t>(h);
  std::vector<std::size_t> send_counts(S, 0), recv_counts(S, 0);
  std::size_t sent = 0, received = 0;
  for (int e2 = 0; e2 < E; ++e2) send_counts[e2 / El] += std::size_t(A.dl_kept[e2]) * hh;
  for (int sr = 0; sr < S; ++sr)
    for (int x = 0; x < El; ++x) recv_counts[sr] += std::size_t(A.dl_recv[sr * El + x]) * hh;
  for (std::size_t c : send_counts) sent += c;
  for (std::size_t c : recv_counts) received += c;
  float* sb = ensure(send, std::max<std::size_t>(sent, 1));
  std::size_t at = 0;
  for (int e2 = 0; e2 < E; ++e2) {
    const std::size_t n = std::size_t(A.dl_kept[e2]) * hh;
    ops.copy(sb + at, dbuf + std::size_t(e2) * Cl * hh, n);
    at += n;
  }
  float* rb = ensure(recv, std::max<std::size_t>(received, 1));
  all_to_all_v(sb, send_counts, rb, recv_counts, "ep_alltoall_dispatch");
  // Source-major (s, x) -> expert-major (x, s).
  std::vector<std::size_t> src_at(std::size_t(S) * El);
  at = 0;
  for (int sr = 0; sr < S; ++sr)
    for (int x = 0; x < El; ++x) {
      src_at[sr * El + x] = at;
      at += std::size_t(A.dl_recv[sr * El + x]) * hh;
    }
  at = 0;
  for (int x = 0; x < El; ++x)
    for (int sr = 0; sr < S; ++sr) {
      const std::size_t n = std::size_t(A.dl_recv[sr * El + x]) * hh;
      ops.copy(expert_rows + at, rb + src_at[sr * El + x], n);
      at += n;
    }
}

void Trainer::Impl::dropless_exchange_back(LayerActs& A, const float* expert_rows, float* dbuf) {
  const int S = ep->size(), Cl = A.dl_capacity;
  const std::size_t hh = static_cast<std::size_t>(h);
  std::vector<std::size_t> send_counts(S, 0), recv_counts(S, 0);
  std::size_t sent = 0, received = 0;
  for (int sr = 0; sr < S; ++sr)
    for (int x = 0; x < El; ++x) send_counts[sr] += std::size_t(A.dl_recv[sr * El + x]) * hh;
  for (int e2 = 0; e2 < E; ++e2) recv_counts[e2 / El] += std::size_t(A.dl_kept[e2]) * hh;
  for (std::size_t c : send_counts) sent += c;
  for (std::size_t c : recv_counts) received += c;
  // Expert-major (x, s) -> source-major (s, x).
  std::vector<std::size_t> src_at(std::size_t(S) * El);
  std::size_t at = 0;
  for (int x = 0; x < El; ++x)
    for (int sr = 0; sr < S; ++sr) {
      src_at[sr * El + x] = at;
      at += std::size_t(A.dl_recv[sr * El + x]) * hh;
    }
  float* sb = ensure(send, std::max<std::size_t>(sent, 1));
  at = 0;
  for (int sr = 0; sr < S; ++sr)
    for (int x = 0; x < El; ++x) {
      const std::size_t n = std::size_t(A.dl_recv[sr * El + x]) * hh;
      ops.copy(sb + at, expert_rows + src_at[sr * El + x], n);
      at += n;
    }
  float* rb = ensure(recv, std::max<std::size_t>(received, 1));
  all_to_all_v(sb, send_counts, rb, recv_counts, "ep_alltoall_combine");
  at = 0;
  for (int e2 = 0; e2 < E; ++e2) {
    const std::size_t n = std::size_t(A.dl_kept[e2]) * hh;
    ops.copy(dbuf + std::size_t(e2) * Cl * hh, rb + at, n);
    at += n;
  }
}

void Trainer::Impl::dropless_experts_forward(const LayerIds& li, LayerActs& A, float* out) {
  const Routing& gate = *A.gate;
  A.dl_capacity = ops.routing_capacity(gate);
  ops.routing_counts(gate, A.dl_kept);
  const std::size_t ECh = static_cast<std::size_t>(E) * A.dl_capacity * h;
  float* dbuf = ensure(A.cbuf, ECh);
  ops.dispatch(gate, A.xn2.data(), h, dbuf);
  // Each peer learns how many rows of each of its experts come from here (exact as floats).
  float* sc = ensure(dl_send_counts, E);
  for (int e2 = 0; e2 < E; ++e2) sc[e2] = static_cast<float>(A.dl_kept[e2]);
  collective(Coll::all_to_all, *ep, sc, ensure(dl_recv_counts, E), E, kEpAllToAll, "ep_alltoall_dispatch");
  A.dl_recv.resize(E);
  for (int i = 0; i < E; ++i) A.dl_recv[i] = static_cast<std::int32_t>(dl_recv_counts.data()[i]);
  const int S = ep->size();
  std::vector<int> rows(El, 0);
  std::size_t total = 0;
  for (int x = 0; x < El; ++x) {
    for (int sr = 0; sr < S; ++sr) rows[x] += A.dl_recv[sr * El + x];
    total += rows[x];
  }
  const std::size_t hh = static_cast<std::size_t>(h);
  float* ein = ensure(A.ein, std::max<std::size_t>(total * hh, 1));
  dropless_exchange_out(A, dbuf, ein);
  ensure(A.ef1, std::max<std::size_t>(total * F1e, 1));
  ensure(A.ea1, std::max<std::size_t>(total * Fe, 1));
  float* eout = ensure(gmoe, std::max<std::size_t>(total * hh, 1));
  std::size_t off = 0;
  for (int x = 0; x < El; ++x) {
    const int R = rows[x];
    if (R > 0) {
      float* f1 = A.ef1.data() + off * F1e;
      float* a1 = A.ea1.data() + off * Fe;
      mm(R, F1e, h, ein + off * hh, P(li.efc1) + static_cast<std::size_t>(x) * h * F1e, f1);
      activation_forward(R, Fe, f1, a1);
      mm(R, h, Fe, a1, P(li.efc2) + static_cast<std::size_t>(x) * Fe * h, eout + off * hh);
    }
    off += R;
  }
  // Every tensor rank routed the same tokens alike: the same rows, each with a slice of the width.
  if (cfg.expert_tp && t > 1) tp_allreduce(eout, total * hh, "tp_allreduce_expert");
  float* cb = ensure(A.cbuf, ECh);  // the dispatch buffer is consumed: it becomes the combine input
  dropless_exchange_back(A, eout, cb);
  ops.combine(gate, cb, h, out);
  if (opt.track_imbalance && mode != CommMode::replay) {
    // The busiest expert of the expert group over the mean of all its experts.
    std::vector<double> busiest{double(*std::max_element(rows.begin(), rows.end()))};
    ep->host_max(busiest);
    const std::int64_t all = ep->host_sum(static_cast<std::int64_t>(total));
    if (all > 0) imbalance_samples.push_back(busiest[0] / (double(all) / E));
  }
}

void Trainer::Impl::dropless_experts_backward(const LayerIds& li, LayerActs& A, const float* g, float* gxn) {
  const Routing& gate = *A.gate;
  const std::size_t hh = static_cast<std::size_t>(h);
  const std::size_t ECh = static_cast<std::size_t>(E) * A.dl_capacity * hh;
  float* gwt = ensure(gweight, static_cast<std::size_t>(Tr) * k);
  float* gcb = ensure(gtmp2, ECh);
  ops.combine_backward(gate, A.cbuf.data(), g, h, gcb, gwt);
  const int S = ep->size();
  std::vector<int> rows(El, 0);
  std::size_t total = 0;
  int most = 0;
  for (int x = 0; x < El; ++x) {
    for (int sr = 0; sr < S; ++sr) rows[x] += A.dl_recv[sr * El + x];
    total += rows[x];
    most = std::max(most, rows[x]);
  }
  float* geout = ensure(gmoe, std::max<std::size_t>(total * hh, 1));
  dropless_exchange_out(A, gcb, geout);
  float* ga1 = ensure(scratch_out, std::max<std::size_t>(std::size_t(most) * Fe, 1));
  Tensor gf1;
  ensure(gf1, std::max<std::size_t>(std::size_t(most) * F1e, 1));
  float* gein = ensure(gw, std::max<std::size_t>(total * hh, 1));
  std::size_t off = 0;
  for (int x = 0; x < El; ++x) {
    const int R = rows[x];
    if (R > 0) {
      const float* go = geout + off * hh;
      const float* w1 = P(li.efc1) + static_cast<std::size_t>(x) * h * F1e;
      const float* w2 = P(li.efc2) + static_cast<std::size_t>(x) * Fe * h;
      mm_bt(R, Fe, h, go, w2, ga1);
      mm_at_acc(Fe, h, R, A.ea1.data() + off * Fe, go, G(li.efc2) + static_cast<std::size_t>(x) * Fe * h);
      activation_backward(R, Fe, A.ef1.data() + off * F1e, ga1, gf1.data());
      mm_at_acc(h, F1e, R, A.ein.data() + off * hh, gf1.data(), G(li.efc1) + static_cast<std::size_t>(x) * h * F1e);
      mm_bt(R, h, F1e, gf1.data(), w1, gein + off * hh);
    }
    off += R;
  }
  if (cfg.expert_tp && t > 1) tp_allreduce(gein, total * hh, "tp_allreduce_expert");
  float* gdb = ensure(gath, ECh);
  dropless_exchange_back(A, gein, gdb);
  ops.dispatch_backward(gate, gdb, h, gxn);
}

}  // namespace tedsim::runtime
