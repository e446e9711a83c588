#pragma once
// The wait at blocking collectives for a group's last member (Profile::arrival_wait_seconds),
// along one stage's compute stream. Ranks that compute the same ops still arrive apart, the more
// so the longer they computed since their group last met; a rank's collective lasts from its own
// arrival, so the wait is part of the collective's phase, as the step's timers (and any GPU
// profiler) show it. Each group kind keeps the compute since its ranks last met: a collective on
// a group meets every group contained in it (with t = 1 the expert all-to-all group can be the
// data group), and any other kind keeps counting. A model without layer collectives (data
// parallelism alone) reaches its gradient sync with a whole iteration of drift.
#include <array>
#include <vector>

#include "tedsim/model/workload.hpp"

namespace tedsim {

// Compute since the ranks of each group kind (GroupKind order) last met.
struct GroupClock {
  std::array<double, 4> since{};
  bool operator==(const GroupClock& o) const { return since == o.since; }
};

class ArrivalSkew {
 public:
  ArrivalSkew(const ParallelConfig& config, const Workload& workload);
  // The profile makes some group wait: otherwise every call below adds nothing (the analytic
  // profile, a single rank), and callers may skip them.
  bool active() const { return active_; }
  // Runs `block` from `clock`: adds its collectives' waits (per phase) to `waits`, advances the
  // clock, returns the total.
  double walk(const Block& block, GroupClock& clock, PhaseTimes& waits) const;
  // The wait of the group of `kind` meeting now (a gradient bucket, an all-gather after the
  // optimizer); then its ranks have met.
  double meet(GroupKind kind, GroupClock& clock) const;
  void advance(GroupClock& clock, double compute_s) const {
    for (double& s : clock.since) s += compute_s;
  }

 private:
  struct Skeleton {  // a block's blocking collectives in order, and the compute around them
    const Block* block = nullptr;
    struct Meeting {
      GroupKind kind;
      Phase phase;
      double compute_before;
    };
    std::vector<Meeting> meetings;
    double tail = 0;  // compute after the last
  };
  const Skeleton& skeleton(const Block& block) const;
  void add_skeleton(const Block& block);

  const Workload& w_;
  bool active_ = false;
  std::array<GroupSpan, 4> span_{};
  std::array<std::array<bool, 4>, 4> contains_{};  // contains_[a][b]: b's group is inside a's
  std::array<bool, 4> multi_{};                     // the kind's groups have more than one rank
  std::vector<Skeleton> skeletons_;  // of the workload's blocks
};

}  // namespace tedsim
