#pragma once
// The TED rank layout, shared by the cost model (which groups cross node boundaries) and the
// runtime (which ranks form each communicator) so the two can never disagree.
//
// G ranks, tensor degree t, expert degree e, expert-data degree d_e = G/(t*e), data degree d = G/t.
// DeepSpeed's layout puts tensor innermost, then expert, then data:
//     rank = t_idx + t * (e_idx + e * d_idx)
// The "data before expert" layout swaps the expert and data digits:
//     rank = t_idx + t * (d_idx + d_e * e_idx)
// With P pipeline stages, the digits above number the G/P ranks of one stage and the stage is the
// outermost digit (Megatron's tp-ep-dp-pp order): rank = inner + (G/P) * p_idx. All groups above
// stay inside a stage; the pipeline group (same inner rank, one per stage) carries the p2p traffic.
#include <vector>

namespace tedsim {

// folded: Megatron-Core's MoE parallel folding with whole experts (expert TP 1): attention keeps
// the tensor and data digits above, while the experts number the stage's ranks on their own,
//     rank_in_stage = e_idx + e * edp_idx,
// so an expert group is e consecutive ranks that may span tensor ranks, and e need only divide the
// stage (not t * e). Cost model and calibration only; the training step runs the TED layouts.
enum class RankLayout { ted, data_before_expert, folded };
const char* to_string(RankLayout layout);

enum class GroupKind {
  tensor,       // same (e_idx, d_idx): t ranks
  expert,       // same (t_idx, d_idx): e ranks, the all-to-all group
  data,         // same t_idx: d = e * d_e ranks, gradient sync of non-expert parameters
  expert_data,  // ranks holding the same expert shard: d_e ranks (t * d_e without expert TP)
  pipeline,     // same rank inside its stage, one per stage: P ranks, neighbours exchange activations
  // Context parallelism (cost model only): c ranks at stride t that share a sequence, Megatron's
  // tp-cp-ep-dp order: same t_idx, consecutive in the index the rest of the rank counts. The data
  // group above then holds d x c ranks (Megatron-Core's data-parallel group with context), and
  // the expert digits fold the context ranks into their data dimension.
  context,
};
const char* to_string(GroupKind kind);

struct RankCoords {
  int t_idx = 0, e_idx = 0, d_idx = 0, p_idx = 0;
};

class TedLayout {
 public:
  // Throws InputError unless P divides G and t*e divides G/P.
  TedLayout(int world, int tensor, int expert, RankLayout layout, bool expert_tp = true, int pipeline = 1, int context = 1);

  int world() const { return world_; }
  int tensor() const { return t_; }
  int expert() const { return e_; }
  int pipeline() const { return p_; }
  int context() const { return c_; }
  int stage_world() const { return world_ / p_; }
  int data() const { return stage_world() / t_; }
  int expert_data() const { return de_; }

  int rank_of(RankCoords c) const;
  RankCoords coords_of(int rank) const;
  // Index of the group of `kind` that `rank` belongs to, in [0, group_count(kind)).
  int group_index(GroupKind kind, int rank) const;
  int group_count(GroupKind kind) const;
  int group_size(GroupKind kind) const;
  // Members of `rank`'s group of `kind`, in increasing rank order (the order communicators use).
  std::vector<int> group_members(GroupKind kind, int rank) const;

 private:
  int group_index_in_stage(GroupKind kind, const RankCoords& c) const;
  int world_, t_, e_, de_, p_, c_;
  RankLayout layout_;
  bool expert_tp_;
};

}  // namespace tedsim
