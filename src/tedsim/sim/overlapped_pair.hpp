#pragma once
// Megatron-Core's expert all-to-all overlap (--overlap-moe-expert-parallel-comm, "combined 1F1B";
// megatron/core/models/common/model_chunk_schedule_plan.py at 2edffadb): a steady-state forward
// and the backward after it run as one step, layer by layer, the forward's layer i with the
// backward's layer L - 1 - i. Each layer splits into four nodes, two on the compute stream and two
// on a communication stream:
//
//   forward:  attn (norms, attention, router, dispatch preprocessing) | dispatch all-to-all |
//             mlp (the experts) | combine all-to-all and what follows it in the layer
//   backward: the same in reverse: combine | mlp | dispatch | attn
//
// and a merged layer pair runs them in four steps, each a compute node beside a communication node
// of the other micro-batch, both starting when the step before has ended on both streams:
//
//   compute:  F.attn    | B.mlp      | F.mlp       | B.attn
//   comm:     B.combine | F.dispatch | B.dispatch  | F.combine
//
// While an all-to-all kernel runs it holds SMs (DeepEP's and HybridEP's kernels take a configured
// number), and the compute beside it runs on the rest: a step's compute is slowed by the fraction
// `sm_fraction` for as long as the communication node runs. Dense layers have no all-to-alls; their
// nodes are all compute. The host's waits (model/host_launch.hpp) stay serial.
#include "tedsim/model/workload.hpp"

namespace tedsim {

// Seconds of one layer's pass, by node. Forward: attn, dispatch, mlp, combine in order. Backward
// (the layer's recompute and backward): combine, mlp, dispatch, attn in order.
struct PassNodes {
  double attn = 0, dispatch = 0, mlp = 0, combine = 0;
  double combine_a2a = 0;  // the all-to-all's seconds in `combine` (the rest: the layer's tail after it)
  double host = 0;         // host-launch waits, serial
  double total() const { return attn + dispatch + mlp + combine + host; }
};

PassNodes forward_nodes(const Block& forward);
// Recompute ops join the node whose backward needs them: the experts' activation the mlp node,
// everything else the attn node.
PassNodes backward_nodes(const Block& recompute, const Block& backward);

// One merged step: its seconds, the compute it added (SM contention) and the communication it hid.
struct MergedTime {
  double seconds = 0;
  double contention = 0;  // compute-stream time added by the all-to-alls' SMs
  double hidden_a2a = 0;  // expert all-to-all seconds run beside compute
  double hidden_other = 0;  // other communication-stream work (the combine node's tail) run beside compute
  void add(const MergedTime& o) {
    seconds += o.seconds;
    contention += o.contention;
    hidden_a2a += o.hidden_a2a;
    hidden_other += o.hidden_other;
  }
};

// A compute node of `compute` seconds beside a communication node of `comm` seconds, both starting
// together; the compute runs at 1 - sm_fraction of its speed while the communication lasts.
MergedTime overlapped_step(double compute, double comm, double sm_fraction);
// A forward layer's pass merged with a backward layer's pass.
MergedTime merge_layers(const PassNodes& forward, const PassNodes& backward, double sm_fraction);

}  // namespace tedsim
