#pragma once
// The parameters' synchronization and update after (and, for ZeRO-3, during) the micro-batches:
// the gradient sync over the data group (non-expert parameters) and the expert-data group (expert
// parameters), ZeRO 0-3, Adam on the owned shards (tiled for experts), and under sequence
// parallelism the sum over the tensor group of the gradients of parameters every tensor rank
// holds whole.
#include "tedsim/kernels/cpu/adam.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

class ParamSync {
 public:
  explicit ParamSync(StepContext& c) : c_(c) {}
  // Once the store is finalized: Adam's state for the owned shards, ZeRO-3's shard layout.
  void prepare();

  // ZeRO-3 (zero3.cpp): all-gathers unit u's parameters from their owners (before its forward,
  // its recompute and its backward, as DeepSpeed stage 3 does); a no-op otherwise.
  void gather_unit(int u);
  // ZeRO-3, after a layer's backward, every micro-batch: its gradients reduce-scattered into the
  // owned shard (SP's replicated ones summed over the tensor group first), the full ones zeroed.
  void reduce_unit_grads(int u);
  // Every unit gathered (checksums read whole parameters).
  void gather_all_units();
  // ZeRO-3's owned gradient shard of buffer b (0 non-expert, 1 expert); empty when not sharded.
  const Tensor* owned_grad_shard(int b) const { return zero3_[b] ? &grad_shard_[b] : nullptr; }

  // SP (sequence_parallel_grads.cpp): the replicated parameters' gradients summed over the tensor
  // group; only_unit -1: every parameter but ZeRO-3's layer units' (those are summed per layer).
  void sync_sequence_parallel_grads(int only_unit = -1);

  // The step's end (grad_sync.cpp): gradient sync and Adam on every buffer.
  void sync_and_update();

 private:
  Communicator& sync_group(int buffer) { return buffer ? *c_.edp : *c_.dp; }
  // Unit u's gradients in buffer b reduce-scattered and added to the owned shard; false where
  // buffer b is not sharded or the unit has none of its parameters.
  bool reduce_into_shard(int b, int u);
  void zero3_sync_and_update(int b, const kernels::AdamConfig& ac);

  StepContext& c_;
  // Adam's moments of the owned shards, by buffer: m and v in one allocation, m 1 KiB past its
  // start and v 2 KiB past a page boundary after m, so the four streams Adam reads (weights,
  // gradients, m, v) sit at different offsets within their pages. At one offset they contend for
  // the same cache sets: a 235 MB Adam ran 2.6-4.5 GB/s, a different rate in each process, against
  // a steady 11-12 GB/s so staggered (the 2-core EPYC VM; t1-e1-d1's optimizer once measured 55 ms
  // against its usual 16).
  Tensor moments_[2];
  float* m_[2] = {nullptr, nullptr};
  float* v_[2] = {nullptr, nullptr};
  int adam_step_ = 0;
  // ZeRO-3, per buffer where its group has more than one rank: the owned shards' gradients,
  // accumulated unit after unit in the order of m and v (unit u's at shard_at_[b][u]).
  bool zero3_[2] = {false, false};
  Tensor grad_shard_[2], scratch_;
  std::vector<std::size_t> shard_at_[2];
};

}  // namespace tedsim::runtime
