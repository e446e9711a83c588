// The step's dimensions on one rank, and the configurations the step refuses.
#include <algorithm>
#include <string>

#include "tedsim/core/error.hpp"
#include "tedsim/kernels/cpu/gating.hpp"
#include "tedsim/runtime/step_context.hpp"

namespace tedsim::runtime {

StepDims step_dims(const ModelSpec& model, const ParallelConfig& cfg, int tensor_rank, int data_size, int replica) {
  StepDims d;
  d.layers = model.layers;
  const int t = d.tensor_size = cfg.tp;
  d.tensor_rank = tensor_rank;
  d.expert_size = model.is_moe() ? cfg.ep : 1;
  d.micro_batch = cfg.micro_batch;
  d.seq = cfg.seq_len > 0 ? cfg.seq_len : model.seq_len;
  if (model.mtp_layers > 0 && d.seq <= model.mtp_layers + 1)
    throw InputError("training step: " + std::to_string(model.mtp_layers) + " multi-token-prediction modules need "
                     "sequences of more than " + std::to_string(model.mtp_layers + 1) + " tokens; got " + std::to_string(d.seq));
  const int T = d.tokens = d.micro_batch * d.seq;
  const bool sp = d.sequence_parallel = cfg.sequence_parallel && t > 1;
  if (sp && T % t != 0)
    throw InputError("sequence parallelism splits the micro-batch's " + std::to_string(T) + " tokens over tp " +
                     std::to_string(t) + ", which does not divide them");
  d.local_tokens = sp ? T / t : T;
  d.routed_tokens = d.local_tokens;
  d.hidden = model.hidden;
  d.head_dim = model.head_dim();
  d.local_heads = model.heads / t;
  d.local_kv_heads = model.kv_heads / t;
  d.local_q_width = d.local_heads * d.head_dim;
  d.local_kv_width = d.local_kv_heads * d.head_dim;
  d.local_qkv_width = d.local_q_width + 2 * d.local_kv_width;
  d.rotary_dim = model.rotary_dim;
  if (model.is_mla()) {
    d.mla = true;
    d.q_lora = model.mla.q_lora_rank;
    d.kv_lora = model.mla.kv_lora_rank;
    d.qk_nope = model.mla.qk_nope_head_dim;
    d.qk_rope = model.mla.qk_rope_head_dim;
    d.v_head = model.mla.v_head_dim;
  }
  d.swiglu = model.activation == Activation::swiglu;
  const int gated = d.swiglu ? 2 : 1;  // fc1 holds SwiGLU's gate and up halves
  d.ffn_local = model.ffn / t;
  d.ffn_fc1_local = gated * d.ffn_local;
  d.expert_width = model.is_moe() ? model.expert_ffn() : model.ffn;
  d.expert_width_local = cfg.expert_tp ? d.expert_width / t : d.expert_width;
  d.expert_fc1_local = gated * d.expert_width_local;
  d.shared_width = model.is_moe() ? model.shared_width() : 0;
  d.shared_width_local = d.shared_width / t;
  d.shared_fc1_local = gated * d.shared_width_local;
  d.vocab = model.vocab;
  d.vocab_local = d.vocab / t;
  d.vocab_first = tensor_rank * d.vocab_local;
  if (model.hidden_dropout > 0 || model.attention_dropout > 0)
    throw InputError("training step: model " + model.name + " trains with dropout (hidden_dropout " +
                     std::to_string(model.hidden_dropout) + ", attention_dropout " +
                     std::to_string(model.attention_dropout) +
                     "), which this step does not run yet: validate a copy with both set to 0");
  if (model.is_moe()) {
    const MoeSpec& me = model.moe;
    d.experts = me.experts;
    d.local_experts = d.experts / d.expert_size;
    d.top_k = me.top_k;
    // SP leaves each tensor rank its own tokens: no DTD slicing of the dispatch.
    d.dtd_split = t > 1 && !sp && (cfg.dtd || !cfg.expert_tp);
    d.expert_tp_split = d.dtd_split && cfg.expert_tp;
    d.sp_expert_gather = sp && cfg.expert_tp;
    d.dropless = me.dropless();
    d.generic_router = !me.deepspeed_gating();
    if (d.dropless && d.dtd_split)
      throw InputError("dropless routing runs with expert tensor parallelism and without DTD (or t = 1) yet; got " +
                       cfg.describe());
    if (d.dropless && d.sp_expert_gather)
      throw InputError("dropless routing with sequence parallelism runs without expert tensor parallelism yet "
                       "(--no-expert-tp: the gather of uneven token counts over the tensor group is not built); got " +
                       cfg.describe());
    if (!d.dropless) {  // dropless: set per micro-batch by the routing
      const int c0 = kernels::capacity(d.routed_tokens, d.experts, d.top_k, me.capacity_factor, me.min_capacity);
      d.capacity = sp ? c0 : (c0 + t - 1) / t * t;  // a multiple of t, so the DTD split is even
      d.capacity_per_rank = d.dtd_split ? d.capacity / t : d.capacity;
    }
  }
  d.data_size = data_size;
  d.replica = replica;
  d.grad_accum = cfg.grad_accum();
  d.global_micro_batches = cfg.global_batch / d.micro_batch;
  return d;
}

}  // namespace tedsim::runtime
