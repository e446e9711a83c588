// ZeRO-3 in the step (Rajbhandari et al. 2020, DeepSpeed stage 3): each data-parallel rank owns
// 1/d of every shard unit (the embedding, each layer, the head) and keeps the Adam state of its
// part only. A unit's parameters are all-gathered before its forward, its recompute and its
// backward; after a layer's backward its gradients are reduce-scattered into the owned shard
// every micro-batch. The embedding's and the head's are reduce-scattered once, at the step's end,
// after the tied-embedding sync has summed the two copies' gradients. Expert parameters do the
// same over the expert-data group.
//
// The gathers are blocking here (MPI's collectives are): a GPU framework prefetches the next unit
// while the current one computes, which the cost model assumes unless told otherwise. The step
// keeps full-size parameter and gradient buffers as the gathers' target, so its measured memory is
// not ZeRO-3's.
#include "tedsim/runtime/optimizer/param_sync.hpp"

namespace tedsim::runtime {

void ParamSync::prepare() {
  const StepContext& c = c_;
  ParamStore& store = c.store;
  for (int b = 0; b < 2; ++b) {
    const int n = sync_group(b).size();
    const std::size_t total = store.params(b).size();
    const std::size_t owned = c.cfg.zero == 0 ? total : total / n;
    constexpr std::size_t kPage = 1024, kM = 256, kV = 512;  // floats: 4 KiB, 1 KiB, 2 KiB
    const std::size_t v_at = (kM + owned + kPage - 1) / kPage * kPage + kV;
    m_[b] = zeros(moments_[b], v_at + owned) + kM;
    v_[b] = moments_[b].data() + v_at;
    zero3_[b] = c.cfg.zero >= 3 && n > 1;
    if (!zero3_[b]) continue;
    std::size_t at = 0;
    for (const ParamStore::UnitRange& u : store.units()) {
      shard_at_[b].push_back(at);
      at += u.size[b] / n;
    }
    zeros(grad_shard_[b], std::max<std::size_t>(at, 1));
  }
}

void ParamSync::gather_unit(int u) {
  if (!zero3_[0] && !zero3_[1]) return;
  const double t0 = c_.clock();
  bool moved = false;
  for (int b = 0; b < 2; ++b) {
    const ParamStore::UnitRange& r = c_.store.units()[u];
    if (!zero3_[b] || r.size[b] == 0) continue;
    Communicator& comm = sync_group(b);
    const std::size_t count = r.size[b] / comm.size();
    float* base = c_.store.params(b).data() + r.offset[b];
    comm.all_gather(base + static_cast<std::size_t>(comm.rank()) * count, base, count, Dtype::fp32);
    comm.wait();
    moved = true;
  }
  if (moved) c_.charge(kDpGradSync, "zero3_param_allgather", t0, now_s());
}

bool ParamSync::reduce_into_shard(int b, int u) {
  const ParamStore::UnitRange& r = c_.store.units()[u];
  if (!zero3_[b] || r.size[b] == 0) return false;
  Communicator& comm = sync_group(b);
  const std::size_t count = r.size[b] / comm.size();
  float* reduced = ensure(scratch_, count);
  comm.reduce_scatter(c_.store.grads(b).data() + r.offset[b], reduced, count, Dtype::fp32);
  comm.wait();
  c_.add_into(count, reduced, grad_shard_[b].data() + shard_at_[b][u]);
  return true;
}

void ParamSync::reduce_unit_grads(int u) {
  if (!zero3_[0] && !zero3_[1]) return;
  sync_sequence_parallel_grads(u);
  const double t0 = c_.clock();
  bool moved = false;
  for (int b = 0; b < 2; ++b) {
    if (!reduce_into_shard(b, u)) continue;
    const ParamStore::UnitRange& r = c_.store.units()[u];
    // The next micro-batch accumulates afresh.
    c_.ops.memory().zero(c_.store.grads(b).data() + r.offset[b], r.size[b] * sizeof(float));
    moved = true;
  }
  if (moved) c_.charge(kDpGradSync, "zero3_grad_reducescatter", t0, now_s());
}

void ParamSync::zero3_sync_and_update(int b, const kernels::AdamConfig& ac) {
  Communicator& comm = sync_group(b);
  const int n = comm.size();
  const std::vector<ParamStore::UnitRange>& units = c_.store.units();
  const int L = c_.dims.layers;
  // The embedding's and the head's units: reduce-scattered now.
  double t0 = c_.clock();
  for (int u : {0, L + 1})
    if (u < static_cast<int>(units.size())) reduce_into_shard(b, u);
  c_.charge(kDpGradSync, b ? "grad_sync_expert" : "grad_sync_nonexpert", t0, now_s());
  t0 = c_.clock();
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::size_t count = units[u].size[b] / n;
    if (count == 0) continue;
    float* owned = c_.store.params(b).data() + units[u].offset[b] + static_cast<std::size_t>(comm.rank()) * count;
    const std::size_t at = shard_at_[b][u];
    c_.ops.adam_step(count, ac, adam_step_, owned, grad_shard_[b].data() + at, m_[b] + at, v_[b] + at);
  }
  c_.charge(kOptimizer, "adam_step", t0, c_.clock());
  grad_shard_[b].fill_zero();
}

void ParamSync::gather_all_units() {
  for (std::size_t u = 0; u < c_.store.units().size(); ++u) gather_unit(static_cast<int>(u));
}

}  // namespace tedsim::runtime
