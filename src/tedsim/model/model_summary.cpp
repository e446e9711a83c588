#include "tedsim/model/model_summary.hpp"

namespace tedsim {

ModelSummary summarize_model(const ModelSpec& m, int seq_len) {
  ModelSummary out;
  const double attention = m.attention_params() + 2.0 * m.norm_params();
  const double qk = m.is_mla() ? m.mla.qk_head_dim() : m.head_dim();
  const double v = m.is_mla() ? m.mla.v_head_dim : m.head_dim();
  const double core_flops = 2.0 * double(seq_len) * m.heads * (qk + v);
  if (m.dense_layers() > 0) {
    LayerKindSummary d;
    d.kind = "dense";
    d.count = m.dense_layers();
    d.params = d.active_params = attention + m.mlp_params();
    d.forward_flops_per_token = 2.0 * d.active_params + core_flops;
    out.kinds.push_back(d);
  }
  if (m.moe_layers() > 0) {
    LayerKindSummary e;
    e.kind = m.moe.shared_experts > 0 ? "moe+shared" : "moe";
    e.count = m.moe_layers();
    const double expert = m.mlp_params(m.expert_ffn());
    const double common = attention + m.router_params() + m.shared_expert_params();
    e.params = common + double(m.moe.experts) * expert;
    e.active_params = common + double(m.moe.top_k) * expert;
    e.forward_flops_per_token = 2.0 * e.active_params + core_flops;
    out.kinds.push_back(e);
  }
  out.embedding_params = m.embedding_params();
  out.head_forward_flops_per_token = 2.0 * double(m.vocab) * m.hidden;
  out.total_params = m.total_params();
  out.active_params = m.active_params();
  out.active_params_without_input_embedding = m.active_params_without_input_embedding();
  out.forward_flops_per_token = out.head_forward_flops_per_token;
  for (const LayerKindSummary& k : out.kinds) out.forward_flops_per_token += k.count * k.forward_flops_per_token;
  return out;
}

}  // namespace tedsim
