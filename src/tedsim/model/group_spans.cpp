#include "tedsim/model/group_spans.hpp"

#include <algorithm>
#include <vector>

#include "tedsim/spec/topology_spec.hpp"

namespace tedsim {
namespace {

bool same(const GroupSpan& a, const GroupSpan& b) {
  return a.ranks == b.ranks && a.nodes == b.nodes && a.max_ranks_per_node == b.max_ranks_per_node &&
         a.groups_per_node == b.groups_per_node && a.crosses_islands == b.crosses_islands;
}

// Orders spans from slowest-looking to fastest so that, if a kind had more distinct shapes than
// kMax, the ones dropped are the least likely to set the pace.
bool slower(const GroupSpan& a, const GroupSpan& b) {
  if (a.nodes != b.nodes) return a.nodes > b.nodes;
  if (a.groups_per_node != b.groups_per_node) return a.groups_per_node > b.groups_per_node;
  if (a.crosses_islands != b.crosses_islands) return a.crosses_islands;
  return a.max_ranks_per_node > b.max_ranks_per_node;
}

SpanSet spans_of(const TedLayout& layout, GroupKind kind, int per_node, int island) {
  const int world = layout.world();
  const int groups = layout.group_count(kind);
  struct Acc {
    int nodes = 0, last_node = -1, on_node = 0, max_on_node = 0, first_island = -1;
    bool crosses_islands = false;
  };
  std::vector<Acc> acc(groups);
  // Ranks in increasing order visit each group's members node by node.
  for (int r = 0; r < world; ++r) {
    Acc& a = acc[layout.group_index(kind, r)];
    const int node = r / per_node;
    const int isl = (r % per_node) / island;
    if (node != a.last_node) {
      ++a.nodes;
      a.last_node = node;
      a.on_node = 0;
    }
    a.max_on_node = std::max(a.max_on_node, ++a.on_node);
    if (a.first_island < 0) a.first_island = isl;
    if (isl != a.first_island) a.crosses_islands = true;
  }
  // Groups spanning nodes share each node's NICs: count them per node.
  const int node_count = (world + per_node - 1) / per_node;
  std::vector<int> sharing(node_count, 0);
  std::vector<int> seen_on(groups, -1);
  for (int r = 0; r < world; ++r) {
    const int g = layout.group_index(kind, r);
    const int node = r / per_node;
    if (acc[g].nodes > 1 && seen_on[g] != node) {
      seen_on[g] = node;
      ++sharing[node];
    }
  }
  std::vector<int> worst_sharing(groups, 1);
  for (int r = 0; r < world; ++r) {
    const int g = layout.group_index(kind, r);
    if (acc[g].nodes > 1) worst_sharing[g] = std::max(worst_sharing[g], sharing[r / per_node]);
  }
  std::vector<GroupSpan> distinct;
  for (int g = 0; g < groups; ++g) {
    GroupSpan s;
    s.ranks = layout.group_size(kind);
    s.nodes = acc[g].nodes;
    s.max_ranks_per_node = acc[g].max_on_node;
    s.groups_per_node = worst_sharing[g];
    // Island crossings only matter for groups inside one node; across nodes the NIC dominates.
    s.crosses_islands = s.nodes == 1 && acc[g].crosses_islands;
    if (std::none_of(distinct.begin(), distinct.end(), [&](const GroupSpan& d) { return same(d, s); }))
      distinct.push_back(s);
  }
  std::sort(distinct.begin(), distinct.end(), slower);
  SpanSet set;
  set.count = int(std::min<std::size_t>(distinct.size(), SpanSet::kMax));
  std::copy_n(distinct.begin(), set.count, set.spans.begin());
  return set;
}

GroupSpan p2p_span_of(const TedLayout& layout, int per_node) {
  GroupSpan worst;
  worst.ranks = 2;
  worst.max_ranks_per_node = 2;
  const int stage = layout.stage_world();
  for (int p = 0; p + 1 < layout.pipeline(); ++p) {
    std::vector<int> crossing_on_node;
    for (int r = 0; r < stage; ++r) {
      const int from = p * stage + r, to = from + stage;
      if (from / per_node == to / per_node) continue;
      const std::size_t node = std::size_t(from / per_node);
      if (crossing_on_node.size() <= node) crossing_on_node.resize(node + 1, 0);
      const int sharing = ++crossing_on_node[node];
      if (worst.nodes == 1 || sharing > worst.groups_per_node) {
        worst.nodes = 2;
        worst.max_ranks_per_node = 1;
        worst.groups_per_node = sharing;
      }
    }
  }
  return worst;
}

}  // namespace

double SpanSet::seconds(const Profile& profile, CollectiveOp op, double bytes) const {
  double worst = 0.0;
  for (int i = 0; i < count; ++i) worst = std::max(worst, profile.collective_seconds(op, spans[i], bytes));
  return worst;
}

const GroupSpan& SpanSet::widest() const { return spans[0]; }

const SpanSet& GroupSpans::of(GroupKind kind) const {
  switch (kind) {
    case GroupKind::tensor: return tensor;
    case GroupKind::expert: return expert;
    case GroupKind::data: return data;
    case GroupKind::expert_data: return expert_data;
    case GroupKind::context: return context;
    case GroupKind::pipeline: break;
  }
  return tensor;
}

GroupSpans compute_group_spans(const TedLayout& layout, const TopologySpec& topology) {
  const int per_node = topology.devices_per_node;
  const int island = topology.island_size > 0 ? topology.island_size : per_node;
  GroupSpans g;
  g.tensor = spans_of(layout, GroupKind::tensor, per_node, island);
  g.expert = spans_of(layout, GroupKind::expert, per_node, island);
  g.data = spans_of(layout, GroupKind::data, per_node, island);
  g.expert_data = spans_of(layout, GroupKind::expert_data, per_node, island);
  g.context = spans_of(layout, GroupKind::context, per_node, island);
  g.p2p = p2p_span_of(layout, per_node);
  return g;
}

}  // namespace tedsim
