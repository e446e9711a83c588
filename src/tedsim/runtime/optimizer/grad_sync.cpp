// After the last micro-batch: the gradient sync over the data and expert-data groups (ZeRO-0
// all-reduce; ZeRO-1/2 reduce-scatter, Adam on the owned shard, all-gather of the parameters;
// ZeRO-3 in zero3.cpp) and Adam (tiled for experts: no fp32 upcast of the whole buffer at once).
#include "tedsim/runtime/optimizer/param_sync.hpp"

#include <algorithm>

namespace tedsim::runtime {

void ParamSync::sync_and_update() {
  ++adam_step_;
  kernels::AdamConfig ac;
  ac.lr = c_.opt.lr;
  for (int expert = 0; expert < 2; ++expert) {
    if (zero3_[expert]) {
      zero3_sync_and_update(expert, ac);
      continue;
    }
    Communicator& comm = sync_group(expert);
    Tensor& p = c_.store.params(expert);
    Tensor& g = c_.store.grads(expert);
    const int n = comm.size();
    const std::size_t total = p.size();
    const bool sharded = c_.cfg.zero >= 1 && n > 1;
    const std::size_t count = sharded ? total / n : total;
    const std::size_t off = sharded ? static_cast<std::size_t>(comm.rank()) * count : 0;
    double t0 = c_.clock();
    if (n > 1) {
      if (sharded)
        comm.reduce_scatter(g.data(), g.data() + off, count, Dtype::fp32);
      else
        comm.all_reduce(g.data(), g.data(), total, Dtype::fp32);
      comm.wait();
      c_.charge(kDpGradSync, expert ? "grad_sync_expert" : "grad_sync_nonexpert", t0, now_s());
    }
    t0 = c_.clock();
    const std::size_t tile =
        expert && c_.cfg.tiled_optimizer ? std::max<std::size_t>(c_.opt.optimizer_tile, 1) : count;
    for (std::size_t i = 0; i < count; i += tile) {
      const std::size_t len = std::min(tile, count - i);
      c_.ops.adam_step(len, ac, adam_step_, p.data() + off + i, g.data() + off + i, m_[expert] + i, v_[expert] + i);
    }
    c_.charge(kOptimizer, "adam_step", t0, c_.clock());
    if (sharded) {
      t0 = c_.clock();
      comm.all_gather(p.data() + off, p.data(), count, Dtype::fp32);
      comm.wait();
      c_.charge(kDpGradSync, "zero_param_allgather", t0, now_s());
    }
  }
}

}  // namespace tedsim::runtime
