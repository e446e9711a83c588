// The TED paper's dispatcher: the routing fills a fixed [E][C][h] buffer (tokens over capacity
// dropped), an all-to-all over the expert group moves each expert's C rows to its rank, and the
// mirror brings the outputs back. With t > 1 and duplicate token dropping (or experts not split
// over t), each tensor rank sends only its C/t slice and the other slices are all-gathered after
// the exchange (Singh et al. 2023, section 4); with expert TP and no DTD every rank sends the
// whole buffer. Under sequence parallelism each rank routes its own tokens, and with expert TP the
// experts gather the tensor group's rows first and reduce-scatter their partial outputs (Megatron-
// Core's alltoall dispatcher with moe_tp > 1).
#include "tedsim/runtime/moe/token_dispatcher.hpp"

namespace tedsim::runtime {
namespace {

class CapacityDispatcher final : public TokenDispatcher {
 public:
  void dispatch(StepContext& c, const float* xn, MoeActs& A) override {
    const StepDims& d = c.dims;
    Workspace& ws = c.ws;
    const std::size_t ECh = buffer_floats(d), ECph = exchange_floats(d);
    float* dbuf = ensure(A.dispatch_buf, ECh);
    c.ops.dispatch(*A.routing, xn, d.hidden, dbuf);
    const float* a2a_in = dbuf;
    if (d.dtd_split) {
      slice_capacity(c, dbuf, ensure(ws.send, ECph));
      a2a_in = ws.send.data();
    }
    c.collective(Coll::all_to_all, *c.ep, a2a_in, ensure(ws.recv, ECph), ECph, kEpAllToAll, "ep_alltoall_dispatch");
    const float* src = ws.recv.data();
    A.sources = d.expert_size;
    if (d.expert_tp_split || d.sp_expert_gather) {  // the experts' width is split over t: every tensor rank's tokens
      c.collective(Coll::all_gather, *c.tp, ws.recv.data(), ensure(ws.gathered, ECph * d.tensor_size),
                   ECph * d.tensor_size, kTpAllGather,
                   d.sequence_parallel ? "sp_allgather_expert" : "dtd_allgather_dispatch");
      src = ws.gathered.data();
      A.sources = d.tensor_size * d.expert_size;
    }
    const int R = A.sources * d.capacity_per_rank;  // rows per local expert
    A.expert_rows.assign(d.local_experts, R);
    to_expert_major(c, src, ensure(A.expert_in, rows_floats(d, A)), A.sources);
  }

  void combine(StepContext& c, MoeActs& A, float* expert_out, float* out) override {
    const StepDims& d = c.dims;
    Workspace& ws = c.ws;
    const std::size_t ECh = buffer_floats(d), ECph = exchange_floats(d), rows_h = rows_floats(d, A);
    if (c.cfg.expert_tp && d.tensor_size > 1 && !d.sequence_parallel)
      c.tp_allreduce(expert_out, rows_h, "tp_allreduce_expert");
    float* back = ensure(ws.gathered, rows_h);
    from_expert_major(c, expert_out, back, A.sources);
    const float* a2a_back = d.expert_tp_split ? back + static_cast<std::size_t>(d.tensor_rank) * ECph : back;  // DTD drop
    if (d.sp_expert_gather) {  // each tensor rank's rows of the partial outputs, summed
      c.collective(Coll::reduce_scatter, *c.tp, back, ensure(ws.send, ECph), ECph, kTpAllReduce,
                   "sp_reducescatter_expert");
      a2a_back = ws.send.data();
    }
    c.collective(Coll::all_to_all, *c.ep, a2a_back, ensure(ws.recv, ECph), ECph, kEpAllToAll, "ep_alltoall_combine");
    float* cb = ensure(A.dispatch_buf, ECh);
    if (d.dtd_split) {
      c.collective(Coll::all_gather, *c.tp, ws.recv.data(), ensure(ws.send, ECph * d.tensor_size),
                   ECph * d.tensor_size, kTpAllGather, "dtd_allgather_combine");
      unslice_capacity(c, ws.send.data(), cb);
    } else {
      c.ops.copy(cb, ws.recv.data(), ECh);
    }
    c.ops.combine(*A.routing, cb, d.hidden, out);
  }

  float* combine_backward(StepContext& c, MoeActs& A, const float* g) override {
    const StepDims& d = c.dims;
    Workspace& ws = c.ws;
    const std::size_t ECh = buffer_floats(d), ECph = exchange_floats(d);
    float* gwt = ensure(ws.routing_weight_grad, static_cast<std::size_t>(d.routed_tokens) * d.top_k);
    float* gcb = ensure(ws.send, std::max(ECh, ECph * d.tensor_size));
    c.ops.combine_backward(*A.routing, A.dispatch_buf.data(), g, d.hidden, gcb, gwt);
    const float* a2a_in = gcb;
    if (d.dtd_split) {  // backward of the final all-gather: this rank's slice
      slice_capacity(c, gcb, ensure(ws.gathered, ECph));
      a2a_in = ws.gathered.data();
    }
    c.collective(Coll::all_to_all, *c.ep, a2a_in, ensure(ws.recv, ECph), ECph, kEpAllToAll, "ep_alltoall_combine");
    const float* src = ws.recv.data();
    if (d.expert_tp_split || d.sp_expert_gather) {  // backward of the DTD drop or of SP's reduce-scatter
      c.collective(Coll::all_gather, *c.tp, ws.recv.data(), ensure(ws.gathered, ECph * d.tensor_size),
                   ECph * d.tensor_size, kTpAllGather,
                   d.sequence_parallel ? "sp_allgather_expert_bwd" : "dtd_allgather_combine");
      src = ws.gathered.data();
    }
    float* geout = ensure(ws.wide1, rows_floats(d, A));
    to_expert_major(c, src, geout, A.sources);
    return geout;
  }

  void dispatch_backward(StepContext& c, MoeActs& A, float* expert_in_grad, float* gxn) override {
    const StepDims& d = c.dims;
    Workspace& ws = c.ws;
    const std::size_t ECh = buffer_floats(d), ECph = exchange_floats(d), rows_h = rows_floats(d, A);
    if (c.cfg.expert_tp && d.tensor_size > 1 && !d.sequence_parallel)
      c.tp_allreduce(expert_in_grad, rows_h, "tp_allreduce_expert");
    float* back = ensure(ws.wide1, rows_h);
    from_expert_major(c, expert_in_grad, back, A.sources);
    const float* a2a_back = d.expert_tp_split ? back + static_cast<std::size_t>(d.tensor_rank) * ECph : back;
    if (d.sp_expert_gather) {  // backward of SP's all-gather: each tensor rank's rows, summed
      c.collective(Coll::reduce_scatter, *c.tp, back, ensure(ws.send, ECph), ECph, kTpAllReduce,
                   "sp_reducescatter_expert_bwd");
      a2a_back = ws.send.data();
    }
    c.collective(Coll::all_to_all, *c.ep, a2a_back, ensure(ws.recv, ECph), ECph, kEpAllToAll, "ep_alltoall_dispatch");
    float* gdb = ensure(ws.wide2, ECh);  // the experts' input gradient is consumed by now
    if (d.dtd_split) {  // backward of the DTD slice: all-gather
      c.collective(Coll::all_gather, *c.tp, ws.recv.data(), ensure(ws.send, ECph * d.tensor_size),
                   ECph * d.tensor_size, kTpAllGather, "dtd_allgather_dispatch");
      unslice_capacity(c, ws.send.data(), gdb);
    } else {
      c.ops.copy(gdb, ws.recv.data(), ECh);
    }
    c.ops.dispatch_backward(*A.routing, gdb, d.hidden, gxn);
  }

 private:
  static std::size_t buffer_floats(const StepDims& d) { return std::size_t(d.experts) * d.capacity * d.hidden; }
  static std::size_t exchange_floats(const StepDims& d) {
    return std::size_t(d.experts) * d.capacity_per_rank * d.hidden;
  }
  static std::size_t rows_floats(const StepDims& d, const MoeActs& A) {
    return std::size_t(d.local_experts) * A.sources * d.capacity_per_rank * d.hidden;
  }
  static std::size_t block(const StepDims& d) { return std::size_t(d.capacity_per_rank) * d.hidden; }

  // [E][C][h] -> this tensor rank's capacity slice [E][C/t][h].
  static void slice_capacity(StepContext& c, const float* src, float* dst) {
    const StepDims& d = c.dims;
    const std::size_t blk = block(d);
    c.ops.copy_rows(dst, blk, src + static_cast<std::size_t>(d.tensor_rank) * blk,
                    static_cast<std::size_t>(d.capacity) * d.hidden, blk, d.experts);
  }
  // Gathered [t][E][C/t][h] -> [E][C][h].
  static void unslice_capacity(StepContext& c, const float* src, float* dst) {
    const StepDims& d = c.dims;
    const std::size_t blk = block(d);
    for (int r = 0; r < d.tensor_size; ++r)
      c.ops.copy_rows(dst + r * blk, static_cast<std::size_t>(d.capacity) * d.hidden,
                      src + static_cast<std::size_t>(r) * d.experts * blk, blk, blk, d.experts);
  }
  // [S][El][C/t][h] <-> [El][S][C/t][h]; with one source the layouts coincide: a plain copy (the
  // experts keep their input for backward).
  static void to_expert_major(StepContext& c, const float* src, float* dst, int S) {
    const StepDims& d = c.dims;
    const std::size_t blk = block(d);
    const int El = d.local_experts;
    if (S == 1) return c.ops.copy(dst, src, El * blk);
    for (int sr = 0; sr < S; ++sr)
      c.ops.copy_rows(dst + sr * blk, S * blk, src + static_cast<std::size_t>(sr) * El * blk, blk, blk, El);
  }
  static void from_expert_major(StepContext& c, const float* src, float* dst, int S) {
    const StepDims& d = c.dims;
    const std::size_t blk = block(d);
    const int El = d.local_experts;
    if (S == 1) return c.ops.copy(dst, src, El * blk);
    for (int sr = 0; sr < S; ++sr)
      c.ops.copy_rows(dst + static_cast<std::size_t>(sr) * El * blk, blk, src + sr * blk, S * blk, blk, El);
  }
};

}  // namespace

std::unique_ptr<TokenDispatcher> make_capacity_dispatcher() { return std::make_unique<CapacityDispatcher>(); }

}  // namespace tedsim::runtime
