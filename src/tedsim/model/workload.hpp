#pragma once
// The TED step of one rank as the cost model sees it (DESIGN.md section 4): per layer kind, the
// ordered ops of the forward pass, the recompute pass and the backward pass, each op with its
// shape, FLOPs or bytes, and its time from a profile; the non-layer ops (embedding, LM head, loss);
// the gradients each layer produces for the data-parallel sync; the optimizer.
#include <cstdint>

#include "tedsim/model/group_spans.hpp"
#include "tedsim/model/phase.hpp"
#include "tedsim/profile/profile.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/parallel_config.hpp"

namespace tedsim {

struct TopologySpec;

struct Op {
  const char* name = "";
  Phase phase = Phase::compute;
  double seconds = 0;
  double flops = 0;          // GEMMs
  double bytes = 0;          // memory-bound kernels: bytes moved; collectives: nccl-tests bytes per rank
  bool is_collective = false;
  CollectiveOp collective = CollectiveOp::all_reduce;
  GroupKind group = GroupKind::tensor;
  GemmShape gemm{};                       // GEMMs: the shape, so backward can derive its GEMMs
  KernelKind kernel = KernelKind::count;  // memory-bound kernels: which one
};

// Ops that run back to back on the compute stream. Collectives inside a layer block the stream:
// the next op needs their output, so their time is exposed by construction.
struct Block {
  static constexpr int kMaxOps = 40;  // the MoE backward, the longest, has 31
  Op ops[kMaxOps];
  int count = 0;
  double seconds = 0;
  double flops = 0;
  PhaseTimes phase_seconds{};
  void add(const Op& op);
  int count_collectives(CollectiveOp op, GroupKind group) const;
  double collective_bytes(CollectiveOp op, GroupKind group) const;  // sum over ops
};

struct LayerBlocks {
  Block forward, recompute, backward;  // recompute is empty without checkpointing
  double nonexpert_grad_elems = 0;     // this rank's gradients of the layer, by sync group
  double expert_grad_elems = 0;
};

// Sizes of one micro-batch on one rank, resolved from model and configuration.
struct StepShape {
  int t = 1, e = 1, d = 1, de = 1, b = 1, s = 1, ga = 1;
  std::int64_t tokens = 0;          // T = b * s, per tensor group
  std::int64_t capacity = 0;        // C, per expert, from local tokens
  std::int64_t capacity_a2a = 0;    // C' = C/t with DTD (t > 1), else C
  std::int64_t expert_rows = 0;     // tokens each local expert processes
  std::int64_t ffn_local = 0;       // expert FFN width per rank: F/t with expert TP, else F
  int local_experts = 0;            // E / e
  Dtype dtype = Dtype::bf16;
  int act_bytes = 2;
};

StepShape resolve_shape(const ModelSpec& model, const ParallelConfig& config);

struct Workload {
  StepShape shape;
  LayerBlocks dense, moe;
  Block head_forward, head_backward;   // embedding, final norm, LM head, loss
  double embedding_grad_elems = 0;     // synced last (tied embeddings are final after lookup bwd)
  // Parameters held by this rank and the optimizer shard it owns.
  double nonexpert_params_rank = 0, expert_params_rank = 0;
  double optimizer_seconds = 0;        // Adam over owned shards (tiled expert step included)
  double param_allgather_seconds = 0;  // ZeRO >= 1: updated parameters back to every rank
  // Cost of one gradient bucket of `elems` elements on the data / expert-data group.
  double nonexpert_sync_seconds(double elems) const;
  double expert_sync_seconds(double elems) const;
  double flops_per_microbatch = 0;     // this rank, recompute included
  double model_flops_per_microbatch = 0;  // this rank, without recompute

  // Filled by build_workload; used by the sync-cost functions above.
  const Profile* profile = nullptr;
  GroupSpans spans;
  int zero = 1;
  int grad_bytes = 2;
};

// Gradient buckets: Megatron-LM's DDP default of 40M elements per bucket.
inline constexpr double kGradBucketElems = 40e6;
// Tiled expert optimizer: fp32 upcast of at most this many gradient elements at a time.
inline constexpr double kOptimizerTileElems = 16.0 * 1024 * 1024;

Workload build_workload(const ModelSpec& model, const ParallelConfig& config, const Profile& profile,
                        const GroupSpans& spans);

}  // namespace tedsim
