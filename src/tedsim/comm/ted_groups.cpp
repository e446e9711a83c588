#include "tedsim/comm/ted_groups.hpp"

#include <string>

#include "tedsim/core/error.hpp"

namespace tedsim {

TedGroups::TedGroups(Communicator& world, const TedLayout& layout) : layout_(layout) {
  if (layout.world() != world.size())
    throw InputError(world.where() + ": TED layout is for " + std::to_string(layout.world()) +
                     " ranks but the communicator has " + std::to_string(world.size()));
  // Same order on every rank: splits are collective over the world.
  for (GroupKind kind : {GroupKind::tensor, GroupKind::expert, GroupKind::data, GroupKind::expert_data,
                         GroupKind::pipeline}) {
    members_[index(kind)] = layout.group_members(kind, world.rank());
    groups_[index(kind)] = world.split(members_[index(kind)], to_string(kind));
  }
}

}  // namespace tedsim
