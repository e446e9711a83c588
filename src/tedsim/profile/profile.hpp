#pragma once
// The lookup interface between the cost model and whatever knows how fast this hardware is: an
// analytic profile (datasheet peaks x efficiency curves) or a measured one (tedsim calibrate).
// Every question the cost model asks is one of three: how long does this GEMM take, how long does
// this memory-bound kernel take on this many bytes, how long does this collective (or pipeline
// point-to-point transfer) take on a group of this shape at this size. Times are seconds.
#include <cstdint>
#include <string>

#include "tedsim/core/units.hpp"
#include "tedsim/spec/attention_kernel.hpp"

namespace tedsim {

struct ExpertShares;

// A (batched) GEMM C[m,n] = A[m,k] x B[k,n], `batch` independent products of that shape.
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t batch = 1;
  Dtype dtype = Dtype::bf16;
  // A grouped GEMM: each of the `batch` members multiplies its own weights (the local experts),
  // which the step last touched a layer ago. The attention core's batched products are not: the
  // kernel before them has just written both their operands. On a CPU the two differ by whether
  // the operands are still in cache, so a measured profile times and looks them up apart.
  bool grouped = false;
  double flops() const { return 2.0 * double(batch) * double(m) * double(n) * double(k); }
};

// The attention core of one layer on one rank (QK^T, the masked softmax, PV over every head of
// `batch_heads` = micro-batch x local heads), causal, as one measured kernel.
struct AttentionShape {
  std::int64_t batch_heads = 0, seq = 0, head_dim = 0, v_head_dim = 0;
  std::int64_t window = 0;  // sliding-window attention: each query sees its last `window` keys (0: all)
  bool fp8 = false;         // FP8 attention (cuDNN's, Megatron-Core's --fp8-dot-product-attention)
  // The query-key pairs a causal core computes, doubled: s^2 for full causal attention (the whole
  // square, as a GEMM count gives it; a fused causal kernel does half), twice the band's pairs
  // (each query's min(i + 1, w) keys) under a window shorter than the sequence.
  double square() const {
    const double s = double(seq), w = double(window);
    if (window <= 0 || window >= seq) return s * s;
    return 2.0 * (w * (w + 1.0) / 2.0 + (s - w) * w);
  }
  // FLOPs as a GEMM count gives them: QK^T and PV over square(), forward. The backward does twice
  // as many.
  double forward_flops() const { return 2.0 * double(batch_heads) * square() * double(head_dim + v_head_dim); }
};

// Memory-bound kernels of a TED step. Each is timed as a function of the bytes it moves.
enum class KernelKind : std::uint8_t {
  gating,        // softmax over experts, top-k, capacity positions, combine weights
  dispatch,      // gather tokens into [E, C, h]
  combine,       // weighted scatter back to [T, h]
  layernorm,
  activation,    // GeLU or SwiGLU
  softmax,       // attention softmax (scaled, causal mask)
  elementwise,   // dropout, residual add, bias
  adam,          // optimizer update over fp32 master weights and moments
  cross_entropy, // the loss over the vocabulary: row max, exp and sum, gradient (bytes: fp32 passes)
  count
};

// send_recv is the pipeline's exchange: every rank of a pipeline group sends `bytes` to the next
// stage and receives as much from the previous one, all neighbour pairs at once (Profile::p2p_seconds).
// all_to_all_v is dropless routing's exchange (MPI_Alltoallv; NCCL grouped send/recv): uneven,
// the busiest rank receiving more than the others; `bytes` is that rank's buffer, as the even
// all_to_all's is every rank's (collective_check.hpp says how calibration splits the rest).
enum class CollectiveOp : std::uint8_t { all_reduce, all_gather, reduce_scatter, all_to_all, send_recv, all_to_all_v, count };

// Where a process group lives. The slowest group of a kind sets the pace, so a group shape is the
// worst one of its kind under the rank layout.
struct GroupSpan {
  int ranks = 1;               // group size n
  int nodes = 1;               // distinct nodes its ranks sit on
  int max_ranks_per_node = 1;  // most members on one node
  int groups_per_node = 1;     // groups of this kind with members on one node (they share the NICs)
  bool crosses_islands = false;  // inside a node, spans GPUs not directly linked (Summit's triads)
};

constexpr const char* to_string(KernelKind kind) {
  switch (kind) {
    case KernelKind::gating: return "gating";
    case KernelKind::dispatch: return "dispatch";
    case KernelKind::combine: return "combine";
    case KernelKind::layernorm: return "layernorm";
    case KernelKind::activation: return "activation";
    case KernelKind::softmax: return "softmax";
    case KernelKind::elementwise: return "elementwise";
    case KernelKind::adam: return "adam";
    case KernelKind::cross_entropy: return "cross_entropy";
    case KernelKind::count: break;
  }
  return "?";
}

constexpr const char* to_string(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
    case CollectiveOp::all_to_all: return "all_to_all";
    case CollectiveOp::send_recv: return "send_recv";
    case CollectiveOp::all_to_all_v: return "all_to_all_v";
    case CollectiveOp::count: break;
  }
  return "?";
}

// Bytes per element of Transformer Engine's quantization of one GEMM operand before an FP8 GEMM
// (TransformerEngine v2.14.1, the version Megatron-Bridge v0.4.2 pins). Each linear layer
// quantizes its input in forward and its output gradient in backward; the weight gradient reuses
// the input's column-wise copy, and weights are quantized once per step (not priced: a few ms of
// a step). Per-tensor current scaling on Hopper reads the bf16 tensor for its maximum (2 B), then
// reads it again (2 B) and writes the FP8 copy and its transpose (1 + 1 B): 6 B
// (common/.../quantizer.cpp, 4 launches: zero amax, amax, scale, cast+transpose); after
// Transformer Engine's LayerNorm/RMSNorm the maximum comes fused into the norm, 4 B
// (normalization.cpp). MXFP8 reads 2 B and writes the row-wise and column-wise FP8 copies with
// one 1-byte scale per 32 values each, 4.0625 B, in one kernel (quantize_mxfp8.cuh), with or
// without a norm before it (the cuDNN norm that fuses it is off by default).
// Each quantized tensor is its own set of kernels: a grouped GEMM's experts quantize one by one
// (grouped_linear.py's split_quantize; a fused multi-tensor kernel exists for delayed scaling only).
struct Fp8Quantize {
  double amax_bytes = 0;  // per element: the pass that finds the tensor's maximum (current scaling)
  double cast_bytes = 0;  // per element: the cast writing both FP8 copies (and MXFP8's scales)
  int scalar_launches = 0;  // tiny kernels per tensor: zero the maximum, compute the scale
  bool priced() const { return cast_bytes > 0; }
  // Bytes per element of one tensor's quantization; after a fused norm the maximum comes with it.
  double bytes(bool after_norm) const { return (after_norm ? 0.0 : amax_bytes) + cast_bytes; }
};
inline Fp8Quantize fp8_quantize_bytes(Fp8Recipe recipe) {
  if (recipe == Fp8Recipe::mxfp8) return {0.0, 2.0 + 2.0 * (1.0 + 1.0 / 32.0), 0};
  return {2.0, 4.0, 2};
}

class Profile {
 public:
  virtual ~Profile() = default;
  virtual double gemm_seconds(const GemmShape& shape) const = 0;
  virtual double kernel_seconds(KernelKind kind, double bytes, Dtype dtype) const = 0;
  // `bytes` follows nccl-tests: the per-rank buffer size (output size for all-gather, input size
  // for reduce-scatter, the whole send buffer for all-to-all).
  virtual double collective_seconds(CollectiveOp op, const GroupSpan& span, double bytes) const = 0;
  // One point-to-point transfer of `bytes` between pipeline neighbours placed as `span` (2 ranks
  // on 1 or 2 nodes; groups_per_node pairs of the same boundary share the sender's NICs), while
  // every pair of that boundary sends at once.
  virtual double p2p_seconds(const GroupSpan& span, double bytes) const = 0;
  // The attention core as one kernel, forward or backward, from measured rates of that kernel on
  // this device; a negative value where the profile has none (the cost model then prices the
  // unfused core op by op, and cannot price a fused one).
  virtual double attention_seconds(AttentionKernel kernel, bool backward, const AttentionShape& shape) const {
    (void)kernel;
    (void)backward;
    (void)shape;
    return -1;
  }
  // The mean time a rank of a group shaped `span` waits inside a blocking collective for the
  // group's last member to arrive, when every member computed for `compute_since_sync_s` since
  // the group last synchronized: ranks doing the same work still arrive apart (jitter, the OS,
  // a shared core), and a rank's collective lasts from its own arrival. Measured by calibration
  // in a step-like loop; the analytic profile assumes ranks arrive together (0), as datasheet
  // bandwidths do.
  virtual double arrival_wait_seconds(const GroupSpan& span, double compute_since_sync_s) const {
    (void)span;
    (void)compute_since_sync_s;
    return 0;
  }
  // The quantization kernels around FP8 GEMMs on this device; none priced by default (a measured
  // profile's device has no FP8 of its own: it defers to its fallback topology).
  virtual Fp8Quantize fp8_quantize() const { return {}; }
  // Host seconds the training framework spends per call that launches device work (eager PyTorch
  // with Transformer Engine, on the machine's CPU); 0: the host never holds a stream back.
  virtual double host_op_seconds() const { return 0; }
  // Streaming multiprocessors of the device; 0 where the topology does not give them.
  virtual int device_sms() const { return 0; }
  // Dropless MoE: how the step's router spread its tokens over the experts, where calibration
  // measured it (spec/expert_shares.hpp); nullptr otherwise (the analytic profile).
  virtual const ExpertShares* expert_shares() const { return nullptr; }
  virtual std::string describe() const = 0;
};

}  // namespace tedsim
