#include "tedsim/report/launch_export.hpp"

#include <nlohmann/json.hpp>
#include <sstream>

#include "tedsim/report/text_table.hpp"

namespace tedsim {
namespace {

// One flag per line inside a bash array, with its value and an optional comment.
class ArgList {
 public:
  explicit ArgList(std::string name) : name_(std::move(name)) {}
  void flag(const std::string& f, const std::string& value = "", const std::string& why = "") {
    text_ += "  " + f + (value.empty() ? "" : " " + value) + (why.empty() ? "" : "  # " + why) + "\n";
  }
  void comment(const std::string& c) { text_ += "  # " + c + "\n"; }
  std::string str() const { return name_ + "=(\n" + text_ + ")\n"; }

 private:
  std::string name_, text_;
};

std::string n(long long v) { return std::to_string(v); }

std::string header(const ModelSpec& m, const TopologySpec& t, const Prediction& p, const std::string& target) {
  const ParallelConfig& c = p.config;
  std::string h = "# tedsim plan: " + m.name + " on " + n(c.gpus) + " x " + t.device.name + " (" + t.name + "), " +
                  c.describe() + "\n";
  h += "# predicted " + fixed(p.sim.iteration_s, 3) + " s per iteration, " + fixed(p.tokens_per_s, 0) +
       " tokens/s, peak " + fixed(p.memory.peak / kGiB, 2) + " GiB of " + fixed(p.memory.capacity / kGiB, 2) +
       " GiB on the largest stage\n";
  h += "# " + target + "\n";
  return h;
}

// Megatron's --moe-layer-freq: 1 for every layer, a compact pattern where one exists, else the list.
std::string moe_layer_pattern(const ModelSpec& m) {
  if (m.moe_layers() == m.layers) return "1";
  int first_moe = 0;
  while (!m.is_moe_layer(first_moe)) ++first_moe;
  if (first_moe + m.moe_layers() == m.layers) return "\"([0]*" + n(first_moe) + "+[1]*" + n(m.moe_layers()) + ")\"";
  const int every = m.moe.every;
  if (m.moe.layers.empty() && m.moe.first_dense == 0 && m.layers % every == 0)
    return "\"([0]*" + n(every - 1) + "+[1])*" + n(m.layers / every) + "\"";
  std::string list = "\"[";
  for (int l = 0; l < m.layers; ++l) list += (l ? "," : "") + std::string(m.is_moe_layer(l) ? "1" : "0");
  return list + "]\"";
}

std::string precision_flag(const ModelSpec& m) {
  return m.dtype == Dtype::bf16 || m.dtype == Dtype::fp8 ? "--bf16" : m.dtype == Dtype::fp16 ? "--fp16" : "";
}

void model_shape(ArgList& a, const ModelSpec& m, int seq, bool megatron_core) {
  a.flag("--num-layers", n(m.layers));
  a.flag("--hidden-size", n(m.hidden));
  a.flag("--num-attention-heads", n(m.heads));
  if (m.kv_heads != m.heads) {
    if (megatron_core) {
      a.flag("--group-query-attention");
      a.flag("--num-query-groups", n(m.kv_heads));
    } else {
      a.flag("--num-key-value-heads", n(m.kv_heads));
    }
  }
  a.flag("--ffn-hidden-size", n(m.ffn));
  if (m.head_dim_given > 0 && !m.is_mla()) a.flag("--kv-channels", n(m.head_dim()));
  if (m.is_mla() && megatron_core) {
    a.flag("--multi-latent-attention");
    if (m.mla.q_lora_rank > 0) a.flag("--q-lora-rank", n(m.mla.q_lora_rank));
    a.flag("--kv-lora-rank", n(m.mla.kv_lora_rank));
    a.flag("--qk-head-dim", n(m.mla.qk_nope_head_dim));
    a.flag("--qk-pos-emb-head-dim", n(m.mla.qk_rope_head_dim));
    a.flag("--v-head-dim", n(m.mla.v_head_dim));
  }
  if (m.rotary_dim > 0) {
    // RoPE (Megatron-LM's default is learned absolute positions); a share of each head where the
    // model rotates only part of it (MLA: of its rope part).
    const int rotatable = m.is_mla() ? m.mla.qk_rope_head_dim : m.head_dim();
    const std::string base = n(std::llround(m.rope_theta));
    if (megatron_core) {
      a.flag("--position-embedding-type", "rope");
      a.flag("--rotary-base", base);
    } else {
      a.flag("--use-rotary-position-embeddings");
      a.flag("--rotary-position-embeddings-theta", base);
    }
    if (m.rotary_dim != rotatable) a.flag("--rotary-percent", fixed(double(m.rotary_dim) / rotatable, 4));
  }
  if (m.qk_norm != QkNorm::none) {
    if (megatron_core)
      a.flag("--qk-layernorm", "", m.qk_norm == QkNorm::head ? "" : "per head; the model normalizes the whole projections");
    else
      a.comment("the model's q/k norm has no Megatron-DeepSpeed flag");
  }
  if (m.norm == Norm::rmsnorm) a.flag("--normalization", "RMSNorm");
  if (!m.linear_bias) a.flag("--disable-bias-linear");
  if (m.qkv_bias && !m.linear_bias) a.flag("--add-qkv-bias");
  if (m.activation == Activation::swiglu) a.flag("--swiglu");
  if (!m.tie_embeddings) a.flag("--untie-embeddings-and-output-weights");
  if (m.mtp_layers > 0) a.flag("--mtp-num-layers", n(m.mtp_layers), "multi-token prediction, on the last pipeline stage");
  a.flag("--seq-length", n(seq));
  a.flag("--max-position-embeddings", n(seq));
  a.comment("vocabulary: your tokenizer's (tedsim planned with " + n(m.vocab) + ")");
}

}  // namespace

std::string megatron_launch(const ModelSpec& m, const TopologySpec& topo, const Prediction& p) {
  const ParallelConfig& c = p.config;
  const int seq = c.seq_len > 0 ? c.seq_len : m.seq_len;
  ArgList a("MEGATRON_ARGS");
  model_shape(a, m, seq, true);
  a.flag("--tensor-model-parallel-size", n(c.tp));
  if (c.cp > 1) a.flag("--context-parallel-size", n(c.cp));
  a.flag("--pipeline-model-parallel-size", n(c.pp));
  if (c.vpp > 1) a.flag("--num-virtual-stages-per-pipeline-rank", n(c.vpp));
  if (!c.pipeline_layout.empty()) a.flag("--pipeline-model-parallel-layout", "\"" + c.pipeline_layout + "\"");
  if (c.sequence_parallel) a.flag("--sequence-parallel");
  a.flag("--micro-batch-size", n(c.micro_batch));
  a.flag("--global-batch-size", n(c.global_batch));
  if (c.recompute == Recompute::full) {
    a.flag("--recompute-granularity", "full");
    a.flag("--recompute-method", "uniform");
    a.flag("--recompute-num-layers", "1", "every layer keeps its input only");
  } else if (c.recompute == Recompute::selective) {
    a.flag("--recompute-granularity", "selective");
    std::string modules = recompute_modules_text(c.recompute_modules);
    for (char& ch : modules)
      if (ch == ',') ch = ' ';
    a.flag("--recompute-modules", modules);
  }
  a.flag("--attention-backend", m.core_attention == AttentionKernel::flash ? "flash" : "unfused",
         "the attention core tedsim priced");
  if (c.zero == 1 || c.zero == 2)
    a.flag("--use-distributed-optimizer", "", "shards optimizer state, reduce-scatters gradients (ZeRO " + n(c.zero) + ")");
  if (c.adam_moments == Dtype::bf16) {
    a.flag("--use-precision-aware-optimizer", "", "Adam's moments in bf16, master weights fp32");
    a.flag("--exp-avg-dtype", "bf16");
    a.flag("--exp-avg-sq-dtype", "bf16");
  }
  if (c.cuda_graph_scopes & kGraphFullIteration) {
    a.flag("--cuda-graph-impl", "full_iteration", "the whole forward and backward as one graph, as tedsim priced it");
    a.flag("--no-check-for-nan-in-loss-and-grad", "", "Megatron-LM requires it with full-iteration graphs");
    if (m.is_moe() && m.moe.dropless()) {
      a.flag("--moe-expert-rank-capacity-factor", "1.5",
             "HybridEP's per-rank receive budget instead of the token-count sync (Megatron-Bridge's value)");
      a.flag("--moe-paged-stash", "", "the experts' saved activations in preallocated pages");
    }
  } else if (c.cuda_graph_scopes != 0) {
    std::string scopes = cuda_graph_scopes_text(c.cuda_graph_scopes);
    for (char& ch : scopes)
      if (ch == ',') ch = ' ';
    a.flag("--cuda-graph-impl", "transformer_engine", "per-layer graphs, as tedsim priced them on the host");
    a.flag("--cuda-graph-scope", scopes);
  }
  if (c.fp8_attention)
    a.comment("FP8 attention: Megatron-LM's parser has no flag for it (TransformerConfig.fp8_dot_product_attention, "
              "which Megatron-Bridge sets); tedsim priced the fused core in FP8");
  if (c.fused_grouped_mlp) {
    a.flag("--use-transformer-engine-op-fuser", "",
           "the experts as Transformer Engine's fused grouped MLP; export NVTE_CUTEDSL_FUSED_GROUPED_MLP=1");
    a.flag("--moe-mlp-glu-interleave-size", "32", "the fused kernels' GLU layout (Megatron-Bridge's value)");
  }
  if (c.zero == 3) {
    a.flag("--use-megatron-fsdp", "", "ZeRO-3: parameters sharded too");
    a.flag("--data-parallel-sharding-strategy", "optim_grads_params");
  }
  const std::string precision = precision_flag(m);
  if (!precision.empty()) a.flag(precision);
  if (m.dtype == Dtype::fp8) a.flag("--fp8-format", "hybrid", "FP8 GEMMs (E4M3 forward, E5M2 gradients), bf16 elsewhere");
  if (m.is_moe()) {
    a.flag("--num-experts", n(m.moe.experts));
    a.flag("--moe-layer-freq", moe_layer_pattern(m), "tedsim's layer pattern: " + m.layer_pattern());
    if (m.expert_ffn() != m.ffn) a.flag("--moe-ffn-hidden-size", n(m.expert_ffn()));
    if (m.moe.shared_experts > 0) {
      a.flag("--moe-shared-expert-intermediate-size", n(m.shared_width()), n(m.moe.shared_experts) + " shared expert(s) side by side");
      if (m.moe.shared_gate) a.flag("--moe-shared-expert-gate");
      if (c.shared_expert_overlap) a.flag("--moe-shared-expert-overlap");
    }
    a.flag("--moe-router-topk", n(m.moe.top_k));
    switch (m.moe.router) {
      case Router::softmax_topk: a.flag("--moe-router-pre-softmax", "", "softmax over all experts, then top-k"); break;
      case Router::topk_softmax: break;  // Megatron's default: top-k of the logits, then softmax
      case Router::sigmoid:
        a.flag("--moe-router-score-function", "sigmoid");
        a.flag("--moe-router-enable-expert-bias", "", "DeepSeek-V3's auxiliary-loss-free balancing");
        break;
    }
    if (m.moe.routed_scaling != 1.0) a.flag("--moe-router-topk-scaling-factor", fixed(m.moe.routed_scaling, 2));
    if (m.moe.group_limited()) {
      a.flag("--moe-router-num-groups", n(m.moe.groups));
      a.flag("--moe-router-group-topk", n(m.moe.topk_groups));
    }
    a.flag("--expert-model-parallel-size", n(c.ep));
    a.flag("--expert-tensor-parallel-size", n(c.expert_tp ? c.tp : 1));
    if (c.moe_dispatcher == MoeDispatcher::flex) {
      a.flag("--moe-token-dispatcher-type", "flex");
      a.flag("--moe-flex-dispatcher-backend", "deepep", "or hybridep: both send a token once per GPU and node");
    } else {
      a.flag("--moe-token-dispatcher-type", "alltoall");
    }
    if (c.moe_a2a_overlap) {
      a.flag("--overlap-moe-expert-parallel-comm", "", "each steady-state forward merged with the next backward");
      if (c.moe_dispatcher == MoeDispatcher::flex) a.flag("--moe-deepep-num-sms", n(c.moe_a2a_overlap_sms), "the SMs tedsim priced");
    }
    a.flag("--moe-grouped-gemm");
    a.flag("--moe-router-load-balancing-type", m.moe.router == Router::sigmoid ? "seq_aux_loss" : "aux_loss");
    if (!m.moe.dropless()) {
      a.flag("--moe-expert-capacity-factor", fixed(m.moe.capacity_factor, 2));
      a.flag("--moe-pad-expert-input-to-capacity");
      a.flag("--moe-token-drop-policy", "position", "drops by token order, as TED's capacity does");
    } else {
      a.comment("dropless: no capacity factor (tedsim planned the busiest expert at " + fixed(m.moe.imbalance, 2) + "x the mean)");
    }
  }
  std::string out = header(m, topo, p, "Megatron-LM pretrain_gpt.py arguments (names of Megatron-LM d98e8a6, megatron/training/arguments.py)");
  out += a.str();
  out += "# tedsim options without a Megatron-LM counterpart:\n";
  if (m.is_moe() && c.cac) out += "#   communication-aware checkpointing (CAC): Megatron's full recompute replays the collectives too\n";
  if (m.is_moe() && c.dtd && c.tp > 1 && !c.sequence_parallel)
    out += "#   duplicate token dropping (DTD): Megatron-Core splits tokens before the router only with --sequence-parallel\n";
  if (m.is_moe() && c.layout == RankLayout::data_before_expert)
    out += "#   the data-before-expert rank layout: Megatron orders ranks tp-ep-dp-pp (tedsim's 'ted' layout)\n";
  if (m.is_moe() && !c.tiled_optimizer) out += "#   the untiled expert optimizer step (Megatron's optimizer has no such switch)\n";
  if (m.moe.min_capacity > 0 && m.is_moe() && !m.moe.dropless()) out += "#   a minimum capacity of " + n(m.moe.min_capacity) + " tokens per expert\n";
  return out;
}

std::string deepspeed_config(const ModelSpec& m, const Prediction& p) {
  const ParallelConfig& c = p.config;
  nlohmann::json j = {{"train_batch_size", c.global_batch},
                      {"train_micro_batch_size_per_gpu", c.micro_batch},
                      {"gradient_accumulation_steps", c.grad_accum()},
                      {"zero_optimization", {{"stage", c.zero}}}};
  if (m.dtype == Dtype::bf16 || m.dtype == Dtype::fp8) j["bf16"] = {{"enabled", true}};  // FP8 GEMMs come from Transformer Engine, not the config
  if (m.dtype == Dtype::fp16) j["fp16"] = {{"enabled", true}};
  return j.dump(2) + "\n";
}

std::string megatron_deepspeed_launch(const ModelSpec& m, const TopologySpec& topo, const Prediction& p,
                                      const std::string& ds_config_path) {
  const ParallelConfig& c = p.config;
  const int seq = c.seq_len > 0 ? c.seq_len : m.seq_len;
  ArgList a("MEGATRON_DEEPSPEED_ARGS");
  model_shape(a, m, seq, false);
  a.flag("--tensor-model-parallel-size", n(c.tp));
  if (c.cp > 1)
    a.comment("context parallelism (cp " + n(c.cp) + "): tedsim priced Megatron-Core's ring; Megatron-DeepSpeed splits "
              "sequences its own way (Ulysses, --ds-sequence-parallel-size), which this plan's prediction does not cover");
  if (c.pp > 1) {
    a.flag("--pipeline-model-parallel-size", n(c.pp));
    if (c.vpp > 1) a.flag("--num-layers-per-virtual-pipeline-stage", n(m.layers / (c.pp * c.vpp)));
  } else {
    a.flag("--no-pipeline-parallel");
  }
  a.flag("--micro-batch-size", n(c.micro_batch));
  a.flag("--global-batch-size", n(c.global_batch));
  if (c.recompute == Recompute::full) a.flag("--checkpoint-activations");
  if (c.recompute == Recompute::selective) a.flag("--recompute-granularity", "selective");
  if (m.core_attention == AttentionKernel::flash) a.flag("--use-flash-attn-v2", "", "the attention core tedsim priced");
  const std::string precision = precision_flag(m);
  if (!precision.empty()) a.flag(precision);
  if (m.is_moe()) {
    a.flag("--num-experts", n(m.moe.experts));
    a.flag("--expert-interval", n(m.moe.every));
    a.flag("--topk", n(m.moe.top_k));
    a.flag("--moe-expert-parallel-size", n(c.ep));
    a.flag("--moe-train-capacity-factor", fixed(m.moe.capacity_factor, 2));
    a.flag("--moe-min-capacity", n(m.moe.min_capacity));
    if (c.expert_tp && c.tp > 1) a.flag("--enable-expert-tensor-parallelism");
  }
  a.flag("--deepspeed");
  a.flag("--deepspeed_config", ds_config_path);
  std::string out = header(m, topo, p, "Megatron-DeepSpeed pretrain_gpt.py arguments (names of Megatron-DeepSpeed f4157be, megatron/arguments.py; DeepSpeed edaa722)");
  out += a.str();
  out += "# tedsim options without a Megatron-DeepSpeed counterpart:\n";
  if (c.sequence_parallel) out += "#   Megatron-style sequence parallelism (Megatron-DeepSpeed's --ds-sequence-parallel-size is Ulysses, not this)\n";
  if (c.pp > 1 && c.zero >= 2) out += "#   ZeRO " + n(c.zero) + " with pipeline stages: DeepSpeed's pipeline engine runs ZeRO 0-1 only\n";
  if (m.is_moe() && c.dtd && c.tp > 1) out += "#   duplicate token dropping (DTD): in DeepSpeed-TED's fork of DeepSpeed, not in this release\n";
  if (m.is_moe() && c.cac) out += "#   communication-aware checkpointing (CAC): in DeepSpeed-TED's fork, not in this release\n";
  if (m.is_moe() && c.layout == RankLayout::data_before_expert) out += "#   the data-before-expert rank layout\n";
  if (m.is_moe() && c.layout == RankLayout::folded)
    out += "#   MoE parallel folding (expert groups across tensor ranks): Megatron-Core's, not DeepSpeed's\n";
  if (c.recompute == Recompute::selective && c.recompute_modules != kRecomputeCoreAttn)
    out += "#   selective recompute of modules other than the attention core\n";
  if (c.adam_moments == Dtype::bf16) out += "#   Adam's moments in bf16 (DeepSpeed's Adam keeps them in fp32)\n";
  return out;
}

}  // namespace tedsim
