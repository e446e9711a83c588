#include "tedsim/runtime/step_checks.hpp"

#include <cmath>
#include <limits>
#include <map>

namespace tedsim::runtime {

std::string first_non_finite(StepOps& ops, ParamStore& store, const Tensor* const shards[2], double loss_share) {
  const bool loss_bad = !std::isfinite(loss_share);
  if (ops.backend() == Backend::cuda && !loss_bad) return "";
  const std::string also = loss_bad ? "; the loss is non-finite too" : "";
  std::vector<float> host;
  for (std::size_t id = 0; id < store.infos().size(); ++id) {
    const ParamInfo& p = store.info(static_cast<int>(id));
    host.resize(p.numel);
    ops.to_host(store.grad(static_cast<int>(id)), host.data(), p.numel);
    for (std::size_t i = 0; i < p.numel; ++i)
      if (!std::isfinite(host[i]))
        return "non-finite gradient of " + p.kind + " (" + p.name + ", element " + std::to_string(i) + also + ")";
  }
  for (int b = 0; b < 2; ++b) {
    if (!shards[b]) continue;
    host.resize(shards[b]->size());
    ops.to_host(shards[b]->data(), host.data(), host.size());
    for (std::size_t i = 0; i < host.size(); ++i)
      if (!std::isfinite(host[i]))
        return std::string("non-finite gradient in the owned ZeRO-3 shard of the ") + (b ? "expert" : "non-expert") +
               " parameters (element " + std::to_string(i) + also + ")";
  }
  if (loss_bad) return "non-finite loss (" + std::to_string(loss_share) + ") with finite gradients";
  return "";
}

std::vector<Checksum> global_checksums(StepOps& ops, ParamStore& store, Communicator& world) {
  const std::vector<std::string> kinds = {"embedding",  "lm_head",    "final_ln",   "ln",         "attn_qkv",
                                          "attn_out",   "mlp_fc1",    "mlp_fc2",    "gate",       "expert_fc1",
                                          "expert_fc2", "shared_fc1", "shared_fc2", "mtp_eh_proj"};
  std::map<std::string, std::pair<double, double>> by_kind;
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
