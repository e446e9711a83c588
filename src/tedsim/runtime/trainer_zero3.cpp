// ZeRO-3 in the step (Rajbhandari et al. 2020, DeepSpeed stage 3): each data-parallel rank owns
// 1/d of every shard unit (the embedding, each layer, the head) and keeps the Adam state of its
// part only. A unit's parameters are all-gathered before its forward, its recompute and its
// backward; after a layer's backward its gradients are reduce-scattered into the owned shard
// every micro-batch. The embedding's and the head's are reduce-scattered once, at the step's end,
// after the tied-embedding sync has summed the two copies' gradients. Expert parameters do the
// same over the expert-data group.
//
// The gathers are blocking here (MPI's collectives are): a GPU framework prefetches the next unit
// while the current one computes, which the cost model assumes. The step keeps full-size
// parameter and gradient buffers as the gathers' target, so its measured memory is not ZeRO-3's.
#include "tedsim/runtime/trainer_impl.hpp"

namespace tedsim::runtime {

void Trainer::Impl::setup_zero3() {
  if (cfg.zero < 3) return;
  for (int b = 0; b < 2; ++b) {
    const int n = sync_group(b).size();
    zero3[b] = n > 1;
    if (!zero3[b]) continue;
    shard_at[b].clear();
    std::size_t at = 0;
    for (const ParamStore::UnitRange& u : store.units()) {
      shard_at[b].push_back(at);
      at += u.size[b] / n;
    }
    zeros(grad_shard[b], std::max<std::size_t>(at, 1));
  }
}

void Trainer::Impl::gather_unit(int u) {
  if (!zero3[0] && !zero3[1]) return;
  const double t0 = clock();
  bool moved = false;
  for (int b = 0; b < 2; ++b) {
    const ParamStore::UnitRange& r = store.units()[u];
    if (!zero3[b] || r.size[b] == 0) continue;
    Communicator& comm = sync_group(b);
    const std::size_t count = r.size[b] / comm.size();
    float* base = store.params(b).data() + r.offset[b];
    comm.all_gather(base + static_cast<std::size_t>(comm.rank()) * count, base, count, Dtype::fp32);
    comm.wait();
    moved = true;
  }
  if (moved) charge(kDpGradSync, "zero3_param_allgather", t0, now_s());
}

bool Trainer::Impl::reduce_into_shard(int b, int u) {
  const ParamStore::UnitRange& r = store.units()[u];
  if (!zero3[b] || r.size[b] == 0) return false;
  Communicator& comm = sync_group(b);
  const std::size_t count = r.size[b] / comm.size();
  float* reduced = ensure(zero3_scratch, count);
  comm.reduce_scatter(store.grads(b).data() + r.offset[b], reduced, count, Dtype::fp32);
  comm.wait();
  add_into(count, reduced, grad_shard[b].data() + shard_at[b][u]);
  return true;
}

void Trainer::Impl::reduce_unit_grads(int u) {
  if (!zero3[0] && !zero3[1]) return;
  sync_sequence_parallel_grads(u);
  const double t0 = clock();
  bool moved = false;
  for (int b = 0; b < 2; ++b) {
    if (!reduce_into_shard(b, u)) continue;
    const ParamStore::UnitRange& r = store.units()[u];
    // The next micro-batch accumulates afresh.
    ops.memory().zero(store.grads(b).data() + r.offset[b], r.size[b] * sizeof(float));
    moved = true;
  }
  if (moved) charge(kDpGradSync, "zero3_grad_reducescatter", t0, now_s());
}

void Trainer::Impl::zero3_sync_and_update(int b, const kernels::AdamConfig& ac) {
  Communicator& comm = sync_group(b);
  const int n = comm.size();
  const std::vector<ParamStore::UnitRange>& units = store.units();
  // The embedding's and the head's units: reduce-scattered now.
  double t0 = clock();
  for (int u : {0, L + 1})
    if (u < static_cast<int>(units.size())) reduce_into_shard(b, u);
  charge(kDpGradSync, b ? "grad_sync_expert" : "grad_sync_nonexpert", t0, now_s());
  t0 = clock();
  Tensor& m = b ? m_ex : m_ne;
  Tensor& v = b ? v_ex : v_ne;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::size_t count = units[u].size[b] / n;
    if (count == 0) continue;
    float* owned = store.params(b).data() + units[u].offset[b] + static_cast<std::size_t>(comm.rank()) * count;
    const std::size_t at = shard_at[b][u];
    ops.adam_step(count, ac, adam_step, owned, grad_shard[b].data() + at, m.data() + at, v.data() + at);
  }
  charge(kOptimizer, "adam_step", t0, clock());
  grad_shard[b].fill_zero();
}

void Trainer::Impl::gather_all_units() {
  for (std::size_t u = 0; u < store.units().size(); ++u) gather_unit(static_cast<int>(u));
}

}  // namespace tedsim::runtime
