#include "tedsim/spec/rank_layout.hpp"

#include <string>

#include "tedsim/core/error.hpp"

namespace tedsim {

const char* to_string(RankLayout layout) {
  switch (layout) {
    case RankLayout::ted: return "ted";
    case RankLayout::data_before_expert: return "data_before_expert";
    case RankLayout::folded: return "folded";
  }
  return "?";
}

const char* to_string(GroupKind kind) {
  switch (kind) {
    case GroupKind::tensor: return "tensor";
    case GroupKind::expert: return "expert";
    case GroupKind::data: return "data";
    case GroupKind::expert_data: return "expert_data";
    case GroupKind::pipeline: return "pipeline";
    case GroupKind::context: return "context";
  }
  return "?";
}

TedLayout::TedLayout(int world, int tensor, int expert, RankLayout layout, bool expert_tp, int pipeline, int context)
    : world_(world), t_(tensor), e_(expert), de_(0), p_(pipeline), c_(context), layout_(layout), expert_tp_(expert_tp) {
  if (world <= 0 || tensor <= 0 || expert <= 0 || pipeline <= 0 || context <= 0)
    throw InputError("rank layout: world, tensor, expert, pipeline and context degrees must be positive");
  if (world % pipeline != 0)
    throw InputError("rank layout: pipeline degree " + std::to_string(pipeline) + " does not divide " +
                     std::to_string(world) + " ranks");
  const int stage = world / pipeline;
  if (layout == RankLayout::folded) {
    if (expert_tp) throw InputError("rank layout: the folded layout runs whole experts (no expert tensor parallelism)");
    if (stage % tensor != 0 || stage % expert != 0)
      throw InputError("rank layout: tensor degree " + std::to_string(tensor) + " and expert degree " +
                       std::to_string(expert) + " must each divide " + std::to_string(stage) + " ranks" +
                       (pipeline > 1 ? " of a pipeline stage" : ""));
  } else if (stage % (tensor * expert) != 0)
    throw InputError("rank layout: tensor degree " + std::to_string(tensor) + " x expert degree " +
                     std::to_string(expert) + " does not divide " + std::to_string(stage) + " ranks" +
                     (pipeline > 1 ? " of a pipeline stage" : ""));
  if (stage % (tensor * context) != 0)
    throw InputError("rank layout: tensor degree " + std::to_string(tensor) + " x context degree " +
                     std::to_string(context) + " does not divide " + std::to_string(stage) + " ranks" +
                     (pipeline > 1 ? " of a pipeline stage" : ""));
  de_ = layout == RankLayout::folded ? stage / expert : stage / (tensor * expert);
}

int TedLayout::rank_of(RankCoords c) const {
  // Folded: the attention's digits (d_idx counts the stage's tensor groups); the expert digits
  // follow from the rank (group_index).
  const int inner = layout_ == RankLayout::folded ? c.t_idx + t_ * c.d_idx
                    : layout_ == RankLayout::ted  ? c.t_idx + t_ * (c.e_idx + e_ * c.d_idx)
                                                  : c.t_idx + t_ * (c.d_idx + de_ * c.e_idx);
  return inner + stage_world() * c.p_idx;
}

RankCoords TedLayout::coords_of(int rank) const {
  RankCoords c;
  c.p_idx = rank / stage_world();
  rank %= stage_world();
  c.t_idx = rank % t_;
  const int rest = rank / t_;
  if (layout_ == RankLayout::folded) {
    c.d_idx = rest;
    c.e_idx = rank % e_;
  } else if (layout_ == RankLayout::ted) {
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
    case GroupKind::data: return layout_ == RankLayout::folded ? stage_world() / t_ : e_ * de_;
    case GroupKind::expert_data: return layout_ == RankLayout::folded ? de_ : expert_tp_ ? de_ : t_ * de_;
    case GroupKind::pipeline: return p_;
    case GroupKind::context: return c_;
  }
  return 1;
}

int TedLayout::group_count(GroupKind kind) const { return world_ / group_size(kind); }

int TedLayout::group_index(GroupKind kind, int rank) const {
  const RankCoords c = coords_of(rank);
  if (kind == GroupKind::pipeline) return rank % stage_world();
  if (layout_ == RankLayout::folded && kind != GroupKind::context) {
    const int inner = rank % stage_world(), per_stage = stage_world() / group_size(kind);
    int in_stage = 0;
    switch (kind) {
      case GroupKind::tensor: in_stage = inner / t_; break;
      case GroupKind::data: in_stage = inner % t_; break;
      case GroupKind::expert: in_stage = inner / e_; break;
      case GroupKind::expert_data: in_stage = inner % e_; break;
      case GroupKind::pipeline:
      case GroupKind::context: break;
    }
    return in_stage + per_stage * c.p_idx;
  }
  if (kind == GroupKind::context) {
    const int inner = rank % stage_world();
    return inner % t_ + t_ * (inner / t_ / c_) + (stage_world() / c_) * c.p_idx;
  }
  // Groups of the other kinds never leave their stage: number them stage by stage.
  const int per_stage = stage_world() / group_size(kind);
  return group_index_in_stage(kind, c) + per_stage * c.p_idx;
}

int TedLayout::group_index_in_stage(GroupKind kind, const RankCoords& c) const {
  switch (kind) {
    case GroupKind::tensor: return c.e_idx + e_ * c.d_idx;
    case GroupKind::expert: return c.t_idx + t_ * c.d_idx;
    case GroupKind::data: return c.t_idx;
    case GroupKind::expert_data: return expert_tp_ ? c.t_idx + t_ * c.e_idx : c.e_idx;
    case GroupKind::pipeline:
    case GroupKind::context: break;
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
