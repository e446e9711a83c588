// The dropless dispatcher: every token reaches its k experts. The routing fills a dispatch buffer
// whose capacity is the busiest expert's count; each rank learns from each peer how many rows of
// each of its experts come (an all-to-all of the counts), and the rows themselves travel over an
// all-to-all-v: rank r of the expert group owns experts r*El .. r*El+El-1, every rank sends each
// peer its rows for the peer's experts in expert order, and stores what it receives expert-major
// (local expert, then source) for the grouped GEMM. The way back is the exact inverse (Megatron-
// Core's alltoall dispatcher without a capacity).
#include <algorithm>
#include <vector>

#include "tedsim/runtime/moe/token_dispatcher.hpp"

namespace tedsim::runtime {
namespace {

class DroplessDispatcher final : public TokenDispatcher {
 public:
  void dispatch(StepContext& c, const float* xn, MoeActs& A) override {
    const StepDims& d = c.dims;
    const int E = d.experts, El = d.local_experts;
    A.dropless_capacity = c.ops.routing_capacity(*A.routing);
    c.ops.routing_counts(*A.routing, A.kept);
    if (c.opt.track_expert_loads && c.mode != CommMode::replay) c.expert_load_samples.push_back(A.kept);
    float* dbuf = ensure(A.dispatch_buf, buffer_floats(d, A));
    c.ops.dispatch(*A.routing, xn, d.hidden, dbuf);
    // Each peer learns how many rows of each of its experts come from here (exact as floats). The
    // counts travel in the backend's memory (NCCL reads device memory) and come back to the host,
    // which sizes and places the rows. Alone in its expert group, a rank receives what it kept.
    const int S = c.ep->size();
    if (S == 1) {
      A.received = A.kept;
    } else {
      std::vector<float> counts(E);
      for (int e = 0; e < E; ++e) counts[e] = static_cast<float>(A.kept[e]);
      float* sc = ensure(c.ws.count_send, E);
      float* rc = ensure(c.ws.count_recv, E);
      c.ops.from_host(counts.data(), sc, E);
      c.collective(Coll::all_to_all, *c.ep, sc, rc, E, kEpAllToAll, "ep_alltoall_dispatch");
      c.ops.to_host(rc, counts.data(), E);
      A.received.resize(E);
      for (int i = 0; i < E; ++i) A.received[i] = static_cast<std::int32_t>(counts[i]);
    }
    A.expert_rows.assign(El, 0);
    std::size_t total = 0;
    for (int x = 0; x < El; ++x) {
      for (int sr = 0; sr < S; ++sr) A.expert_rows[x] += A.received[sr * El + x];
      total += A.expert_rows[x];
    }
    exchange_out(c, A, dbuf, ensure(A.expert_in, std::max<std::size_t>(total * d.hidden, 1)));
  }

  void combine(StepContext& c, MoeActs& A, float* expert_out, float* out) override {
    const StepDims& d = c.dims;
    const std::size_t total = total_rows(A);
    // Every tensor rank routed the same tokens alike: the same rows, each with a slice of the width.
    if (c.cfg.expert_tp && d.tensor_size > 1) c.tp_allreduce(expert_out, total * d.hidden, "tp_allreduce_expert");
    float* cb = ensure(A.dispatch_buf, buffer_floats(d, A));  // consumed: it becomes the combine input
    exchange_back(c, A, expert_out, cb);
    c.ops.combine(*A.routing, cb, d.hidden, out);
    if (c.opt.track_imbalance && c.mode != CommMode::replay) {
      // The busiest expert of the expert group over the mean of all its experts, and the busiest
      // rank (the sum of its experts' rows) over the mean rank.
      std::vector<double> busiest{double(*std::max_element(A.expert_rows.begin(), A.expert_rows.end())), double(total)};
      c.ep->host_max(busiest);
      const std::int64_t all = c.ep->host_sum(static_cast<std::int64_t>(total));
      if (all > 0) {
        c.imbalance_samples.push_back(busiest[0] / (double(all) / d.experts));
        c.rank_load_samples.push_back(busiest[1] / (double(all) / c.ep->size()));
      }
    }
  }

  float* combine_backward(StepContext& c, MoeActs& A, const float* g) override {
    const StepDims& d = c.dims;
    float* gwt = ensure(c.ws.routing_weight_grad, static_cast<std::size_t>(d.routed_tokens) * d.top_k);
    float* gcb = ensure(c.ws.hidden_grad2, buffer_floats(d, A));
    c.ops.combine_backward(*A.routing, A.dispatch_buf.data(), g, d.hidden, gcb, gwt);
    float* geout = ensure(c.ws.wide1, std::max<std::size_t>(total_rows(A) * d.hidden, 1));
    exchange_out(c, A, gcb, geout);
    return geout;
  }

  void dispatch_backward(StepContext& c, MoeActs& A, float* expert_in_grad, float* gxn) override {
    const StepDims& d = c.dims;
    if (c.cfg.expert_tp && d.tensor_size > 1)
      c.tp_allreduce(expert_in_grad, total_rows(A) * d.hidden, "tp_allreduce_expert");
    float* gdb = ensure(c.ws.gathered, buffer_floats(d, A));
    exchange_back(c, A, expert_in_grad, gdb);
    c.ops.dispatch_backward(*A.routing, gdb, d.hidden, gxn);
  }

 private:
  static std::size_t buffer_floats(const StepDims& d, const MoeActs& A) {
    return std::size_t(d.experts) * A.dropless_capacity * d.hidden;
  }
  static std::size_t total_rows(const MoeActs& A) {
    std::size_t total = 0;
    for (int r : A.expert_rows) total += r;
    return total;
  }

  // How many elements this rank sends each peer of the expert group in the dispatch direction (its
  // kept rows of the peer's experts) and receives from each (their rows of this rank's experts);
  // the combine direction swaps the two.
  static std::vector<std::size_t> to_owners(StepContext& c, const MoeActs& A) {
    const int El = c.dims.local_experts;
    std::vector<std::size_t> counts(c.ep->size(), 0);
    for (int e = 0; e < c.dims.experts; ++e) counts[e / El] += std::size_t(A.kept[e]) * c.dims.hidden;
    return counts;
  }
  static std::vector<std::size_t> from_sources(StepContext& c, const MoeActs& A) {
    const int El = c.dims.local_experts;
    std::vector<std::size_t> counts(c.ep->size(), 0);
    for (std::size_t sr = 0; sr < counts.size(); ++sr)
      for (int x = 0; x < El; ++x) counts[sr] += std::size_t(A.received[sr * El + x]) * c.dims.hidden;
    return counts;
  }
  static std::size_t total(const std::vector<std::size_t>& counts) {
    std::size_t sum = 0;
    for (std::size_t n : counts) sum += n;
    return std::max<std::size_t>(sum, 1);
  }
  // Where source s's rows for local expert x start, source-major (s, then x) and expert-major (x, then s).
  static std::vector<std::size_t> offsets(const MoeActs& A, int S, int El, std::size_t hh, bool expert_major) {
    std::vector<std::size_t> at(std::size_t(S) * El);
    std::size_t next = 0;
    for (int i = 0; i < S * El; ++i) {
      const int sr = expert_major ? i % S : i / El, x = expert_major ? i / S : i % El;
      at[sr * El + x] = next;
      next += std::size_t(A.received[sr * El + x]) * hh;
    }
    return at;
  }
  // Copies every (source, local expert) block of rows from one layout's offsets to the other's.
  static void relayout(StepContext& c, const MoeActs& A, const float* src, const std::vector<std::size_t>& src_at,
                       float* dst, const std::vector<std::size_t>& dst_at) {
    for (std::size_t i = 0; i < src_at.size(); ++i)
      c.ops.copy(dst + dst_at[i], src + src_at[i], std::size_t(A.received[i]) * c.dims.hidden);
  }

  // The dispatch buffer [E][capacity][h] (expert e's kept rows at [e][0, kept[e])) -> the local
  // experts' rows from every source, expert-major. As in Megatron-Core's dispatcher, a copy that
  // would change nothing is not made: with one rank in the expert group there is no exchange (its
  // packed rows are already expert-major), and with one local expert the received rows are
  // already expert-major (source order is expert order); only several sources and several local
  // experts need the regrouping (sort_chunks_by_idxs there, priced as expert_major_layout).
  static void exchange_out(StepContext& c, const MoeActs& A, const float* dbuf, float* expert_rows) {
    const int S = c.ep->size(), El = c.dims.local_experts, Cl = A.dropless_capacity;
    const std::size_t hh = static_cast<std::size_t>(c.dims.hidden);
    const std::vector<std::size_t> send_counts = to_owners(c, A), recv_counts = from_sources(c, A);
    const bool exchange = S > 1, regroup = exchange && El > 1;
    float* packed = exchange ? ensure(c.ws.send, total(send_counts)) : expert_rows;
    std::size_t at = 0;
    for (int e = 0; e < c.dims.experts; ++e) {
      const std::size_t n = std::size_t(A.kept[e]) * hh;
      c.ops.copy(packed + at, dbuf + std::size_t(e) * Cl * hh, n);
      at += n;
    }
    if (!exchange) return;
    float* rb = regroup ? ensure(c.ws.recv, total(recv_counts)) : expert_rows;
    c.all_to_all_v(packed, send_counts, rb, recv_counts, "ep_alltoall_dispatch");
    if (regroup) relayout(c, A, rb, offsets(A, S, El, hh, false), expert_rows, offsets(A, S, El, hh, true));
  }

  // The exact inverse: expert-major rows back to the dispatch buffer's layout.
  static void exchange_back(StepContext& c, const MoeActs& A, const float* expert_rows, float* dbuf) {
    const int S = c.ep->size(), El = c.dims.local_experts, Cl = A.dropless_capacity;
    const std::size_t hh = static_cast<std::size_t>(c.dims.hidden);
    const bool exchange = S > 1, regroup = exchange && El > 1;
    const float* packed = expert_rows;
    if (exchange) {
      const std::vector<std::size_t> send_counts = from_sources(c, A), recv_counts = to_owners(c, A);
      const float* sb = expert_rows;
      if (regroup) {
        float* regrouped = ensure(c.ws.send, total(send_counts));
        relayout(c, A, expert_rows, offsets(A, S, El, hh, true), regrouped, offsets(A, S, El, hh, false));
        sb = regrouped;
      }
      float* rb = ensure(c.ws.recv, total(recv_counts));
      c.all_to_all_v(sb, send_counts, rb, recv_counts, "ep_alltoall_combine");
      packed = rb;
    }
    std::size_t at = 0;
    for (int e = 0; e < c.dims.experts; ++e) {
      const std::size_t n = std::size_t(A.kept[e]) * hh;
      c.ops.copy(dbuf + std::size_t(e) * Cl * hh, packed + at, n);
      at += n;
    }
  }
};

}  // namespace

std::unique_ptr<TokenDispatcher> make_dropless_dispatcher() { return std::make_unique<DroplessDispatcher>(); }

}  // namespace tedsim::runtime
