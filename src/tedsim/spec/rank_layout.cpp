#include "tedsim/spec/rank_layout.hpp"

#include <string>

#include "tedsim/core/error.hpp"

namespace tedsim {

const char* to_string(RankLayout layout) {
  return layout == RankLayout::ted ? "ted" : "data_before_expert";
}

const char* to_string(GroupKind kind) {
  switch (kind) {
    case GroupKind::tensor: return "tensor";
    case GroupKind::expert: return "expert";
    case GroupKind::data: return "data";
    case GroupKind::expert_data: return "expert_data";
  }
  return "?";
}

TedLayout::TedLayout(int world, int tensor, int expert, RankLayout layout, bool expert_tp)
    : world_(world), t_(tensor), e_(expert), de_(0), layout_(layout), expert_tp_(expert_tp) {
  if (world <= 0 || tensor <= 0 || expert <= 0)
    throw InputError("rank layout: world, tensor and expert degrees must be positive");
  if (world % (tensor * expert) != 0)
    throw InputError("rank layout: tensor degree " + std::to_string(tensor) + " x expert degree " +
                     std::to_string(expert) + " does not divide " + std::to_string(world) + " ranks");
  de_ = world / (tensor * expert);
}

int TedLayout::rank_of(RankCoords c) const {
  if (layout_ == RankLayout::ted) return c.t_idx + t_ * (c.e_idx + e_ * c.d_idx);
  return c.t_idx + t_ * (c.d_idx + de_ * c.e_idx);
}

RankCoords TedLayout::coords_of(int rank) const {
  RankCoords c;
  c.t_idx = rank % t_;
  const int rest = rank / t_;
  if (layout_ == RankLayout::ted) {
    c.e_idx = rest % e_;
    c.d_idx = rest / e_;
  } else {
    c.d_idx = rest % de_;
    c.e_idx = rest / de_;
  }
  return c;
}

int TedLayout::group_size(GroupKind kind) const {
  switch (kind) {
    case GroupKind::tensor: return t_;
    case GroupKind::expert: return e_;
    case GroupKind::data: return e_ * de_;
    case GroupKind::expert_data: return expert_tp_ ? de_ : t_ * de_;
  }
  return 1;
}

int TedLayout::group_count(GroupKind kind) const { return world_ / group_size(kind); }

int TedLayout::group_index(GroupKind kind, int rank) const {
  const RankCoords c = coords_of(rank);
  switch (kind) {
    case GroupKind::tensor: return c.e_idx + e_ * c.d_idx;
    case GroupKind::expert: return c.t_idx + t_ * c.d_idx;
    case GroupKind::data: return c.t_idx;
    case GroupKind::expert_data: return expert_tp_ ? c.t_idx + t_ * c.e_idx : c.e_idx;
  }
  return 0;
}

std::vector<int> TedLayout::group_members(GroupKind kind, int rank) const {
  std::vector<int> members;
  const int index = group_index(kind, rank);
  for (int r = 0; r < world_; ++r)
    if (group_index(kind, r) == index) members.push_back(r);
  return members;
}

}  // namespace tedsim
