// Under sequence parallelism the parameters every tensor rank holds whole (norms, the router) get
// gradients from the rank's own tokens only: they are summed over the tensor group before the data
// sync, packed into one all-reduce, as Megatron-Core's finalize_model_grads does. MLA's down
// projections and latent norms get gradients from the rank's own heads only, with or without SP:
// summed the same way (Megatron-Core instead all-reduces the latents' gradients inside the layer).
#include "tedsim/runtime/optimizer/param_sync.hpp"

namespace tedsim::runtime {

void ParamSync::sync_sequence_parallel_grads(int only_unit) {
  if (c_.dims.tensor_size <= 1) return;
  ParamStore& store = c_.store;
  std::vector<int> replicated;
  std::size_t total = 0;
  for (std::size_t id = 0; id < store.infos().size(); ++id) {
    const ParamInfo& p = store.info(static_cast<int>(id));
    if (!p.tp_replicated || !(c_.dims.sequence_parallel || p.tp_partial_grad)) continue;
    // ZeRO-3 reduce-scatters a layer's (and a prediction module's) gradients after each backward:
    // they are summed there; the embedding's and the head's units at the step's end.
    const bool per_layer = zero3_[p.expert] && p.unit != 0 && p.unit != c_.dims.layers + 1;
    if (only_unit >= 0 ? p.unit != only_unit || !per_layer : per_layer) continue;
    replicated.push_back(static_cast<int>(id));
    total += p.numel;
  }
  if (total == 0) return;
  float* buf = ensure(c_.ws.sp_grads, total);
  std::size_t at = 0;
  for (int id : replicated) {
    c_.ops.copy(buf + at, c_.G(id), store.info(id).numel);
    at += store.info(id).numel;
  }
  const double t0 = c_.clock();
  c_.tp->all_reduce(buf, buf, total, Dtype::fp32);
  c_.tp->wait();
  c_.charge(kTpAllReduce, "sp_allreduce_replicated_grads", t0, now_s());
  at = 0;
  for (int id : replicated) {
    c_.ops.copy(c_.G(id), buf + at, store.info(id).numel);
    at += store.info(id).numel;
  }
}

}  // namespace tedsim::runtime
