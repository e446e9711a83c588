#pragma once
// The TED step of one rank as the cost model sees it (DESIGN.md section 4): per layer kind, the
// ordered ops of the forward pass, the recompute pass and the backward pass, each op with its
// shape, FLOPs or bytes, and its time from a profile; the non-layer ops (embedding on the first
// pipeline stage; final norm, LM head and loss on the last); the gradients and parameters each
// layer holds for the data-parallel sync, ZeRO and the optimizer; the pipeline's p2p transfer.
// Which layers a stage holds is the stage map's business (spec/pipeline_layout.hpp); the timeline
// (sim/) sums these blocks over a stage's chunks.
#include <array>
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
  // FP8 GEMMs: bytes of Transformer Engine's quantization of the operand this GEMM adds (forward:
  // its input; backward, on the data-gradient GEMM: the output gradient), priced into `seconds`
  // as a memory-bound kernel just before it.
  double quantize_bytes = 0;
  KernelKind kernel = KernelKind::count;  // memory-bound kernels: which one
  std::uint8_t module = 0;                // RecomputeModule bits of the module it belongs to
  // The attention core priced as one measured kernel (Profile::attention_seconds): its shape is in
  // `gemm` (m = seq, n = value head dim, k = query-key head dim, batch = sequences x local heads).
  bool is_attention = false;
  AttentionKernel attention_kernel = AttentionKernel::unfused;
  std::int64_t attention_window = 0;  // sliding-window attention's window (0: full causal)
  bool attention_fp8 = false;         // the core in FP8 (--fp8-attention)
  // The host's side (model/host_launch.hpp): framework calls that launch this op's kernels, eager
  // (one per kernel: a quantized GEMM's quantization kernels and a grouped GEMM's experts count
  // apiece); the CUDA-graph scope that captures it (CudaGraphScope bit, 0: none); whether the host
  // then waits for it to finish (a device-to-host sync), and the calls' worth of host work after
  // the sync returns before the next launch; ops with no backward twin.
  double host_calls = 1;
  std::uint8_t graph_scope = 0;
  // Memory-bound kernels whose backward is not the usual two passes of the forward's bytes (read the
  // saved input and the incoming gradient, write a gradient): its own bytes and calls (< 0: the usual).
  double backward_bytes = -1;
  double backward_host_calls = -1;
  // GEMMs of a kernel with a fixed output tile (cuDNN's grouped GEMMs: kCudnnGroupedGemmTile): each
  // pass computes whole tiles, so it is priced at its output's rows and columns rounded up to the
  // tile (tiled_shape); its FLOPs stay the real ones. 0: priced as the profile has it.
  std::int32_t output_tile = 0;
  bool host_sync = false;
  double host_resume_calls = 0;
  bool forward_only = false;
  // FP8 linears: the data-gradient GEMM's incoming gradient is quantized just before it (false
  // where another kernel's epilogue already quantized it: the fused grouped MLP's first GEMM).
  bool dgrad_quantize = false;
  AttentionShape attention_shape() const {
    return AttentionShape{gemm.batch, gemm.m, gemm.k, gemm.n, attention_window, attention_fp8};
  }
};

// Ops that run back to back on the compute stream. Collectives inside a layer block the stream:
// the next op needs their output, so their time is exposed by construction.
struct Block {
  static constexpr int kMaxOps = 64;  // the longest, an MoE backward with SP, shared experts and MLA, has 50 (BlockCapacity test)
  Op ops[kMaxOps];
  int count = 0;
  double seconds = 0;
  double flops = 0;
  PhaseTimes phase_seconds{};
  void add(const Op& op);
  void clear();  // empty, without touching the op storage
  int count_collectives(CollectiveOp op, GroupKind group) const;
  double collective_bytes(CollectiveOp op, GroupKind group) const;  // sum over ops
};

struct LayerBlocks {
  Block forward, recompute, backward;  // recompute: every op under full recompute, the chosen
                                       // modules' under selective, none without
  double nonexpert_grad_elems = 0;     // this rank's gradients (= parameters) of the layer, by sync group
  double expert_grad_elems = 0;
  // ZeRO-3 gathers the layer's parameters before its forward and again before its backward, on the
  // data-parallel stream while the previous layer computes (prefetch); the blocks carry what stays
  // exposed, this the part hidden behind compute (busy on the data-parallel stream).
  double zero3_hidden_forward_s = 0, zero3_hidden_backward_s = 0;
  // ZeRO-3 without prefetch (ParallelConfig::zero3_prefetch): the backward block ends with the
  // blocking reduce-scatter of the layer's gradients, so the data-parallel stream has none of them.
  bool grads_synced_in_backward = false;
  void clear();
};

// Sizes of one micro-batch on one rank, resolved from model and configuration.
struct StepShape {
  // d: the ranks ZeRO shards the non-expert state over (the data group, with its context ranks).
  int t = 1, e = 1, d = 1, de = 1, b = 1, s = 1, ga = 1, p = 1, v = 1, cp = 1;
  bool sp = false;                  // sequence parallelism
  std::int64_t tokens = 0;          // T = b * s / cp, per tensor group
  std::int64_t capacity = 0;        // C, per expert, from the router's tokens (T/t with SP)
  std::int64_t capacity_a2a = 0;    // C' = C/t with DTD (t > 1), else C
  std::int64_t expert_rows = 0;     // tokens each local expert processes
  std::int64_t ffn_local = 0;       // expert FFN width per rank: F/t with expert TP, else F
  int local_experts = 0;            // E / e
  double load_factor = 1.0;         // dropless: the busiest rank's tokens over the mean (1: capacity mode)
  Dtype dtype = Dtype::bf16;
  int act_bytes = 2;
};

StepShape resolve_shape(const ModelSpec& model, const ParallelConfig& config);

// Dropless routing over `ep` expert ranks: the busiest rank's expert rows over the mean rank's,
// from the busiest expert's `imbalance` (its rows over the mean expert's). The busiest rank holds
// that expert, and the other experts share the rest of the tokens evenly. One rank (ep 1) holds
// all the tokens whatever their spread: 1.
double busiest_rank_load(int experts, int ep, double imbalance);
// The imbalance for which busiest_rank_load gives `rank_load` (at least 1): how validate feeds a
// measured rank load back into the prediction.
double imbalance_for_rank_load(int experts, int ep, double rank_load);

// `s` with its output's rows (per group) and columns rounded up to multiples of `tile` (0: `s`).
inline GemmShape tiled_shape(GemmShape s, std::int32_t tile) {
  if (tile > 0) {
    s.m = (s.m + tile - 1) / tile * tile;
    s.n = (s.n + tile - 1) / tile * tile;
  }
  return s;
}

struct Workload {
  StepShape shape;
  LayerBlocks dense, moe;
  // The same layers with sliding-window attention (built only for a model that windows some
  // layers shorter than the sequence).
  LayerBlocks dense_window, moe_window;
  const LayerBlocks& layer_blocks(const ModelSpec& model, int layer) const {
    const bool window = model.is_window_layer(layer) && windowed;
    if (model.is_moe_layer(layer)) return window ? moe_window : moe;
    return window ? dense_window : dense;
  }
  bool windowed = false;
  Block embedding_forward, embedding_backward;  // first stage
  Block head_forward, head_backward;            // last stage: final norm, LM head, loss
  // Multi-token prediction (ModelSpec::mtp_layers), with the head: each module's entry (the next
  // tokens' embedding lookup, two norms, eh_proj), then a layer of the last layer's kind and
  // head_forward / head_backward again.
  Block mtp_forward, mtp_backward;
  double mtp_grad_elems = 0;  // one module's entry: eh_proj and its norms, this rank's share
  // Every block above, for code that looks at all of the step's ops.
  std::array<const Block*, 12> blocks() const {
    return {&dense.forward,      &dense.recompute,    &dense.backward, &moe.forward,   &moe.recompute, &moe.backward,
            &embedding_forward, &embedding_backward, &head_forward,   &head_backward, &mtp_forward,   &mtp_backward};
  }
  double embedding_grad_elems = 0;     // first stage, synced last (final after the lookup's backward)
  double head_grad_elems = 0;          // last stage: final norm, plus the LM head (untied, or the
                                       // tied copy a pipeline keeps on its last stage)
  // Parameters of the whole model held by a rank of a one-stage run (what P = 1 holds).
  double nonexpert_params_rank = 0, expert_params_rank = 0;
  // Adam over the shards a rank owns of `nonexpert` + `expert` parameters (tiled expert step
  // included), and ZeRO-1/2's all-gather of the updated parameters.
  double optimizer_seconds(double nonexpert, double expert) const;
  double param_allgather_seconds(double nonexpert, double expert) const;
  // Cost of one gradient bucket of `elems` elements on the data / expert-data group.
  double nonexpert_sync_seconds(double elems) const;
  double expert_sync_seconds(double elems) const;
  // One activation [b, s, h] (s/t with SP) or its gradient across one pipeline boundary.
  double p2p_bytes = 0, p2p_seconds = 0;
  // Tied embeddings on P > 1 stages: the gradient all-reduce between the first and the last stage.
  double tied_embedding_sync_seconds = 0;
  double flops_per_microbatch = 0;     // a tensor rank over all layers, recompute included
  double model_flops_per_microbatch = 0;  // a tensor rank over all layers, without recompute

  // Filled by build_workload; used by the sync-cost functions above.
  const Profile* profile = nullptr;
  GroupSpans spans;
  int zero = 1;
  bool tiled_optimizer = true;
  int moment_bytes = 4;  // Adam's m and v, each
  int grad_bytes = 2;
  int param_bytes = 2;
};

// Gradient buckets: Megatron-LM's DDP default of 40M elements per bucket.
inline constexpr double kGradBucketElems = 40e6;
// Tiled expert optimizer: fp32 upcast of at most this many gradient elements at a time.
inline constexpr double kOptimizerTileElems = 16.0 * 1024 * 1024;

Workload build_workload(const ModelSpec& model, const ParallelConfig& config, const Profile& profile,
                        const GroupSpans& spans);
// Same, into `workload` (which may hold another configuration's): no 50 KB copy, for search.
void build_workload_into(Workload& workload, const ModelSpec& model, const ParallelConfig& config,
                         const Profile& profile, const GroupSpans& spans);

}  // namespace tedsim
