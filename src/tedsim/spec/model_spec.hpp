#pragma once
// A decoder-only transformer with optional Mixture-of-Experts layers, as read from models/*.yaml or
// imported from a Hugging Face config.json (spec/hf_config.hpp): GPT-3 / TED shapes, and the shapes
// MoE models train with now: fine-grained routed experts beside shared experts, dense-first layer
// patterns, top-k routers of several kinds, dropless routing, head_dim independent of hidden/heads,
// grouped-query and multi-head latent attention, RMSNorm.
#include <cstdint>
#include <string>
#include <vector>

#include "tedsim/core/units.hpp"
#include "tedsim/spec/attention_kernel.hpp"
#include "tedsim/spec/expert_shares.hpp"

namespace tedsim {

enum class Activation { gelu, swiglu };
const char* to_string(Activation a);

// How a token's experts and their weights are chosen from the router's logits.
enum class Router {
  softmax_topk,  // softmax over all experts, then the top k (DeepSpeed, Qwen-MoE, OLMoE)
  topk_softmax,  // the top k logits, then softmax over those k (Mixtral, gpt-oss)
  sigmoid,       // sigmoid scores, top k, renormalized and scaled (DeepSeek-V3)
};
const char* to_string(Router r);

enum class Attention { mha, gqa, mla };  // mha: kv_heads = heads; mla: DeepSeek's latent attention
const char* to_string(Attention a);

enum class Norm { layernorm, rmsnorm };
const char* to_string(Norm n);

// A norm of the queries and keys before RoPE (Megatron-Core's qk_layernorm): Qwen3's q_norm and
// k_norm over each head's head_dim, or OLMoE's over the whole query and key projections.
enum class QkNorm { none, head, projection };
const char* to_string(QkNorm n);

// Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values pass through low-rank
// latents; each head's query/key is a no-position part and a rotary part.
struct MlaSpec {
  int q_lora_rank = 0;        // 0: queries are projected directly from the hidden state
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// RoPE's base where a model gives none: RoFormer's, Llama's and transformers' default.
inline constexpr double kDefaultRopeTheta = 10000.0;

// Measured expert-load imbalance of balanced training: the busiest expert's tokens over the mean.
// Wang et al., "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts" (arXiv
// 2408.15664, the balancing DeepSeek-V3 trains with) report the batch-level maximal violation
// (max load / mean - 1) through training at roughly 0.2 once balanced; tedsim assumes 1.2 unless
// the model or --imbalance says otherwise, and `validate` reports the measured value beside it.
inline constexpr double kDefaultImbalance = 1.2;

struct MoeSpec {
  int experts = 0;             // routed experts; 0: a dense model
  int every = 2;               // after the first `first_dense` layers, every `every`-th layer is MoE
  int first_dense = 0;
  std::vector<int> layers;     // explicit MoE layer indices (0-based); overrides every/first_dense
  int top_k = 1;
  double capacity_factor = 1.0;  // 0: dropless (every token reaches its k experts)
  int min_capacity = 4;
  int ffn = 0;                 // routed expert width (the model's ffn unless given)
  int shared_experts = 0;      // always-active experts beside the routed ones
  int shared_ffn = 0;          // width of each shared expert (the routed width unless given)
  bool shared_gate = false;    // Qwen2-MoE: a sigmoid gate [h, 1] scales the shared experts' output
  Router router = Router::softmax_topk;
  bool normalize_topk = false; // softmax_topk: renormalize the k chosen weights to sum to 1
  double routed_scaling = 1.0; // sigmoid: the routed output is scaled by this
  int groups = 1;              // group-limited routing: experts in `groups` equal groups, each
  int topk_groups = 1;         //   token's experts within its best `topk_groups` groups
  double imbalance = kDefaultImbalance;  // dropless: the busiest expert's tokens over the mean
  bool imbalance_given = false;  // the model file or --imbalance stated it (else a profile's measured routing may)
  // Dropless: the step's routing as calibration measured it (a measured profile's, adopted where
  // nothing states the imbalance): the busiest expert rank's load comes from these shares.
  ExpertShares measured_shares;

  bool dropless() const { return capacity_factor == 0; }
  // DeepSpeed's top-k gating with a capacity (the fused kernel of the TED step): softmax then top-k,
  // k >= 2 renormalized, no scaling or groups. Other routers and dropless use kernels/cpu/router.hpp.
  bool deepspeed_gating() const {
    return router == Router::softmax_topk && normalize_topk == (top_k > 1) && routed_scaling == 1.0 && !group_limited() &&
           !dropless();
  }
  bool group_limited() const { return groups > 1 && topk_groups < groups; }
};

// YaRN's attention factor for scaling `factor` (transformers' _compute_yarn_parameters and
// Megatron-Core's _yarn_get_concentration_factor agree): with both mscale and mscale_all_dim
// given (0: not given), get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim), else
// get_mscale(factor) = 0.1 ln(factor) + 1 (1 for factor <= 1).
double yarn_attention_factor(double factor, double mscale, double mscale_all_dim);

struct ModelSpec {
  std::string name;
  std::string source;          // where the shape comes from
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;            // grouped-query attention; equals heads for multi-head attention
  int head_dim_given = 0;      // 0: hidden / heads
  // Rotary position embedding (RoPE): dimensions of each query and key head it rotates (0: none,
  // GPT-2/3's learned positions). MLA rotates its qk_rope_head_dim part.
  int rotary_dim = 0;
  QkNorm qk_norm = QkNorm::none;  // the model's norm kind, on the queries and keys after the projection
  // RoPE's base theta: pair i of a head turns by pos * theta^(-2i / rotary_dim). It sets the
  // numerics of validate's training step, not any cost; frequency scaling (rope_scaling) is not run.
  double rope_theta = kDefaultRopeTheta;
  // YaRN's frequency scaling (rope_scaling type yarn; 0: none) and its attention factor, the
  // "mscale" multiplied into cos and sin (yarn_attention_factor). The factor is a cost, not only
  // numerics: Megatron-Core's fused RoPE takes no such factor, so with one other than 1 it runs
  // its unfused PyTorch RoPE (rope_utils.py apply_rotary_pos_emb, at d0b3b775): gpt-oss.
  double yarn_factor = 0.0;
  double rope_attention_factor = 1.0;
  bool rope_unfused() const { return rotary_dim > 0 && rope_attention_factor != 1.0; }
  // Sliding-window attention: each query attends to its last `sliding_window` keys (0: all), on
  // every layer, or on all but every `full_attention_every`-th (1-based, Megatron-Core's
  // window_attn_skip_freq: gpt-oss windows the odd layers, 2).
  int sliding_window = 0;
  int full_attention_every = 0;
  int ffn = 0;                 // dense FFN width F (4h unless the model says)
  Activation activation = Activation::gelu;
  // gpt-oss's clamped GLU (swiglu_limit): the gate half clamped above at the limit, the linear
  // half to +-limit, before the activation (0: none). A cost, not only numerics: Megatron-Core
  // clamps and re-concatenates the halves outside its fused bias-GLU kernel (fused_bias_geglu.py
  // weighted_bias_quick_geglu_impl, at 2edffadb and d0b3b775).
  double activation_clamp = 0.0;
  Attention attention = Attention::mha;
  MlaSpec mla;
  Norm norm = Norm::layernorm;
  bool linear_bias = false;    // biases on every linear layer (GPT-2/3, gpt-oss)
  bool qkv_bias = false;       // biases on the query/key/value projections only (Qwen2)
  // Dropout probabilities (Megatron-LM's --hidden-dropout / --attention-dropout; GPT-2/3 trained
  // with 0.1 each, today's LLMs mostly with 0): hidden after attention and after the MLP (fused
  // with the bias and residual add), attention on the softmax probabilities [b, heads, s, s].
  double hidden_dropout = 0, attention_dropout = 0;
  int vocab = 0;
  int seq_len = 0;
  Dtype dtype = Dtype::fp16;
  // How the run computes the attention core (a property of the training run, like dtype: the
  // CLI's --attention-kernel sets it, by default flash where the profile has its measured rates).
  AttentionKernel core_attention = AttentionKernel::unfused;
  bool tie_embeddings = true;
  // Multi-token prediction (DeepSeek-V3 section 2.2; Megatron-Core's --mtp-num-layers): D modules
  // after the last layer, each the next token's embedding and the previous depth's hidden state,
  // normed, concatenated and projected (eh_proj, 2h -> h), one transformer layer of the last
  // layer's kind, and the shared output head with its own loss. 0: none.
  int mtp_layers = 0;
  MoeSpec moe;
  // From a Hugging Face import: keys read but irrelevant to training cost, and what is costed
  // more simply than the config says (shown by `model show` and the startup table).
  std::vector<std::string> ignored_keys, approximations;

  bool is_moe() const { return moe.experts > 0; }
  bool is_mla() const { return attention == Attention::mla; }
  int head_dim() const { return head_dim_given > 0 ? head_dim_given : hidden / heads; }
  int q_dim() const { return heads * head_dim(); }        // query width (all heads)
  int kv_dim() const { return head_dim() * kv_heads; }    // key (= value) width
  int attention_out_dim() const { return is_mla() ? heads * mla.v_head_dim : q_dim(); }
  int expert_ffn() const { return moe.ffn > 0 ? moe.ffn : ffn; }
  int shared_ffn() const { return moe.shared_ffn > 0 ? moe.shared_ffn : expert_ffn(); }
  int shared_width() const { return moe.shared_experts * shared_ffn(); }  // all shared experts side by side
  bool is_moe_layer(int layer) const;
  bool is_window_layer(int layer) const {
    return sliding_window > 0 && !(full_attention_every > 0 && (layer + 1) % full_attention_every == 0);
  }
  int moe_layers() const;
  int dense_layers() const { return layers - moe_layers(); }
  std::string layer_pattern() const;  // e.g. "3 dense, then 58 MoE" or "D M D M ..."

  // Parameter counts (whole model, before any parallel split).
  double attention_params() const;     // per layer: projections (and MLA's latent norms)
  double norm_params() const;          // one norm
  double mlp_params(int width) const;  // one MLP of that width (dense MLP or one expert)
  double mlp_params() const { return mlp_params(ffn); }
  double router_params() const;        // one MoE layer's router (and shared-expert gate)
  double shared_expert_params() const; // one MoE layer's shared experts
  double embedding_params() const;     // input embedding and, untied, the LM head
  double nonexpert_params() const;     // everything but routed experts
  double expert_params() const;        // all routed experts of all MoE layers
  double total_params() const { return nonexpert_params() + expert_params(); }
  // The multi-token-prediction modules' own parameters (not in total_params, as DeepSeek-V3's
  // 671B leaves its 14B out): eh_proj, three norms and a layer each; split as the layer's are.
  double mtp_nonexpert_params() const;
  double mtp_expert_params() const;
  // What one token's forward uses: all but the routed experts it is not sent to. Publishers differ
  // on the input embedding (a lookup, no multiply): Mistral and Qwen count it, DeepSeek and OpenAI
  // do not; both figures are given.
  double active_params() const;
  double active_params_without_input_embedding() const { return active_params() - double(vocab) * hidden; }

  // Overrides from the command line, re-validated.
  void set_experts(int experts);
  void validate(const std::string& origin) const;  // throws InputError naming origin
};

// Loads a model: a YAML file of ours, or a Hugging Face config.json (the file, or a folder holding
// one). Unknown keys, wrong types and impossible values are InputErrors with the file and the key.
ModelSpec load_model(const std::string& path);
ModelSpec load_model_yaml(const std::string& path);
ModelSpec model_from_yaml_text(const std::string& text, const std::string& name);  // `name` in messages
class YamlMap;
ModelSpec model_from_yaml(const YamlMap& root, const std::string& path);

}  // namespace tedsim
