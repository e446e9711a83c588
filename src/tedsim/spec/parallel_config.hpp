#pragma once
// One point of the search space: how a model is split over G devices and how the step is run.
#include <cstdint>
#include <string>

#include "tedsim/core/units.hpp"
#include "tedsim/spec/cuda_graph_scope.hpp"
#include "tedsim/spec/rank_layout.hpp"
#include "tedsim/spec/recompute.hpp"

namespace tedsim {

struct ModelSpec;

// How MoE tokens reach their experts, after Megatron-Core's --moe-token-dispatcher-type:
// alltoall sends every token-expert pair (the permuted tokens); flex (DeepEP, HybridEP) sends a
// token once to each GPU, and once to each node, holding any of its experts (flex_dispatch.hpp).
enum class MoeDispatcher : std::uint8_t { alltoall, flex };
const char* to_string(MoeDispatcher dispatcher);
MoeDispatcher parse_moe_dispatcher(const std::string& text);  // "alltoall" or "flex"
Dtype parse_adam_moments(const std::string& text);  // "fp32" or "bf16"

struct ParallelConfig {
  int gpus = 1;
  int pp = 1;               // pipeline degree P (stages), outermost in the rank order
  int vpp = 1;              // model chunks per pipeline rank V (1: 1F1B; > 1: interleaved 1F1B)
  int tp = 1;               // tensor degree t
  // Context degree c (Megatron-Core's --context-parallel-size): each sequence's tokens split over c
  // ranks next to the tensor group (tp-cp-ep-dp-pp order), the attention exchanging keys and values
  // in a ring. Gradients sync over the data group with it (d x c ranks), and the experts fold it
  // into their data dimension, as Megatron-Core does.
  int cp = 1;
  int ep = 1;               // expert degree e
  int micro_batch = 1;      // sequences per data-parallel replica per micro-batch (b)
  int global_batch = 1;     // sequences per iteration (B)
  int seq_len = 0;          // 0: the model's
  bool dtd = false;         // duplicate token dropping around the expert all-to-alls
  bool cac = false;         // communication-aware activation checkpointing
  Recompute recompute = Recompute::full;  // what backward recomputes (full: activation checkpointing)
  std::uint8_t recompute_modules = kDefaultRecomputeModules;  // with Recompute::selective
  bool sequence_parallel = false;  // Korthikanti et al. 2022: norms, dropout, residuals on s/t tokens (t > 1)
  int zero = 1;             // ZeRO stage 0-3 (3: parameters sharded too, gathered per layer)
  // ZeRO-3: the next layer's parameters are gathered while this layer computes, as DeepSpeed
  // prefetches them; false for a run that gathers each layer's just before using it (tedsim's own
  // CPU training step, which validate compares with).
  bool zero3_prefetch = true;
  std::string pipeline_layout;  // Megatron-Core's --pipeline-model-parallel-layout; empty: even split
  bool expert_tp = true;    // experts split over the tensor group (else whole, C/t tokens per rank)
  bool tiled_optimizer = true;  // expert optimizer step in tiles (no fp32 upcast spike)
  bool shared_expert_overlap = false;  // Megatron-Core's --moe-shared-expert-overlap (side stream)
  MoeDispatcher moe_dispatcher = MoeDispatcher::alltoall;
  // Adam's m and v: fp32, or bf16 (Megatron-Core's --use-precision-aware-optimizer with
  // --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, as DeepSeek-V3's recipe runs); the master
  // weights stay fp32 either way.
  Dtype adam_moments = Dtype::fp32;
  // Parts of each layer captured as CUDA graphs (CudaGraphScope bits; 0: every kernel launched
  // eagerly by the framework, one host call each).
  std::uint8_t cuda_graph_scopes = 0;
  // The experts' MLP as Transformer Engine's fused ops (Megatron-Core's TE op fuser with cuDNN's
  // CuTe-DSL grouped kernels, Megatron-Bridge's cutedsl_fused_grouped_mlp): the first grouped GEMM
  // applies the GLU, the router's probabilities and the MXFP8 quantization of the second's input
  // in its epilogue, and in backward the second's data-gradient GEMM applies the GLU's gradient
  // and quantizes it for the first (TE 2.16, ops/fused/{forward,backward}_grouped_mlp.py).
  // Transformer Engine runs them for the MXFP8 recipe on Blackwell only.
  bool fused_grouped_mlp = false;
  // The fused attention core in FP8 (Megatron-Core's --fp8-dot-product-attention: cuDNN's FP8
  // kernel, priced from the topology's flash_fp8_* tables).
  bool fp8_attention = false;
  // Where the router's weights meet the expert outputs. Megatron-Core (the 2edffadb pin) multiplies
  // each token's probability into its expert's activation (weighted SwiGLU), so its combine keeps
  // nothing for backward; TED's step (validate's runtime, DeepSpeed) weights the outputs at the
  // combine and keeps the combine's input for the weights' gradient. validate sets it.
  bool moe_weights_at_combine = false;
  // Megatron-Core's --overlap-moe-expert-parallel-comm ("combined 1F1B"): in the steady state each
  // forward is merged with the next backward, layer by layer, so one micro-batch's expert
  // all-to-alls run on a communication stream while the other computes (sim/overlapped_pair.hpp).
  // The all-to-all kernels then hold `moe_a2a_overlap_sms` SMs the overlapped compute runs without:
  // Megatron-Core's --moe-deepep-num-sms default is 20 (transformer_config.py at 2edffadb);
  // Megatron-Bridge's HybridEP recipes set --moe-hybridep-num-sms 32.
  bool moe_a2a_overlap = false;
  int moe_a2a_overlap_sms = 20;
  RankLayout layout = RankLayout::ted;

  int stage_gpus() const { return gpus / pp; }  // ranks of one pipeline stage
  int dp() const { return stage_gpus() / (tp * cp); }  // data-parallel replicas (sequences in flight)
  int dp_with_cp() const { return stage_gpus() / tp; }  // the gradient-sync group: replicas x context ranks
  int dp_expert() const { return expert_tp ? stage_gpus() / (tp * ep) : stage_gpus() / ep; }
  bool full_recompute() const { return recompute == Recompute::full; }
  // Selective recompute of `module` (false under full recompute, which recomputes everything).
  bool recomputes(RecomputeModule module) const {
    return recompute == Recompute::selective && (recompute_modules & module) != 0;
  }
  int grad_accum() const { return global_batch / (micro_batch * dp()); }
  std::string describe() const;  // "p=2 t=2 e=4 d=16 b=1 ga=4 dtd cac ckpt zero1 etp ted"
};

// Throws InputError explaining the first rule `c` breaks for `m` (tp dividing heads, ep dividing
// experts, t*e dividing G, global batch divisible by b*d, CAC only with checkpointing, ...).
void validate_config(const ParallelConfig& c, const ModelSpec& m);
// Same rules, as a cheap predicate for search enumeration.
bool config_is_valid(const ParallelConfig& c, const ModelSpec& m);
// The first rule `c` breaks for `m`, in words ("ep 16 does not divide experts 4"); empty if none.
std::string config_violation(const ParallelConfig& c, const ModelSpec& m);

RankLayout parse_layout(const std::string& text);  // "ted" or "data_before_expert"

}  // namespace tedsim
