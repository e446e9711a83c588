#pragma once
#include "tedsim/comm/communicator.hpp"
#include "tedsim/spec/model_spec.hpp"

namespace tedsim::test {

Communicator& runtime_world();

// A small MoE decoder: layers alternate dense / MoE, grouped-query attention (kv_heads = heads/2),
// top-2 routing with a capacity factor large enough that no token is ever dropped.
inline ModelSpec small_moe(int layers = 2, Activation act = Activation::gelu, bool tied = true) {
  ModelSpec m;
  m.name = "test-moe";
  m.source = "runtime tests";
  m.layers = layers;
  m.hidden = 32;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn = 64;
  m.activation = act;
  m.vocab = 64;
  m.seq_len = 16;
  m.dtype = Dtype::fp32;
  m.tie_embeddings = tied;
  m.moe.experts = 4;
  m.moe.every = 2;
  m.moe.top_k = 2;
  m.moe.capacity_factor = 8.0;  // C = 2*8*T/4 = 4T >= k*T: nothing dropped
  m.moe.min_capacity = 4;
  return m;
}

// Today's shapes on the small decoder (4 layers, 8 experts): the routers and dispatch modes the
// training step runs beside DeepSpeed's gating.
enum TodaysMoe {
  kTedModel = 0,        // small_moe(4): capacity-based top-2 softmax gating
  kDroplessShared = 1,  // dropless top-4 of 8 experts a quarter of the dense width, a shared expert,
                        // a dense first layer, SwiGLU, RMSNorm, renormalized softmax-top-k, RoPE
  kSigmoidGroups = 2,   // DeepSeek-V3's sigmoid router, renormalized, scaled 2.5, within 2 of 4 groups, dropless
  kTopkSoftmax = 3,     // Mixtral's top-k-softmax router, top-2, a roomy capacity; head_dim 16 != hidden / heads,
                        // RoPE on half of each head at Qwen3's base after Qwen3's per-head q/k norms
  kMla = 4,             // kDroplessShared with DeepSeek's multi-head latent attention: q latent 16, kv latent 8,
                        // query/key heads 4 + 4 rope, value heads 6 (apart from the query/key size)
  kMlaDirectQ = 5,      // the same without the q latent (DeepSeek-V2-Lite's queries straight from x)
  kMtp = 6,             // kMla with DeepSeek-V3's multi-token prediction (2 modules after the last, MoE, layer)
                        // and untied embeddings
};

inline ModelSpec small_todays_moe(TodaysMoe kind) {
  const bool mla = kind == kMla || kind == kMlaDirectQ || kind == kMtp;
  ModelSpec m = small_moe(4, kind == kDroplessShared || mla ? Activation::swiglu : Activation::gelu, true);
  if (kind == kTedModel) return m;
  m.moe.experts = 8;
  m.moe.every = 1;
  m.moe.top_k = kind == kTopkSoftmax ? 2 : 4;
  m.moe.capacity_factor = kind == kTopkSoftmax ? 8.0 : 0.0;
  if (kind == kDroplessShared || mla) {
    m.moe.first_dense = 1;
    m.moe.ffn = 16;
    m.moe.shared_experts = 1;
    m.moe.shared_ffn = 32;
    m.moe.router = Router::softmax_topk;
    m.moe.normalize_topk = true;
    m.norm = Norm::rmsnorm;
    m.rotary_dim = m.head_dim();
    if (mla) {
      m.attention = Attention::mla;
      m.kv_heads = m.heads;
      m.mla.q_lora_rank = kind == kMlaDirectQ ? 0 : 16;
      if (kind == kMtp) {  // as DeepSeek-V3: untied, so a last stage keeps its own embedding copy
        m.mtp_layers = 2;
        m.tie_embeddings = false;
      }
      m.mla.kv_lora_rank = 8;
      m.mla.qk_nope_head_dim = 4;
      m.mla.qk_rope_head_dim = 4;
      m.mla.v_head_dim = 6;
      m.rotary_dim = 4;  // MLA turns the rope part only
    }
  } else if (kind == kSigmoidGroups) {
    m.moe.router = Router::sigmoid;
    m.moe.normalize_topk = true;
    m.moe.routed_scaling = 2.5;
    m.moe.groups = 4;
    m.moe.topk_groups = 2;
  } else {
    m.moe.router = Router::topk_softmax;
    m.head_dim_given = 16;  // Qwen3's way: heads x head_dim (64) apart from hidden (32)
    m.rotary_dim = 8;       // partial rotation (partial_rotary_factor 0.5)
    m.rope_theta = 1e6;
    m.qk_norm = QkNorm::head;  // Qwen3's q_norm and k_norm
  }
  m.validate("runtime test model");
  return m;
}

}  // namespace tedsim::test
