#include "tedsim/model/flex_dispatch.hpp"

#include <algorithm>
#include <cmath>

namespace tedsim {
namespace {

// C(a, k) / C(b, k) for a <= b: the chance that k distinct draws from b all avoid b - a of them.
double choose_ratio(double a, double b, int k) {
  double r = 1.0;
  for (int i = 0; i < k; ++i) {
    if (a - i <= 0) return 0.0;
    r *= (a - i) / (b - i);
  }
  return r;
}

double choose(int n, int k) {
  if (k < 0 || k > n) return 0.0;
  return std::exp(std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0));
}

}  // namespace

double routing_miss_probability(const MoeSpec& moe, double members) {
  const double E = moe.experts;
  const int k = moe.top_k;
  if (members >= E) return 0.0;
  if (!moe.group_limited()) return choose_ratio(E - members, E, k);
  const int G = moe.groups, g = moe.topk_groups;
  const double per_group = E / G, pool = g * per_group;  // the chosen groups' experts
  if (members <= per_group) {
    const double chosen = double(g) / G;
    return (1.0 - chosen) + chosen * choose_ratio(pool - members, pool, k);
  }
  // A block of c whole groups: j of them chosen (hypergeometric), then none of the k in those j.
  const int c = std::max(1, int(std::lround(members / per_group)));
  double miss = 0.0;
  for (int j = 0; j <= std::min(c, g); ++j)
    miss += choose(c, j) * choose(G - c, g - j) / choose(G, g) * choose_ratio(pool - j * per_group, pool, k);
  return miss;
}

double expected_destinations(const MoeSpec& moe, int slots) {
  if (slots <= 1) return 1.0;
  return slots * (1.0 - routing_miss_probability(moe, double(moe.experts) / slots));
}

double flex_all_to_all_seconds(const Profile& profile, const SpanSet& set, const MoeSpec& moe, double pair_bytes) {
  double worst = 0.0;
  const double k = moe.top_k;
  for (int i = 0; i < set.count; ++i) {
    const GroupSpan& span = set.spans[i];
    if (span.ranks <= 1 || pair_bytes <= 0) continue;
    // Each token once per destination GPU: the NVLink leg inside a node, or the whole of it.
    const double gpu_bytes = pair_bytes * expected_destinations(moe, span.ranks) / k;
    double seconds = 0.0;
    if (span.nodes <= 1) {
      seconds = profile.collective_seconds(CollectiveOp::all_to_all, span, gpu_bytes);
    } else {
      // Once per destination node over the network, to the GPU of the same local index there:
      // an all-to-all among one GPU per node, every member of every group on a node sending at once.
      const int N = span.nodes, r = span.max_ranks_per_node;
      const double remote_nodes = expected_destinations(moe, N) * (N - 1.0) / N;
      GroupSpan network;
      network.ranks = N;
      network.nodes = N;
      network.max_ranks_per_node = 1;
      network.groups_per_node = span.groups_per_node * r;
      // An all-to-all buffer keeps 1/N at home: size it so that the rest is what crosses.
      const double rdma_bytes = pair_bytes * remote_nodes / k * N / (N - 1.0);
      const double rdma_s = profile.collective_seconds(CollectiveOp::all_to_all, network, rdma_bytes);
      GroupSpan node = span;
      node.ranks = r;
      node.nodes = 1;
      const double nvlink_s = r > 1 ? profile.collective_seconds(CollectiveOp::all_to_all, node, gpu_bytes) : 0.0;
      seconds = std::max(rdma_s, nvlink_s);
    }
    worst = std::max(worst, seconds);
  }
  return worst;
}

}  // namespace tedsim
