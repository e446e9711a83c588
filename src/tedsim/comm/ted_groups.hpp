#pragma once
// The four TED process groups of this rank (tensor, expert, data, expert_data) and its pipeline
// group (the same rank of every stage), made by splitting a world communicator along the shared
// TedLayout, so the runtime's groups are exactly the ones the cost model reasons about. Works for any backend: NCCL groups are split from NCCL worlds.
#include <array>
#include <memory>
#include <vector>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/spec/rank_layout.hpp"

namespace tedsim {

class TedGroups {
 public:
  // Collective over `world`: every rank calls it with the same layout. Throws InputError unless
  // layout.world() == world.size().
  TedGroups(Communicator& world, const TedLayout& layout);

  const TedLayout& layout() const { return layout_; }
  Communicator& group(GroupKind kind) const { return *groups_[index(kind)]; }
  Communicator& tensor() const { return group(GroupKind::tensor); }
  Communicator& expert() const { return group(GroupKind::expert); }
  Communicator& data() const { return group(GroupKind::data); }
  Communicator& expert_data() const { return group(GroupKind::expert_data); }
  Communicator& pipeline() const { return group(GroupKind::pipeline); }
  // World ranks of this rank's group of `kind`, in group-rank order.
  const std::vector<int>& members(GroupKind kind) const { return members_[index(kind)]; }

  // The groups inside a stage, which collectives run on (the pipeline group only exchanges p2p).
  static constexpr std::array<GroupKind, 4> kinds{GroupKind::tensor, GroupKind::expert,
                                                  GroupKind::data, GroupKind::expert_data};

 private:
  static std::size_t index(GroupKind kind) { return static_cast<std::size_t>(kind); }
  TedLayout layout_;
  std::array<std::vector<int>, 5> members_;
  std::array<std::unique_ptr<Communicator>, 5> groups_;
};

}  // namespace tedsim
