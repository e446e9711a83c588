// After the last micro-batch: gradient sync over the data and expert-data groups (ZeRO 0/1; ZeRO-3
// in trainer_zero3.cpp),
// Adam (tiled for experts), and the global checksums the equivalence tests compare.
#include "tedsim/runtime/trainer_impl.hpp"

namespace tedsim::runtime {

void Trainer::Impl::sync_and_update() {
  ++adam_step;
  kernels::AdamConfig ac;
  ac.lr = opt.lr;
  for (int expert = 0; expert < 2; ++expert) {
    if (zero3[expert]) {
      zero3_sync_and_update(expert, ac);
      continue;
    }
    Communicator& comm = expert ? *edp : *dp;
    Tensor& p = store.params(expert);
    Tensor& g = store.grads(expert);
    Tensor& m = expert ? m_ex : m_ne;
    Tensor& v = expert ? v_ex : v_ne;
    const int n = comm.size();
    const std::size_t total = p.size();
    const bool sharded = cfg.zero >= 1 && n > 1;
    const std::size_t count = sharded ? total / n : total;
    const std::size_t off = sharded ? static_cast<std::size_t>(comm.rank()) * count : 0;
    double t0 = clock();
    if (n > 1) {
      if (sharded)
        comm.reduce_scatter(g.data(), g.data() + off, count, Dtype::fp32);
      else
        comm.all_reduce(g.data(), g.data(), total, Dtype::fp32);
      comm.wait();
      charge(kDpGradSync, expert ? "grad_sync_expert" : "grad_sync_nonexpert", t0, now_s());
    }
    t0 = clock();
    const std::size_t tile = expert && cfg.tiled_optimizer ? std::max<std::size_t>(opt.optimizer_tile, 1) : count;
    for (std::size_t i = 0; i < count; i += tile) {
      const std::size_t len = std::min(tile, count - i);
      ops.adam_step(len, ac, adam_step, p.data() + off + i, g.data() + off + i, m.data() + i, v.data() + i);
    }
    charge(kOptimizer, "adam_step", t0, clock());
    if (sharded) {
      t0 = clock();
      comm.all_gather(p.data() + off, p.data(), count, Dtype::fp32);
      comm.wait();
      charge(kDpGradSync, "zero_param_allgather", t0, now_s());
    }
  }
}

std::vector<Checksum> Trainer::Impl::checksums() {
  gather_all_units();  // ZeRO-3: each rank holds only its shards up to date
  std::map<std::string, std::pair<double, double>> by_kind;
  std::vector<std::string> kinds = {"embedding", "lm_head",  "final_ln",   "ln",        "attn_qkv", "attn_out",
                                    "mlp_fc1",   "mlp_fc2",  "gate",       "expert_fc1", "expert_fc2"};
  for (const auto& k : kinds) by_kind[k] = {0, 0};
  std::vector<float> w;  // host copy of one parameter
  for (std::size_t id = 0; id < store.infos().size(); ++id) {
    const ParamInfo& p = store.info(static_cast<int>(id));
    if (!p.primary) continue;
    w.resize(p.numel);
    ops.to_host(store.param(static_cast<int>(id)), w.data(), p.numel);
    double sw = 0, sa = 0;
    for (std::size_t i = 0; i < p.numel; ++i) {
      const std::uint64_t hsh = mix64(static_cast<std::uint64_t>(p.tensor_id) * 1000003ULL + p.slice.global_index(i));
      sw += (1.0 + static_cast<double>(hsh & 0xff) / 256.0) * w[i];
      sa += std::fabs(w[i]);
    }
    by_kind[p.kind].first += sw;
    by_kind[p.kind].second += sa;
  }
  // Exact double sums over the world through host_max: each rank fills its own slots.
  const int n = world.size(), K = static_cast<int>(kinds.size());
  std::vector<double> all(static_cast<std::size_t>(n) * K * 2, -std::numeric_limits<double>::max());
  for (int i = 0; i < K; ++i) {
    all[(static_cast<std::size_t>(world.rank()) * K + i) * 2] = by_kind[kinds[i]].first;
    all[(static_cast<std::size_t>(world.rank()) * K + i) * 2 + 1] = by_kind[kinds[i]].second;
  }
  world.host_max(all);
  std::vector<Checksum> out;
  Checksum total{"all", 0, 0};
  for (int i = 0; i < K; ++i) {
    Checksum c{kinds[i], 0, 0};
    for (int r = 0; r < n; ++r) {
      c.weighted += all[(static_cast<std::size_t>(r) * K + i) * 2];
      c.abs += all[(static_cast<std::size_t>(r) * K + i) * 2 + 1];
    }
    total.weighted += c.weighted;
    total.abs += c.abs;
    out.push_back(c);
  }
  out.push_back(total);
  return out;
}

}  // namespace tedsim::runtime
