#pragma once
// Where TED's process groups land on the cluster. Ranks fill nodes in order (rank r sits on node
// r / devices_per_node, the last node may be partly filled), so which groups straddle node or
// island boundaries follows from the rank layout. All groups of a kind run their collectives at
// once and the slowest sets the pace, so each kind keeps its distinct shapes and the cost model
// takes the slowest.
#include <array>

#include "tedsim/profile/profile.hpp"
#include "tedsim/spec/rank_layout.hpp"

namespace tedsim {

struct TopologySpec;

struct SpanSet {
  static constexpr int kMax = 4;
  std::array<GroupSpan, kMax> spans{};
  int count = 0;
  // Slowest time of a collective over the distinct shapes of this kind.
  double seconds(const Profile& profile, CollectiveOp op, double bytes) const;
  const GroupSpan& widest() const;  // most nodes: what tables show
};

struct GroupSpans {
  SpanSet tensor, expert, data, expert_data, context;
  // Pipeline neighbours: a pair of ranks of adjacent stages, the slowest boundary's placement (two
  // nodes if any pair of any boundary crosses nodes; groups_per_node: the pairs of one boundary
  // whose sender shares a node, and so its NICs). Every boundary is priced like the slowest.
  GroupSpan p2p;
  const SpanSet& of(GroupKind kind) const;
};

GroupSpans compute_group_spans(const TedLayout& layout, const TopologySpec& topology);

}  // namespace tedsim
