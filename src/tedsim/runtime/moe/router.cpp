#include "tedsim/runtime/moe/router.hpp"

#include "tedsim/kernels/cpu/gating.hpp"

namespace tedsim::runtime {

void Router::register_params(ParamRegistrar& reg, const StepContext& c, const std::string& prefix, int tensor_id,
                             float stdv) {
  const int h = c.dims.hidden, E = c.dims.experts;
  gate_ = reg.add(prefix + "moe.gate", "gate", tensor_id, false, true,
                  ParamRegistrar::slice(1, h, E, 0, 1, 0, h, {{0, E}}), 0, stdv);
}

void Router::forward(StepContext& c, const float* xn, MoeActs& A) {
  const StepDims& d = c.dims;
  const int Tr = d.routed_tokens, E = d.experts;
  c.mm(Tr, E, d.hidden, xn, c.P(gate_), ensure(A.logits, static_cast<std::size_t>(Tr) * E));
  if (!A.routing) A.routing = c.ops.make_routing();
  if (d.generic_router) {
    c.ops.route_forward(A.logits.data(), Tr, E, c.router_cfg, *A.routing);
  } else {
    kernels::GatingConfig gc;
    gc.k = d.top_k;
    gc.capacity_factor = c.model.moe.capacity_factor;
    gc.min_capacity = d.capacity;  // the rounded capacity (>= the formula's)
    c.ops.gating_forward(A.logits.data(), Tr, E, gc, *A.routing);
  }
  if (d.sequence_parallel) group_aux(c, *A.routing);
  c.aux_sum += c.ops.aux_loss(*A.routing);
  if (c.opt.track_routing) {  // a device-to-host copy on GPUs: off in measured runs
    c.ops.routing_choices(*A.routing, c.host_expert, c.host_position);
    for (int i = 0; i < Tr * d.top_k; ++i)
      c.routing_sig =
          mix64(c.routing_sig ^ static_cast<std::uint64_t>(c.host_expert[i] * 131 + c.host_position[i] + 7));
  }
}

void Router::backward(StepContext& c, const float* xn, MoeActs& A, float* gxn) {
  const StepDims& d = c.dims;
  const int Tr = d.routed_tokens, E = d.experts, h = d.hidden;
  float* glog = ensure(c.ws.gathered, static_cast<std::size_t>(Tr) * E);
  c.ops.gating_backward(*A.routing, c.ws.routing_weight_grad.data(),
                        c.opt.aux_loss_coef / static_cast<float>(d.global_micro_batches), glog);
  c.mm_at_acc(h, E, Tr, xn, glog, c.G(gate_));
  c.mm_bt(Tr, h, E, glog, c.P(gate_), gxn, 1.0f);
}

// Under SP: the aux loss's statistics summed over the tensor group, so every rank's loss is the
// group's (Megatron-Core's router all-reduces them likewise).
void Router::group_aux(StepContext& c, Routing& r) {
  const std::size_t n = 2 * static_cast<std::size_t>(c.dims.experts);
  std::vector<float> stats(n);
  c.ops.aux_statistics(r, stats.data());
  float* dev = ensure(c.ws.aux_stats, n);
  c.ops.from_host(stats.data(), dev, n);
  c.ops.fence();
  const double t0 = c.clock();
  c.tp->all_reduce(dev, dev, n, Dtype::fp32);
  c.tp->wait();
  c.charge(kTpAllReduce, "sp_allreduce_router_stats", t0, now_s());
  c.ops.to_host(dev, stats.data(), n);
  c.ops.set_group_aux(r, stats.data(), c.dims.tokens);
}

}  // namespace tedsim::runtime
