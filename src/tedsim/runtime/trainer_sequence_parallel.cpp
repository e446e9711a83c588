// Sequence parallelism in the step (Korthikanti et al. 2022; Megatron-Core's sequence_parallel):
// norms, residuals and the MoE router run on this rank's Tl = T/t token rows; each tensor-parallel
// block gathers its input's rows from the tensor group and reduce-scatters its partial output
// back to them (the backward swaps the two). Parameters every tensor rank holds whole (norms, the
// router) get gradients from the rank's own tokens only, summed over the group before the data
// sync, as Megatron-Core's finalize_model_grads does; the router's load-balancing loss is the
// group's (its statistics all-reduced, as Megatron-Core's router does under SP).
#include "tedsim/runtime/trainer_impl.hpp"

namespace tedsim::runtime {

const float* Trainer::Impl::sp_gather(const float* local, Tensor& full, const char* name) {
  if (!sp) return local;
  const std::size_t Th = static_cast<std::size_t>(T) * h;
  collective(Coll::all_gather, *tp, local, ensure(full, Th), Th, kTpAllGather, name);
  return full.data();
}

void Trainer::Impl::block_exit(float* partial, float* local, const char* allreduce_name, const char* sp_name) {
  if (!sp) {
    tp_allreduce(partial, static_cast<std::size_t>(T) * h, allreduce_name);
    return;
  }
  collective(Coll::reduce_scatter, *tp, partial, local, static_cast<std::size_t>(Tl) * h, kTpAllReduce, sp_name);
}

void Trainer::Impl::group_aux(Routing& r) {
  const std::size_t n = 2 * static_cast<std::size_t>(E);
  std::vector<float> stats(n);
  ops.aux_statistics(r, stats.data());
  float* dev = ensure(aux_stats, n);
  ops.from_host(stats.data(), dev, n);
  ops.fence();
  const double t0 = clock();
  tp->all_reduce(dev, dev, n, Dtype::fp32);
  tp->wait();
  charge(kTpAllReduce, "sp_allreduce_router_stats", t0, now_s());
  ops.to_host(dev, stats.data(), n);
  ops.set_group_aux(r, stats.data(), T);
}

void Trainer::Impl::sync_sequence_parallel_grads(int only_unit) {
  if (!sp) return;
  std::vector<int> replicated;
  std::size_t total = 0;
  for (std::size_t id = 0; id < store.infos().size(); ++id) {
    const ParamInfo& p = store.info(static_cast<int>(id));
    if (!p.tp_replicated) continue;
    // ZeRO-3 reduce-scatters a layer's gradients after each backward: they are summed there.
    const bool per_layer = zero3[p.expert] && p.unit >= 1 && p.unit <= L;
    if (only_unit >= 0 ? p.unit != only_unit || !per_layer : per_layer) continue;
    replicated.push_back(static_cast<int>(id));
    total += p.numel;
  }
  if (total == 0) return;
  // One all-reduce of all of them, packed.
  float* buf = ensure(sp_grads, total);
  std::size_t at = 0;
  for (int id : replicated) {
    ops.copy(buf + at, G(id), store.info(id).numel);
    at += store.info(id).numel;
  }
  const double t0 = clock();
  tp->all_reduce(buf, buf, total, Dtype::fp32);
  tp->wait();
  charge(kTpAllReduce, "sp_allreduce_replicated_grads", t0, now_s());
  at = 0;
  for (int id : replicated) {
    ops.copy(G(id), buf + at, store.info(id).numel);
    at += store.info(id).numel;
  }
}

}  // namespace tedsim::runtime
