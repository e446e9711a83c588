#include "tedsim/sim/arrival_skew.hpp"

#include <algorithm>
#include <stdexcept>

#include "tedsim/spec/rank_layout.hpp"

namespace tedsim {

ArrivalSkew::ArrivalSkew(const ParallelConfig& c, const Workload& w) : w_(w) {
  constexpr GroupKind kinds[4] = {GroupKind::tensor, GroupKind::expert, GroupKind::data, GroupKind::expert_data};
  // Asking once, at a segment inside any calibration's range, tells whether this profile makes
  // any group wait at all; the analytic profile never does, and then nothing else is built (the
  // search evaluates hundreds of thousands of configurations).
  for (int k = 0; k < 4; ++k) {
    span_[std::size_t(k)] = w.spans.of(kinds[k]).widest();
    multi_[std::size_t(k)] = span_[std::size_t(k)].ranks > 1;
    if (multi_[std::size_t(k)] && w.profile && w.profile->arrival_wait_seconds(span_[std::size_t(k)], 1e-3) > 0)
      active_ = true;
  }
  if (!active_) return;
  const TedLayout layout(c.gpus, c.tp, c.ep, c.layout, c.expert_tp, c.pp);
  std::array<std::vector<int>, 4> members;
  for (int k = 0; k < 4; ++k) members[std::size_t(k)] = layout.group_members(kinds[k], 0);
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) {
      const std::vector<int>&A = members[std::size_t(a)], &B = members[std::size_t(b)];
      contains_[std::size_t(a)][std::size_t(b)] = std::includes(A.begin(), A.end(), B.begin(), B.end());
    }
  for (const LayerBlocks* l : {&w.dense, &w.moe, &w.dense_window, &w.moe_window})
    for (const Block* b : {&l->forward, &l->recompute, &l->backward}) add_skeleton(*b);
  for (const Block* b : {&w.embedding_forward, &w.embedding_backward, &w.head_forward, &w.head_backward, &w.mtp_forward,
                         &w.mtp_backward})
    add_skeleton(*b);
}

const ArrivalSkew::Skeleton& ArrivalSkew::skeleton(const Block& block) const {
  for (const Skeleton& s : skeletons_)
    if (s.block == &block) return s;
  throw std::logic_error("tedsim: arrival skew asked about a block outside its workload");
}

void ArrivalSkew::add_skeleton(const Block& block) {
  Skeleton s;
  s.block = &block;
  double compute = 0;
  for (int i = 0; i < block.count; ++i) {
    const Op& op = block.ops[i];
    // The kinds calibration measures arrivals for (tensor to expert_data); the context ring runs
    // under the attention core and is not one of them.
    const bool measured_kind = std::size_t(op.group) < multi_.size();
    if (op.is_collective && measured_kind && multi_[std::size_t(op.group)] && op.seconds > 0) {
      s.meetings.push_back({op.group, op.phase, compute});
      compute = 0;
    }
    compute += op.seconds;  // the transfer itself runs on every rank: it adds to the next segment
  }
  s.tail = compute;
  skeletons_.push_back(std::move(s));
}

double ArrivalSkew::meet(GroupKind kind, GroupClock& clock) const {
  const std::size_t k = std::size_t(kind);
  if (!active_ || !multi_[k]) return 0;
  const double wait = w_.profile->arrival_wait_seconds(span_[k], clock.since[k]);
  for (std::size_t b = 0; b < 4; ++b)
    if (contains_[k][b]) clock.since[b] = 0;
  return wait;
}

double ArrivalSkew::walk(const Block& block, GroupClock& clock, PhaseTimes& waits) const {
  if (!active_) return 0;
  const Skeleton& s = skeleton(block);
  double total = 0;
  for (const Skeleton::Meeting& m : s.meetings) {
    advance(clock, m.compute_before);
    const double wait = meet(m.kind, clock);
    waits[int(m.phase)] += wait;
    total += wait;
  }
  advance(clock, s.tail);
  return total;
}

}  // namespace tedsim
