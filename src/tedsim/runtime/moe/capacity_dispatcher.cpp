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
    float* dbuf = ensure(A.dispatch_buf, buffer_floats(d));
    c.ops.dispatch(*A.routing, xn, d.hidden, dbuf);
    slots_to_rows(c, A, dbuf, c.ws.send, kDispatch, A.expert_in);
  }

  void combine(StepContext& c, MoeActs& A, float* expert_out, float* out) override {
    float* cb = rows_to_slots(c, A, expert_out, c.ws.gathered, kCombine, A.dispatch_buf);
    c.ops.combine(*A.routing, cb, c.dims.hidden, out);
  }

  float* combine_backward(StepContext& c, MoeActs& A, const float* g) override {
    const StepDims& d = c.dims;
    Workspace& ws = c.ws;
    float* gwt = ensure(ws.routing_weight_grad, static_cast<std::size_t>(d.routed_tokens) * d.top_k);
    float* gcb = ensure(ws.send, std::max(buffer_floats(d), exchange_floats(d) * d.tensor_size));
    c.ops.combine_backward(*A.routing, A.dispatch_buf.data(), g, d.hidden, gcb, gwt);
    // The gradient occupies `send`: the slice goes to `gathered` (consumed by the all-to-all first).
    slots_to_rows(c, A, gcb, ws.gathered, kCombineBackward, ws.wide1);
    return ws.wide1.data();
  }

  void dispatch_backward(StepContext& c, MoeActs& A, float* expert_in_grad, float* gxn) override {
    // The experts' input gradient (in wide2) is consumed before the slots' gradient lands there.
    float* gdb = rows_to_slots(c, A, expert_in_grad, c.ws.wide1, kDispatchBackward, c.ws.wide2);
    c.ops.dispatch_backward(*A.routing, gdb, c.dims.hidden, gxn);
  }

 private:
  // The trace's names of one direction's collectives.
  struct Names {
    const char *all_to_all, *expert_gather_sp, *expert_gather_dtd, *expert_scatter_sp, *dtd_gather;
  };
  static constexpr Names kDispatch{"ep_alltoall_dispatch", "sp_allgather_expert", "dtd_allgather_dispatch", "", ""};
  static constexpr Names kCombineBackward{"ep_alltoall_combine", "sp_allgather_expert_bwd", "dtd_allgather_combine", "",
                                          ""};
  static constexpr Names kCombine{"ep_alltoall_combine", "", "", "sp_reducescatter_expert", "dtd_allgather_combine"};
  static constexpr Names kDispatchBackward{"ep_alltoall_dispatch", "", "", "sp_reducescatter_expert_bwd",
                                           "dtd_allgather_dispatch"};

  // Slots [E][C][h] (the routing's dispatch buffer, or its gradient) to the local experts' rows,
  // expert-major, in `rows`: DTD's slice (into `slice`), the all-to-all, the tensor group's gather
  // where the experts' width is split over t (DTD with expert TP, or SP with expert TP).
  static void slots_to_rows(StepContext& c, MoeActs& A, const float* slots, Tensor& slice, const Names& n,
                            Tensor& rows) {
    const StepDims& d = c.dims;
    Workspace& ws = c.ws;
    const std::size_t ECph = exchange_floats(d);
    const float* a2a_in = slots;
    if (d.dtd_split) {
      slice_capacity(c, slots, ensure(slice, ECph));
      a2a_in = slice.data();
    }
    c.collective(Coll::all_to_all, *c.ep, a2a_in, ensure(ws.recv, ECph), ECph, kEpAllToAll, n.all_to_all);
    const float* src = ws.recv.data();
    A.sources = d.expert_size;
    if (d.expert_tp_split || d.sp_expert_gather) {
      c.collective(Coll::all_gather, *c.tp, ws.recv.data(), ensure(ws.gathered, ECph * d.tensor_size),
                   ECph * d.tensor_size, kTpAllGather, d.sequence_parallel ? n.expert_gather_sp : n.expert_gather_dtd);
      src = ws.gathered.data();
      A.sources = d.tensor_size * d.expert_size;
    }
    A.expert_rows.assign(d.local_experts, A.sources * d.capacity_per_rank);
    to_expert_major(c, src, ensure(rows, rows_floats(d, A)), A.sources);
  }

  // The mirror: the experts' rows (or their gradient) back to the slots, returned in `slots`: the
  // expert-TP reduction, source-major (into `back`), DTD's drop of the other tensor ranks' slices or
  // SP's reduce-scatter, the all-to-all, DTD's all-gather of the slices.
  static float* rows_to_slots(StepContext& c, MoeActs& A, float* rows, Tensor& back_buf, const Names& n,
                              Tensor& slots) {
    const StepDims& d = c.dims;
    Workspace& ws = c.ws;
    const std::size_t ECh = buffer_floats(d), ECph = exchange_floats(d), rows_h = rows_floats(d, A);
    if (c.cfg.expert_tp && d.tensor_size > 1 && !d.sequence_parallel) c.tp_allreduce(rows, rows_h, "tp_allreduce_expert");
    float* back = ensure(back_buf, rows_h);
    from_expert_major(c, rows, back, A.sources);
    const float* a2a_back = d.expert_tp_split ? back + static_cast<std::size_t>(d.tensor_rank) * ECph : back;
    if (d.sp_expert_gather) {  // each tensor rank's rows of the partial outputs, summed
      c.collective(Coll::reduce_scatter, *c.tp, back, ensure(ws.send, ECph), ECph, kTpAllReduce, n.expert_scatter_sp);
      a2a_back = ws.send.data();
    }
    c.collective(Coll::all_to_all, *c.ep, a2a_back, ensure(ws.recv, ECph), ECph, kEpAllToAll, n.all_to_all);
    float* out = ensure(slots, ECh);
    if (d.dtd_split) {
      c.collective(Coll::all_gather, *c.tp, ws.recv.data(), ensure(ws.send, ECph * d.tensor_size),
                   ECph * d.tensor_size, kTpAllGather, n.dtd_gather);
      unslice_capacity(c, ws.send.data(), out);
    } else {
      c.ops.copy(out, ws.recv.data(), ECh);
    }
    return out;
  }

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
