#include "tedsim/sim/overlapped_pair.hpp"

#include <algorithm>

namespace tedsim {
namespace {

bool is_expert_all_to_all(const Op& op) {
  return op.is_collective && op.group == GroupKind::expert &&
         (op.collective == CollectiveOp::all_to_all || op.collective == CollectiveOp::all_to_all_v);
}

}  // namespace

PassNodes forward_nodes(const Block& forward) {
  PassNodes n;
  int a2a_seen = 0;
  for (int i = 0; i < forward.count; ++i) {
    const Op& op = forward.ops[i];
    if (op.phase == Phase::host_launch) {
      n.host += op.seconds;
      continue;
    }
    if (is_expert_all_to_all(op)) ++a2a_seen;
    if (a2a_seen == 0) {
      n.attn += op.seconds;
    } else if (a2a_seen == 1) {
      (is_expert_all_to_all(op) ? n.dispatch : n.mlp) += op.seconds;
    } else {
      n.combine += op.seconds;
      if (is_expert_all_to_all(op)) n.combine_a2a += op.seconds;
    }
  }
  return n;
}

PassNodes backward_nodes(const Block& recompute, const Block& backward) {
  PassNodes n;
  for (int i = 0; i < recompute.count; ++i) {
    const Op& op = recompute.ops[i];
    if (op.phase == Phase::host_launch)
      n.host += op.seconds;
    else
      ((op.module & kRecomputeMoeAct) ? n.mlp : n.attn) += op.seconds;
  }
  // Backward runs the forward's ops in reverse: the combine's tail and its all-to-all first.
  const bool moe = [&] {
    for (int i = 0; i < backward.count; ++i)
      if (is_expert_all_to_all(backward.ops[i])) return true;
    return false;
  }();
  int a2a_seen = 0;
  for (int i = 0; i < backward.count; ++i) {
    const Op& op = backward.ops[i];
    if (op.phase == Phase::host_launch) {
      n.host += op.seconds;
      continue;
    }
    const bool a2a = is_expert_all_to_all(op);
    if (!moe) {
      n.attn += op.seconds;
    } else if (a2a_seen == 0) {
      n.combine += op.seconds;
      if (a2a) {
        n.combine_a2a += op.seconds;
        a2a_seen = 1;
      }
    } else if (a2a_seen == 1) {
      if (a2a) {
        n.dispatch += op.seconds;
        a2a_seen = 2;
      } else {
        n.mlp += op.seconds;
      }
    } else {
      n.attn += op.seconds;
    }
  }
  return n;
}

MergedTime overlapped_step(double compute, double comm, double sm_fraction) {
  MergedTime t;
  const double f = std::clamp(sm_fraction, 0.0, 0.95);
  // Slowed while the communication runs, at full speed after it.
  double stretched = compute;
  if (compute > 0 && comm > 0) stretched = compute <= comm * (1.0 - f) ? compute / (1.0 - f) : compute + f * comm;
  t.seconds = std::max(stretched, comm);
  t.contention = stretched - compute;
  t.hidden_other = std::min(stretched, comm);  // split into hidden_a2a by the caller
  return t;
}

namespace {

// A step whose communication node holds `a2a` seconds of all-to-all out of `comm`.
MergedTime step(double compute, double comm, double a2a, double f) {
  MergedTime t = overlapped_step(compute, comm, f);
  const double hidden = t.hidden_other;
  t.hidden_a2a = comm > 0 ? hidden * (a2a / comm) : 0.0;
  t.hidden_other = hidden - t.hidden_a2a;
  return t;
}

}  // namespace

MergedTime merge_layers(const PassNodes& forward, const PassNodes& backward, double sm_fraction) {
  MergedTime t;
  t.add(step(forward.attn, backward.combine, backward.combine_a2a, sm_fraction));
  t.add(step(backward.mlp, forward.dispatch, forward.dispatch, sm_fraction));
  t.add(step(forward.mlp, backward.dispatch, backward.dispatch, sm_fraction));
  t.add(step(backward.attn, forward.combine, forward.combine_a2a, sm_fraction));
  t.seconds += forward.host + backward.host;
  return t;
}

}  // namespace tedsim
