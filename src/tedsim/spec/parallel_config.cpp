#include "tedsim/spec/parallel_config.hpp"

#include <cstdint>

#include "tedsim/core/error.hpp"
#include "tedsim/spec/model_spec.hpp"
#include "tedsim/spec/pipeline_layout.hpp"

namespace tedsim {
namespace {

// Returns the first broken rule, or an empty string. One function serves both the error path and
// the search predicate so the two can never disagree.
std::string first_violation(const ParallelConfig& c, const ModelSpec& m) {
  auto s = [](long long x) { return std::to_string(x); };
  if (c.gpus <= 0) return "gpus must be positive, got " + s(c.gpus);
  if (c.pp <= 0) return "pp must be positive, got " + s(c.pp);
  if (c.vpp <= 0) return "vpp must be positive, got " + s(c.vpp);
  if (c.tp <= 0) return "tp must be positive, got " + s(c.tp);
  if (c.ep <= 0) return "ep must be positive, got " + s(c.ep);
  if (c.cp <= 0) return "cp must be positive, got " + s(c.cp);
  if (c.micro_batch <= 0) return "micro-batch must be positive, got " + s(c.micro_batch);
  if (c.global_batch <= 0) return "global batch must be positive, got " + s(c.global_batch);
  if (c.seq_len < 0) return "sequence length must be positive, got " + s(c.seq_len);
  if (c.zero < 0 || c.zero > 3) return "zero stage must be 0, 1, 2 or 3, got " + s(c.zero);
  if (c.gpus % c.pp != 0) return "pp " + s(c.pp) + " does not divide gpus " + s(c.gpus);
  if (c.vpp > 1 && c.pp == 1) return "vpp " + s(c.vpp) + " needs pipeline parallelism (pp > 1)";
  if (c.pipeline_layout.empty() && m.layers < c.pp * c.vpp)
    return "pp x vpp = " + s(c.pp * c.vpp) + " exceeds the model's " + s(m.layers) + " layers";
  if (!c.pipeline_layout.empty()) {
    const std::string why = pipeline_layout_violation(c.pipeline_layout, m.layers, c.pp, c.vpp, m.mtp_layers);
    if (!why.empty()) return why;
  }
  if (c.sequence_parallel && c.tp == 1) return "sequence parallelism needs tp > 1";
  if (c.sequence_parallel && c.dtd)
    return "duplicate token dropping (dtd) with sequence parallelism: SP already splits the tokens over the "
           "tensor group before the router (drop --dtd)";
  if (c.recompute == Recompute::selective && c.recompute_modules == 0) return "selective recompute needs at least one module";
  if (c.recomputes(kRecomputeMlaUpProj) && !m.is_mla())
    return "recompute module mla_up_proj needs multi-latent attention (Megatron-Core refuses it too)";
  if (m.heads % c.tp != 0) return "tp " + s(c.tp) + " does not divide heads " + s(m.heads);
  if (m.kv_heads % c.tp != 0) return "tp " + s(c.tp) + " does not divide kv_heads " + s(m.kv_heads);
  if (m.hidden % c.tp != 0) return "tp " + s(c.tp) + " does not divide hidden " + s(m.hidden);
  if (m.ffn % c.tp != 0) return "tp " + s(c.tp) + " does not divide ffn " + s(m.ffn);
  if (m.vocab % c.tp != 0) return "tp " + s(c.tp) + " does not divide vocab " + s(m.vocab);
  if (m.is_moe() && c.expert_tp && m.expert_ffn() % c.tp != 0)
    return "tp " + s(c.tp) + " does not divide the expert width " + s(m.expert_ffn()) + " (expert TP splits it; try --no-expert-tp)";
  if (m.is_moe() && m.shared_width() % c.tp != 0)
    return "tp " + s(c.tp) + " does not divide the shared experts' width " + s(m.shared_width());
  if (!m.is_moe() && c.ep != 1) return "ep " + s(c.ep) + " needs a MoE model (this one is dense)";
  if (m.is_moe() && m.moe.experts % c.ep != 0) return "ep " + s(c.ep) + " does not divide experts " + s(m.moe.experts);
  if (c.cp > 1) {
    const int seq = c.seq_len > 0 ? c.seq_len : m.seq_len;
    // Megatron-Core splits each sequence into 2c chunks, rank i taking chunks i and 2c-1-i so that
    // every rank has the same share of the causal mask.
    if (seq % (2 * c.cp) != 0)
      return "cp " + s(c.cp) + " needs the sequence length (" + s(seq) + ") divisible by 2 x cp = " + s(2 * c.cp) +
             " (Megatron-Core's load-balanced split)";
    if (c.stage_gpus() % (c.tp * c.cp) != 0)
      return "tp x cp = " + s(c.tp * c.cp) + " does not divide the " + s(c.stage_gpus()) + " gpus of a stage";
    if (m.sliding_window > 0) return "context parallelism with sliding-window attention is not modelled";
    // Megatron-Core runs it inside Transformer Engine's attention only (its local core asserts cp 1).
    if (m.core_attention != AttentionKernel::flash)
      return "context parallelism needs the fused attention core (--attention-kernel flash): Megatron-Core runs it in "
             "Transformer Engine's attention only";
  }
  if (c.layout == RankLayout::folded) {
    // Megatron-Core's MoE parallel folding with whole experts: the experts' own grid over the stage.
    if (!m.is_moe()) return "the folded layout places experts: it needs a MoE model";
    if (c.expert_tp) return "the folded layout runs whole experts (expert TP 1): add --no-expert-tp";
    if (c.tp > 1 && !c.sequence_parallel)
      return "the folded layout with tp > 1 needs --sequence-parallel (Megatron-Core runs MoE with tensor parallelism only "
             "with it)";
    if (c.stage_gpus() % c.ep != 0)
      return "ep " + s(c.ep) + " does not divide the " + s(c.stage_gpus()) + " gpus of a stage";
  } else if (c.stage_gpus() % (c.tp * c.ep) != 0)
    return "tp x ep = " + s(c.tp * c.ep) + " does not divide the " + s(c.stage_gpus()) + " gpus of a stage" +
           (c.pp > 1 ? " (gpus " + s(c.gpus) + " / pp " + s(c.pp) + ")" : std::string());
  // In 64 bits: a micro-batch near INT_MAX times the data degree must not overflow.
  if (std::int64_t(c.global_batch) % (std::int64_t(c.micro_batch) * c.dp()) != 0)
    return "global batch " + s(c.global_batch) + " is not a multiple of micro-batch x data degree = " +
           s(c.micro_batch) + " x " + s(c.dp());
  // Megatron's interleaved schedule runs micro-batches in groups of P.
  if (c.vpp > 1 && c.grad_accum() % c.pp != 0)
    return "the interleaved schedule (vpp " + s(c.vpp) + ") needs micro-batches per iteration (" + s(c.grad_accum()) +
           ") divisible by pp " + s(c.pp) + ", as Megatron-Core requires";
  if (c.cac && !c.full_recompute()) return "communication-aware checkpointing (cac) needs full recompute (activation checkpointing)";
  if (c.fused_grouped_mlp) {
    const std::string what = "the fused grouped MLP (--fused-grouped-mlp)";
    if (!m.is_moe()) return what + " runs a MoE model's experts: this one is dense";
    if (m.dtype != Dtype::fp8) return what + " runs in MXFP8 only (Transformer Engine's fused kernels): add --dtype fp8";
    if (m.activation != Activation::swiglu) return what + " fuses a gated (GLU) activation: the experts' is not";
    if (c.expert_tp && c.tp > 1) return what + " needs whole experts (expert TP 1, as Megatron-Core requires): add --no-expert-tp";
    if (m.hidden % 64 != 0 || m.expert_ffn() % 64 != 0)
      return what + " needs the hidden size (" + s(m.hidden) + ") and the expert width (" + s(m.expert_ffn()) +
             ") multiples of 64 (Transformer Engine's condition)";
    if (c.recomputes(kRecomputeMoeAct))
      return what + " leaves no activation of its own to recompute (moe_act): drop it from --recompute-modules";
  }
  if (c.fp8_attention) {
    if (m.dtype != Dtype::fp8) return "FP8 attention (--fp8-attention) needs FP8 training: add --dtype fp8";
    if (m.core_attention != AttentionKernel::flash)
      return "FP8 attention (--fp8-attention) runs in cuDNN's fused kernel: it needs --attention-kernel flash";
  }
  if ((c.cuda_graph_scopes & kGraphFullIteration) && m.is_moe() && m.moe.dropless()) {
    // Megatron-Core captures dropless MoE without the token-count sync only with HybridEP's per-rank
    // capacity budget (moe_expert_rank_capacity_factor), which needs the op fuser and hybridep.
    const std::string what = "a full-iteration CUDA graph of dropless MoE";
    if (c.moe_dispatcher != MoeDispatcher::flex)
      return what + " needs --moe-dispatcher flex (HybridEP's per-rank capacity budget replaces the token-count sync)";
    if (!c.fused_grouped_mlp)
      return what + " needs --fused-grouped-mlp (Megatron-Core's capacity budget requires Transformer Engine's op fuser)";
  }
  if (c.moe_a2a_overlap) {
    // Megatron-Core's own checks (transformer_config.py at 2edffadb).
    const std::string what = "expert all-to-all overlap (--moe-a2a-overlap)";
    if (c.ep == 1) return what + " needs expert parallelism (ep > 1)";
    if (c.pp > 1 && c.vpp == 1) return what + " with pipeline stages needs the interleaved schedule (vpp > 1), as Megatron-Core requires";
    if (c.full_recompute()) return what + " cannot run with full recompute (Megatron-Core refuses it)";
    if (c.recomputes(kRecomputeMoe)) return what + " cannot recompute the moe module (Megatron-Core refuses it)";
    if (c.cuda_graph_scopes & kGraphMlp) return what + " cannot capture the mlp scope in CUDA graphs (Megatron-Core refuses it)";
    if (c.shared_expert_overlap)
      return what + " cannot run with --shared-expert-overlap (Megatron-Core refuses it: the shared experts then run after the router)";
    if (c.moe_a2a_overlap_sms <= 0) return "--moe-a2a-overlap-sms must be positive, got " + s(c.moe_a2a_overlap_sms);
  }
  return {};
}

}  // namespace

std::string ParallelConfig::describe() const {
  std::string text;
  if (pp > 1) text += "p=" + std::to_string(pp) + (vpp > 1 ? " v=" + std::to_string(vpp) : std::string()) + " ";
  text += "t=" + std::to_string(tp) + (cp > 1 ? " c=" + std::to_string(cp) : std::string()) + " e=" + std::to_string(ep) +
          " d=" + std::to_string(dp()) +
                     " b=" + std::to_string(micro_batch) + " ga=" + std::to_string(grad_accum());
  text += dtd ? " dtd" : " -";
  text += cac ? " cac" : " -";
  text += recompute == Recompute::full ? " ckpt"
          : recompute == Recompute::selective ? " sel(" + recompute_modules_text(recompute_modules) + ")"
                                                : " -";
  if (sequence_parallel) text += " sp";
  text += " zero" + std::to_string(zero);
  text += expert_tp && tp > 1 ? " etp" : " -";  // with one tensor rank there is nothing to split
  if (shared_expert_overlap) text += " seo";
  if (moe_dispatcher == MoeDispatcher::flex) text += " flex";
  if (adam_moments != Dtype::fp32) text += " m16";
  if (cuda_graph_scopes != 0) text += " cg(" + cuda_graph_scopes_text(cuda_graph_scopes) + ")";
  if (fused_grouped_mlp) text += " fmlp";
  if (fp8_attention) text += " fp8a";
  if (moe_a2a_overlap) text += " a2ao";
  text += layout == RankLayout::ted ? " ted" : layout == RankLayout::data_before_expert ? " dbe" : " fold";
  return text;
}

void validate_config(const ParallelConfig& c, const ModelSpec& m) {
  const std::string why = first_violation(c, m);
  if (!why.empty()) throw InputError("invalid configuration for model '" + m.name + "': " + why);
}

bool config_is_valid(const ParallelConfig& c, const ModelSpec& m) { return first_violation(c, m).empty(); }

std::string config_violation(const ParallelConfig& c, const ModelSpec& m) { return first_violation(c, m); }

RankLayout parse_layout(const std::string& text) {
  if (text == "ted") return RankLayout::ted;
  if (text == "data_before_expert" || text == "dbe") return RankLayout::data_before_expert;
  if (text == "folded") return RankLayout::folded;
  throw InputError("--layout: expected ted, data_before_expert or folded, got '" + text + "'");
}

const char* to_string(MoeDispatcher dispatcher) { return dispatcher == MoeDispatcher::flex ? "flex" : "alltoall"; }

Dtype parse_adam_moments(const std::string& text) {
  if (text == "fp32") return Dtype::fp32;
  if (text == "bf16") return Dtype::bf16;
  throw InputError("--adam-moments: expected fp32 or bf16, got '" + text + "'");
}

MoeDispatcher parse_moe_dispatcher(const std::string& text) {
  if (text == "alltoall") return MoeDispatcher::alltoall;
  if (text == "flex") return MoeDispatcher::flex;
  throw InputError("--moe-dispatcher: expected alltoall or flex (DeepEP/HybridEP), got '" + text + "'");
}

}  // namespace tedsim
