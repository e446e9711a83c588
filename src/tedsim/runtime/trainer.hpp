#pragma once
// The TED training step (DESIGN.md section 4) on the CPU or a CUDA device (step_ops.hpp): a GPT-style pre-LayerNorm MoE decoder
// (no biases in linear layers, no positional embedding: causal attention alone orders tokens) with
//  - vocabulary-parallel embedding / LM head (tied or not) and cross-entropy over the tensor group;
//  - Megatron tensor parallelism for attention and dense MLPs;
//  - MoE layers: replicated gate, top-k gating with capacity, dispatch, [DTD slice], all-to-all over
//    the expert group, [DTD all-gather], local experts (expert TP: fc1 columns / fc2 rows over t and
//    an all-reduce; without expert TP: whole experts on C/t tokens per TP rank), the mirror back;
//  - hand-written backward, activation checkpointing (recompute with collectives) and CAC (the
//    recompute replays the collectives' outputs stashed in the first forward); selective recompute
//    of the attention core (the softmax is recomputed from q, k, v in backward);
//  - gradient accumulation, gradient sync over the data / expert-data groups (ZeRO-0 all-reduce,
//    ZeRO-1/2 reduce-scatter + Adam on the owned shard + all-gather), Adam (tiled for experts);
//  - pipeline stages (pipeline outermost in the rank order): each stage holds its chunks' layers
//    (the first the embedding, the last the final norm, LM head and loss; tied embeddings keep a
//    copy on the last stage whose gradient is all-reduced with the first's), runs the 1F1B or
//    interleaved order of spec/pipeline_schedule.hpp (the cost model's), receives activations and
//    gradients blocking and sends them without blocking (runtime/pipeline/).
// The step is composed of modules (DESIGN.md section 8; Megatron-Core's split): layers/ (norm,
// attention, MLP, transformer layer, embedding, LM head), moe/ (router, token dispatchers,
// grouped experts, MoE layer), pipeline/ (stage, schedule, p2p), optimizer/ (gradient sync, ZeRO-3,
// SP's replicated gradients), sharing a StepContext (step_context.hpp).
// Every configuration initializes the same global model (params.hpp) and reads the same global
// samples in the same micro-batch groups, so losses and checksums compare across configurations.
//
// Capacity: C = max(ceil(k*f*T/E), c_min), rounded up to a multiple of t so the DTD split is even.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tedsim/comm/communicator.hpp"
#include "tedsim/runtime/params.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/parallel_config.hpp"

namespace tedsim::runtime {

// The cost model's Phase keys, in its order (the runtime does not link the cost model); all but
// its last two: host_launch (the runtime's kernels are launched from C++, whose host cost is in
// the kernels' own times) and cp_ring (the runtime runs no context parallelism).
inline constexpr int kPhaseCount = 9;
enum PhaseIndex { kCompute, kTpAllReduce, kTpAllGather, kEpAllToAll, kDpGradSync, kOptimizer, kOther, kPpBubble, kPpP2p };
const char* phase_key(int phase);  // "compute", "tp_allreduce", ...
using PhaseSeconds = std::array<double, kPhaseCount>;

struct KernelCensus;  // kernel_census.hpp

struct TrainerOptions {
  std::uint64_t seed = 1234;
  float lr = 1e-3f;
  float aux_loss_coef = 0.01f;
  float mtp_loss_scale = 0.1f;    // multi-token prediction's loss weight (Megatron-Core's mtp_loss_scaling_factor)
  float init_std = 0.02f;
  float gate_init_std = 0.0f;     // 0: init_std
  float ln_init_noise = 0.0f;     // > 0: randomize LayerNorm gammas/betas (gradient checks)
  std::string data_file;          // empty: synthetic tokens
  double data_noise = 0.1;
  // Elements per tiled expert Adam call: the cost model's tile (model/workload.hpp
  // kOptimizerTileElems), so that validate runs the launches the prediction prices.
  std::size_t optimizer_tile = std::size_t{16} << 20;
  bool track_routing = true;      // keep routing_signature() (copies routing to the host per MoE layer)
  // CPU step only: round GEMM operands to bf16 as the CUDA step does (the GPU tests' reference).
  bool cpu_bf16_gemm_operands = false;
  // Round each weight to bf16 once per step, not on every GEMM that reads it (weight_copies.hpp).
  // Off only to check that the copies change no bit.
  bool bf16_weight_copies = true;
  bool track_imbalance = false;   // measure the busiest expert's tokens over the mean per MoE layer
  // Dropless models: keep this rank's tokens routed to each expert, per MoE layer pass (forward,
  // recompute excluded), before any exchange: what calibration measures the routing's shares from.
  bool track_expert_loads = false;
  bool record_slices = false;     // keep each timed region of a step (StepStats::slices)
  // Counts every kernel the step runs (kernel_census.hpp); must outlive the Trainer.
  KernelCensus* census = nullptr;
};

// One timed region of a step on this rank: a collective, the optimizer, a piece of the head, named
// as the prediction's trace names the same operation. Seconds from the start of the step.
struct StepSlice {
  const char* name;  // one of step_slice_names()
  int phase;         // PhaseIndex
  double start_s, end_s;
};
// Every name a StepSlice can carry (the measured trace's vocabulary).
const std::vector<std::string>& step_slice_names();

struct StepStats {
  double loss = 0;        // global mean over micro-batches of CE + aux_coef * sum of MoE aux losses
  double ce_loss = 0;
  double aux_loss = 0;    // sum over MoE layers, mean over micro-batches
  double seconds = 0;     // this rank's wall time of the iteration
  PhaseSeconds phase{};   // exposed time per phase on this rank; sums to seconds
  std::vector<StepSlice> slices;  // with TrainerOptions::record_slices, in time order
};

struct Checksum {
  std::string kind;       // parameter kind: embedding, attn_qkv, ..., or "all"
  double weighted = 0;    // sum over global elements of w(index) * value (each element once)
  double abs = 0;         // sum of |value|, the scale for comparisons
};

// Throws RunError when the step cannot run on `backend` here (cuda without a CUDA build or device).
void require_step_backend(Backend backend);

class Trainer {
 public:
  // Collective over `world`: builds the TED groups. Throws InputError for invalid configurations.
  Trainer(Communicator& world, const ModelSpec& model, const ParallelConfig& config, const TrainerOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One iteration: grad_accum micro-batches forward/backward, gradient sync, Adam.
  StepStats step();

  // Tests: forward + backward of iteration `iteration`'s samples on this rank (grads zeroed first,
  // accumulated over micro-batches, not synchronized over data replicas, no optimizer; under
  // sequence parallelism the replicated parameters' gradients are the tensor group's sum, as the
  // backward leaves them). Returns this rank's loss share.
  double loss_and_grads(std::int64_t iteration);
  double loss_only(std::int64_t iteration);
  // Collective: the loss step() would report on iteration `iteration`'s samples, forward only,
  // summed over data replicas and stages; no gradient, no update.
  double global_loss(std::int64_t iteration);
  // Hash of every MoE routing decision of the last forward (detects routing flips); 0 without
  // TrainerOptions::track_routing.
  std::uint64_t routing_signature() const;
  // With TrainerOptions::track_imbalance: the busiest expert's tokens over the mean, one sample per
  // MoE layer pass (forward, recompute excluded) since construction, over the expert group.
  const std::vector<double>& imbalance_samples() const;
  // The same passes' busiest expert rank: its expert rows over the mean rank's (what sets the pace).
  const std::vector<double>& rank_load_samples() const;
  // With TrainerOptions::track_expert_loads: per MoE layer pass since construction, this rank's
  // tokens routed to each of the model's experts (in this rank's pass order, the same on every
  // rank of a data-parallel world).
  const std::vector<std::vector<std::int32_t>>& expert_load_samples() const;

  // Collective over the world: per-kind checksums of the global model, then "all".
  std::vector<Checksum> checksums();

  // The parameter store; its param()/grad() pointers are in the backend's memory (device
  // memory for cuda): host code reads them through the *_to_host accessors below.
  ParamStore& params();
  // Host copies of parameter / gradient `id` (any backend).
  std::vector<float> param_to_host(int id);
  std::vector<float> grad_to_host(int id);
  int capacity() const;                 // C per MoE layer per micro-batch (after rounding)
  std::int64_t iteration() const;       // iterations done
  std::string describe() const;         // data source, tokens, capacity

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tedsim::runtime
