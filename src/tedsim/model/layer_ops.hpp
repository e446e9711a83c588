#pragma once
// The forward ops of one transformer layer as the cost model sees it (DESIGN.md section 4), built
// into Blocks with their profile times: attention, the dense MLP, the MoE block, and the embedding
// and LM head / loss. Backward and recompute are derived from these (workload.cpp).
//
// Sequence parallelism (Korthikanti et al. 2022) follows Megatron-Core: layernorms, dropout and
// residuals run on this rank's s/t tokens; each tensor-parallel block starts with an all-gather of
// [s, b, h] and ends with a reduce-scatter (the all-reduce's bytes, in two halves). The MoE block
// follows Megatron-Core's alltoall token dispatcher: the router runs on the rank's own s/t tokens,
// the expert all-to-all carries them (what DTD achieves without SP), and with expert tensor
// parallelism the received tokens are all-gathered over the tensor group before the experts and
// reduce-scattered after them.
#include <cstdint>
#include <initializer_list>
#include <string>

#include "tedsim/model/workload.hpp"

namespace tedsim {

// MoE layers' shared experts run beside the routed ones on the same tokens; with Megatron-Core's
// --moe-shared-expert-overlap they run on a side stream during the dispatch and combine
// all-to-alls, hiding up to their time of those.
//
// Appends ops with their profile times; collectives on groups of one rank vanish. Ops are tagged
// with the recompute module they belong to, so selective recompute can pick them.
// Seconds of Transformer Engine's quantization of `tensors` tensors of `elements` each (a grouped
// GEMM's experts: one per expert), each its own kernels: the maximum's pass (unless a norm fused
// it), the cast, the scalar kernels.
double fp8_quantize_seconds(const Profile& profile, const Fp8Quantize& q, double elements, double tensors, bool after_norm);

class BlockBuilder {
 public:
  BlockBuilder(Block& block, const Profile& profile, const GroupSpans& spans, Dtype dtype)
      : block_(block), profile_(profile), spans_(spans), dtype_(dtype) {}
  void set_module(std::uint8_t module) { module_ = module; }
  // A linear layer's GEMM [m,k] x [k,n]; in FP8 training its input is quantized first.
  void gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch = 1,
            Phase phase = Phase::compute);
  // Same, for a linear whose input comes from Transformer Engine's fused norm (LayerNormLinear:
  // Megatron-Core's qkv and dense fc1), which computes the FP8 scale's maximum on the way.
  void norm_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k);
  // A GEMM outside FP8's linear layers, whose input is not quantized: the unfused attention core's
  // batched products, the router's gate and the output layer (Megatron-Core runs neither under
  // Transformer Engine's FP8).
  void core_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch);
  void kernel(const char* name, KernelKind kind, double bytes, Phase phase = Phase::compute);
  // The attention core as one kernel priced from the profile's measured rates; false (nothing
  // added) where the profile has none for this kernel.
  bool attention_core(const char* name, AttentionKernel kernel, const AttentionShape& shape);
  void collective(const char* name, CollectiveOp which, GroupKind group, double bytes, Phase phase);
  // Same; returns the op's index, or -1 when it vanished (a group of one rank).
  int collective_at(const char* name, CollectiveOp which, GroupKind group, double bytes, Phase phase);
  // An expert all-to-all of the alltoall dispatcher's `pair_bytes`, sent by the given dispatcher
  // (flex: deduplicated per GPU and node, flex_dispatch.hpp); its index, or -1.
  int expert_all_to_all_at(const char* name, MoeDispatcher dispatcher, const MoeSpec& moe, double pair_bytes);
  int size() const { return block_.count; }
  std::string profile_description() const { return profile_.describe(); }
  double seconds_since(int first_op) const;  // the ops added from index first_op on
  // `seconds` of side-stream work overlaps the collectives at these op indices (-1: skipped).
  void hide_behind(double seconds, std::initializer_list<int> ops);

 private:
  Block& block_;
  const Profile& profile_;
  const GroupSpans& spans_;
  enum class Input : std::uint8_t { other, norm, unquantized };
  void add_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, Phase phase,
                Input input);
  Dtype dtype_;
  std::uint8_t module_ = 0;
};

struct LayerDims {
  std::int64_t T;        // tokens of the micro-batch per tensor group (b * s)
  std::int64_t T_local;  // tokens each tensor rank holds between blocks: T/t with SP, else T
  std::int64_t h, s, b, heads_local, head_dim, qkv_out, ffn_local_dense, fc1_factor;
  std::int64_t shared_local;  // all shared experts' width per tensor rank (0: none)
  double B;  // activation bytes
  bool sp;
  bool hidden_dropout, attention_dropout;  // the model trains with them (their kernels run)
  // Multi-head latent attention (0 ranks without it): query/key and value head sizes, latents.
  bool mla;
  std::int64_t qk_head_dim, v_head_dim, q_lora, kv_lora, qk_rope;
  // Rotary position embedding: the query and key elements it rotates per token on this rank.
  std::int64_t rotary_elems_per_token;
  AttentionKernel core_attention;
  std::int64_t window = 0;  // this layer kind's sliding window (0: full causal)
};

LayerDims layer_dims(const ModelSpec& model, const StepShape& shape);

void attention_forward(BlockBuilder& x, const LayerDims& d);
void dense_mlp_forward(BlockBuilder& x, const LayerDims& d);
void moe_forward(BlockBuilder& x, const LayerDims& d, const StepShape& s, const ModelSpec& m, const ParallelConfig& c);
void embedding_forward(BlockBuilder& x, const LayerDims& d);
void head_forward(BlockBuilder& x, const LayerDims& d, const ModelSpec& m, const StepShape& s);
void head_backward(BlockBuilder& x, const LayerDims& d, const ModelSpec& m, const StepShape& s);
void embedding_backward(BlockBuilder& x, const LayerDims& d);

}  // namespace tedsim
