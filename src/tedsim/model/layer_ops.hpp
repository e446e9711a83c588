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
// Host calls (model/host_launch.hpp) of the framework's ops, as Megatron-Core 2edffadb (the pin of
// Megatron-Bridge v0.4.2) with Transformer Engine v2.14.1 issues them in eager mode, counted line
// by line: every call that launches a kernel, a collective or a device-to-host copy. Allocations
// from the caching allocator and event calls are not counted. Where an op of tedsim's stands for
// several of the framework's kernels, it carries their count:
// - a linear layer in FP8 quantizes its input in its own call (TE's quantizer) before its GEMM;
// - GroupedLinear (experts/TEGroupedMLP) issues one cuBLASLt GEMM per local expert from C++, each
//   with its own heuristic query (te_general_grouped_gemm -> multi_stream_cublas_gemm), plus its
//   output allocation and split; in FP8, split_quantize quantizes each expert's slice on its own;
inline constexpr double kGroupedLinearCallsPerExpert = 1.0;
inline constexpr std::int32_t kCudnnGroupedGemmTile = 256;  // fused_grouped_mlp's kernels' output tile
inline constexpr double kGroupedLinearCallsPerCall = 1.0;
// - the fused router after the gate GEMM: the fused top-k kernel, and the auxiliary loss's five
//   (scores, token counts, fused loss, scaling, tracker); the sigmoid router's sequence-level
//   auxiliary loss and expert-bias update make it eight (router.py, moe_utils.py);
inline constexpr double kSoftmaxRouterCalls = 6.0;
inline constexpr double kSigmoidRouterCalls = 8.0;
// - the alltoall dispatcher's preprocessing: 7 count kernels, the all-gather of the counts and 4
//   device-to-host copies, then the host blocks on them (token_dispatcher.py:471-592, :867-904);
//   its permutation is 4 Triton kernels, the all-to-all sends tokens and probabilities (2 calls),
//   each chunk sort 2 kernels, and the combine's unsort 3 (a transposed copy, then the sort);
inline constexpr double kAlltoallPreprocessCalls = 12.0;
inline constexpr double kAlltoallPermuteCalls = 4.0;
inline constexpr double kAlltoallDispatchCalls = 2.0;
inline constexpr double kChunkSortCalls = 2.0;
inline constexpr double kChunkUnsortCalls = 3.0;
// - HybridEP (the flex dispatcher): the routing map's all-gather, the preprocessing, permute
//   preprocessing and padding kernels, then a stream synchronisation because dropless training
//   gives it no token count (fused_a2a.py:403-405; hybrid_ep executor.cu:181-183); dispatch and
//   combine each fuse the permutation (2 kernels each).
inline constexpr double kFlexPreprocessCalls = 4.0;
// - after a token-count sync returns, the host runs the dispatcher's and GroupedLinear's Python
//   (the counts to lists, split sizes, allocations, the experts' tensor bookkeeping) before it
//   launches the next kernel, while the device's queue is empty. No line count reaches it: it is
//   fitted, in calls of the host's measured pace, to the one published profile of a dropless MoE
//   step (Megatron-Bridge's expert-overlap skill, SKILL.md:119-125 at 067f987df0: Qwen3-30B-A3B
//   on 16 DGX H100, HybridEP, 1.893 s of GPU idle per 24.71 s step over 64 micro-batches x 48 MoE
//   layers, less the 0.041 s the counted calls price: 0.603 ms a sync, 45 calls at 13.5 us).
//   Checked against a source not fitted to: NVIDIA's DeepSeek-V3 GB200 report (Megatron-LM
//   eb0783b6d3, section 3.1) estimates that removing the sync, and with it graphing the whole
//   model, gains "at least 10%" of its final step; at Grace's 37 us a call tedsim's whole host
//   wait for that step (published-results row "deepseek-v3 (no MTP)") is 0.67 s, 7.9% of the
//   measured 8.44 s: not larger than the report's bound.
inline constexpr double kResumeAfterSyncCalls = 45.0;
// - Megatron-Core's unfused RoPE on one tensor (the query or the key): the cos and sin tables
//   with their scaling and casts, then six kernels forward; seven backward (layer_ops.cpp).
inline constexpr double kUnfusedRopeForwardCalls = 12.0;
inline constexpr double kUnfusedRopeBackwardCalls = 7.0;
// - gpt-oss's clamped GLU in Megatron-Core: two clamps, the cat and the linear offset's device
//   tensor forward; backward each clamp's mask and select, and the halves' cat (moe_ops.cpp).
inline constexpr double kClampForwardCalls = 4.0;
inline constexpr double kClampBackwardCalls = 5.0;
// - the cuDNN fused attention call with its layout calls.
inline constexpr double kFusedAttentionCalls = 3.0;

class BlockBuilder {
 public:
  BlockBuilder(Block& block, const Profile& profile, const GroupSpans& spans, Dtype dtype)
      : block_(block), profile_(profile), spans_(spans), dtype_(dtype) {}
  void set_module(std::uint8_t module) { module_ = module; }
  // The CUDA-graph scope (CudaGraphScope bit) of the ops added from now on; 0: none.
  void set_graph_scope(std::uint8_t scope) { graph_scope_ = scope; }
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
  // The local experts' GEMMs [rows,k] x [k,n], one per expert, as one grouped op (Transformer
  // Engine's GroupedLinear: the experts' GEMMs and their quantization are launched one by one).
  void grouped_gemm(const char* name, std::int64_t rows, std::int64_t n, std::int64_t k, std::int64_t experts);
  // The fused grouped MLP's two grouped GEMMs (ParallelConfig::fused_grouped_mlp): each one kernel
  // for all local experts (device-side offsets). The first applies the GLU and quantizes the
  // second's input in its epilogue, and takes its own output gradient quantized by the second's
  // data-gradient epilogue (with the GLU's gradient); the second's input is not quantized again.
  // Its GEMMs are cuDNN frontend's grouped GEMM kernels, whose output tile is 256 x 256
  // (mma_tiler_mn's default in every python/cudnn/grouped_gemm/*/api.py at cudnn-frontend@3929da2,
  // which Transformer Engine's op fuser does not set): a width that is not a multiple of 256
  // (gpt-oss's 2880) computes the rest of its last tile too.
  void fused_grouped_mlp(std::int64_t rows, std::int64_t fc1_out, std::int64_t h, std::int64_t ffn, std::int64_t experts);
  // The last op added takes this many framework calls on the host (the kernels it stands for),
  // and with `sync` the host then waits for it to finish; `forward_only`: no backward twin.
  void host_calls_of_last(double calls, bool sync = false, bool forward_only = false);
  // The last op's backward, where it is not the usual mirror (Op::backward_bytes).
  void backward_of_last(double bytes, double host_calls);
  void host_calls_at(int index, double calls);  // the op at `index` (from a *_at method) takes `calls`
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
  // An op already priced (a mirrored backward's), as it is.
  void add(const Op& op) { block_.add(op); }
  int size() const { return block_.count; }
  std::string profile_description() const { return profile_.describe(); }
  double seconds_since(int first_op) const;  // the ops added from index first_op on
  // `seconds` of side-stream work overlaps the collectives at these op indices (-1: skipped).
  void hide_behind(double seconds, std::initializer_list<int> ops);

 private:
  Block& block_;
  const Profile& profile_;
  const GroupSpans& spans_;
  enum class Input : std::uint8_t { other, norm, unquantized, quantized };
  // grouped: the `batch` members are the local experts, each with its own weights (GemmShape::grouped).
  void add_gemm(const char* name, std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, Phase phase,
                Input input, bool grouped = false);
  Dtype dtype_;
  std::uint8_t module_ = 0;
  std::uint8_t graph_scope_ = 0;
  std::int32_t output_tile_ = 0;  // Op::output_tile of the GEMMs added from now on
};

struct LayerDims {
  std::int64_t T;        // tokens of the micro-batch per tensor group (b * s)
  std::int64_t T_local;  // tokens each tensor rank holds between blocks: T/t with SP, else T
  // s: the query rows of each sequence on this rank (s / cp); attn_batch: the attention core's
  // batch, b x local heads x cp, so that cp blocks of s/cp rows price the rank's share, 1/cp of
  // the whole causal core, at the rate of s/cp-long sequences (Megatron-Core's ring steps).
  std::int64_t h, s, b, heads_local, head_dim, qkv_out, ffn_local_dense, fc1_factor;
  std::int64_t cp = 1, attn_batch = 1;
  std::int64_t kv_width_local = 0;  // the keys' and values' elements per token that a CP ring sends
  std::int64_t shared_local;  // all shared experts' width per tensor rank (0: none)
  double B;  // activation bytes
  bool sp;
  bool hidden_dropout, attention_dropout;  // the model trains with them (their kernels run)
  // Multi-head latent attention (0 ranks without it): query/key and value head sizes, latents.
  bool mla;
  std::int64_t qk_head_dim, v_head_dim, q_lora, kv_lora, qk_rope;
  // Rotary position embedding: the query and key elements it rotates per token on this rank.
  std::int64_t rotary_elems_per_token;
  bool rope_unfused = false;  // Megatron-Core's unfused RoPE (ModelSpec::rope_unfused)
  std::int64_t qk_norm_elems_per_token = 0;  // the query and key elements a q/k norm reads (0: none)
  AttentionKernel core_attention;
  std::int64_t window = 0;  // this layer kind's sliding window (0: full causal)
  bool fp8_attention = false;  // the fused core in FP8 (ParallelConfig::fp8_attention)
};

LayerDims layer_dims(const ModelSpec& model, const StepShape& shape);

void attention_forward(BlockBuilder& x, const LayerDims& d);
void dense_mlp_forward(BlockBuilder& x, const LayerDims& d);
void moe_forward(BlockBuilder& x, const LayerDims& d, const StepShape& s, const ModelSpec& m, const ParallelConfig& c);
void embedding_forward(BlockBuilder& x, const LayerDims& d);
void head_forward(BlockBuilder& x, const LayerDims& d, const ModelSpec& m, const StepShape& s);
void head_backward(BlockBuilder& x, const LayerDims& d, const ModelSpec& m, const StepShape& s);
void embedding_backward(BlockBuilder& x, const LayerDims& d);
// A multi-token-prediction module's entry (Megatron-Core's MultiTokenPredictionLayer up to its
// transformer layer): the next tokens' embedding, the norms of it and of the hidden state, their
// concatenation projected back to h by eh_proj.
void mtp_entry_forward(BlockBuilder& x, const LayerDims& d, const StepShape& s);
// eh_proj alone (its SP input gather and GEMM), whose mirror gives the entry's backward GEMMs.
void mtp_projection_forward(BlockBuilder& x, const LayerDims& d, const StepShape& s);
// The entry's backward as the step runs it: the gradient's rows and column slice, eh_proj's
// gradients (`projection_backward`, mirrored), the input gradient's sum over the tensor group,
// the norms' and the embedding's backward.
void mtp_entry_backward(BlockBuilder& x, const LayerDims& d, const StepShape& s, const Block& projection_backward);

}  // namespace tedsim
